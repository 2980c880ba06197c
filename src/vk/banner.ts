/** The device banner users paste into bug reports. */
import { DRIVER_ID_NAMES, formatApiVersion, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, VK_MEMORY_PROPERTY_HOST_CACHED_BIT, VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT } from "./constants.ts";
import type { VulkanContext } from "./context.ts";
import type { PhysicalDeviceInfo } from "./physical.ts";
import { unusableReason } from "./select.ts";

const mib = (b: bigint) => `${(Number(b) / 2 ** 20).toFixed(0)} MiB`;

function memoryFlags(f: number): string {
  const names: string[] = [];
  if (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) names.push("device-local");
  if (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) names.push("host-visible");
  if (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) names.push("coherent");
  if (f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) names.push("cached");
  return names.join("|") || "none";
}

/** Vendor-specific driver version formats (NVIDIA packs 10.8.8.6 bits). */
export function formatDriverVersion(d: PhysicalDeviceInfo): string {
  const v = d.driverVersion >>> 0;
  if (d.vendorId === 0x10de) return `${v >>> 22}.${(v >>> 14) & 0xff}.${(v >>> 6) & 0xff}.${v & 0x3f}`;
  return `${formatApiVersion(v)} (0x${v.toString(16)})`;
}

export function describeDevice(d: PhysicalDeviceInfo): string[] {
  const l = d.limits;
  const out = [
    `[${d.index}] ${d.name} — ${d.typeName}, ${d.vendorName} 0x${d.vendorId.toString(16)}:0x${d.deviceId.toString(16)}, uuid ${d.uuid}`,
    `    Vulkan ${formatApiVersion(d.apiVersion)}, driver ${d.driverName} (${DRIVER_ID_NAMES[d.driverId] ?? `id ${d.driverId}`}) ${d.driverInfo} version ${formatDriverVersion(d)}`,
    `    limits: maxStorageBufferRange ${l.maxStorageBufferRange} (${mib(BigInt(l.maxStorageBufferRange))}), maxMemoryAllocationSize ${mib(l.maxMemoryAllocationSize)}, maxBufferSize ${mib(l.maxBufferSize)}, push constants ${l.maxPushConstantsSize} B, shared memory ${l.maxComputeSharedMemorySize} B`,
    `    subgroup size ${d.subgroup.size} (range ${d.subgroup.minSize}-${d.subgroup.maxSize}, arithmetic ${d.subgroup.arithmetic ? "yes" : "no"}), timestamps ${l.timestampComputeAndGraphics ? `yes, ${l.timestampPeriod} ns/tick` : "no"}`,
  ];
  d.heaps.forEach((h, i) => {
    const budget = h.budget !== undefined ? `, budget ${mib(h.budget)}, used ${mib(h.usage ?? 0n)}` : "";
    out.push(`    heap ${i}: ${mib(h.size)}${h.deviceLocal ? " device-local" : ""}${budget}`);
  });
  d.types.forEach((t) => out.push(`    type ${t.index}: heap ${t.heap}, ${memoryFlags(t.flags)}`));
  const why = unusableReason(d);
  if (why) out.push(`    not usable: ${why}`);
  return out;
}

export function banner(ctx: VulkanContext): string {
  const { instance, device } = ctx;
  const lines = [
    `vkmoe — loader ${instance.loader.path} Vulkan ${formatApiVersion(instance.loader.version)}, instance API ${formatApiVersion(instance.apiVersion)}, validation ${instance.validation ? "on" : "off"}`,
    `devices:`,
    ...ctx.devices.flatMap(describeDevice),
    `chosen: [${device.info.index}] ${device.info.name}, queue family ${device.queueFamily}`,
    `memory model: ${device.memory.model} (${device.memory.why}); weights in type ${device.memory.deviceType}, uploads via type ${device.memory.uploadType}, readback from type ${device.memory.readbackType}`,
    `features:`,
    ...device.decisions.map((d) => `    ${d.on ? "on " : "off"} ${d.name}: ${d.reason}`),
  ];
  return lines.join("\n");
}
