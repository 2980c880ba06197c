/** Choosing a physical device, a queue family and memory types: pure functions over PhysicalDeviceInfo. */
import {
  PhysicalDeviceType, VK_API_VERSION_1_2, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
  VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, VK_QUEUE_COMPUTE_BIT, VK_QUEUE_GRAPHICS_BIT,
} from "./constants.ts";
import { NoDeviceError } from "./errors.ts";
import type { PhysicalDeviceInfo, QueueFamily } from "./physical.ts";

const TYPE_RANK: Record<number, number> = {
  [PhysicalDeviceType.DISCRETE_GPU]: 4,
  [PhysicalDeviceType.INTEGRATED_GPU]: 3,
  [PhysicalDeviceType.VIRTUAL_GPU]: 2,
  [PhysicalDeviceType.CPU]: 1,
};

/** Why a device cannot run vkmoe, or undefined if it can. */
export function unusableReason(d: PhysicalDeviceInfo): string | undefined {
  if (d.apiVersion < VK_API_VERSION_1_2) return "Vulkan 1.2 or newer is required";
  if (!computeQueueFamily(d)) return "no queue family with VK_QUEUE_COMPUTE_BIT";
  if (!d.features.timelineSemaphore) return "timelineSemaphore is required";
  return undefined;
}

/** Discrete > integrated > virtual > cpu, then more device-local memory; stable by index. */
export function rankDevices(devices: readonly PhysicalDeviceInfo[]): PhysicalDeviceInfo[] {
  return [...devices].sort((a, b) =>
    (TYPE_RANK[b.type] ?? 0) - (TYPE_RANK[a.type] ?? 0) ||
    (b.deviceLocalBytes > a.deviceLocalBytes ? 1 : b.deviceLocalBytes < a.deviceLocalBytes ? -1 : 0) ||
    a.index - b.index);
}

/**
 * Picks the device: `selector` (VKMOE_DEVICE) is an index, a UUID (hex, dashes optional) or a
 * case-insensitive name substring; without one, the best-ranked usable device.
 */
export function selectDevice(devices: readonly PhysicalDeviceInfo[], selector?: string): PhysicalDeviceInfo {
  if (devices.length === 0) throw new NoDeviceError("the loader reported no physical devices");
  if (selector !== undefined && selector.trim() !== "") {
    const s = selector.trim();
    let match: PhysicalDeviceInfo | undefined;
    if (/^\d+$/.test(s)) match = devices.find((d) => d.index === Number(s));
    else {
      const hex = s.replace(/-/g, "").toLowerCase();
      match = /^[0-9a-f]{32}$/.test(hex) ? devices.find((d) => d.uuid === hex) : undefined;
      match ??= devices.find((d) => d.name.toLowerCase().includes(s.toLowerCase()));
    }
    if (!match) {
      throw new NoDeviceError(`VKMOE_DEVICE=${s} matches none of: ${devices.map((d) => `${d.index} ${d.name} (${d.uuid})`).join("; ")}`);
    }
    const why = unusableReason(match);
    if (why) throw new NoDeviceError(`${match.name}: ${why}`);
    return match;
  }
  const usable = rankDevices(devices).filter((d) => !unusableReason(d));
  if (usable.length === 0) {
    throw new NoDeviceError(devices.map((d) => `${d.name}: ${unusableReason(d)}`).join("; "));
  }
  return usable[0]!;
}

/** A family with VK_QUEUE_COMPUTE_BIT (0x2), preferring one without graphics (a dedicated compute queue). */
export function computeQueueFamily(d: PhysicalDeviceInfo): QueueFamily | undefined {
  const compute = d.queueFamilies.filter((q) => (q.flags & VK_QUEUE_COMPUTE_BIT) !== 0 && q.count > 0);
  return compute.find((q) => (q.flags & VK_QUEUE_GRAPHICS_BIT) === 0) ?? compute[0];
}

export type MemoryModel = "unified" | "rebar" | "staged";

export interface MemoryPlan {
  model: MemoryModel;
  why: string;
  /** Where weights live. */
  deviceType: number;
  /** Host-visible memory the CPU writes uploads into (the weights' own type unless staged). */
  uploadType: number;
  /** Host-visible, preferably host-cached memory the CPU reads results from. */
  readbackType: number;
}

const DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
const HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
const HC = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
const CACHED = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;

/** The first memory type allowed by `typeBits` having all of `required`, preferring those with `preferred`. */
export function findMemoryType(d: PhysicalDeviceInfo, required: number, preferred = 0, typeBits = 0xffffffff): number | undefined {
  const ok = d.types.filter((t) => (typeBits >>> t.index) & 1 && (t.flags & required) === required);
  return (ok.find((t) => (t.flags & preferred) === preferred) ?? ok[0])?.index;
}

/**
 * Unified memory (iGPU/CPU: device-local memory the host can map), ReBAR (discrete with a large
 * host-visible device-local heap, at least a quarter of VRAM) or staged (copies through a
 * host-visible staging ring). `force` ("on"/"off") comes from VKMOE_STAGED.
 */
export function planMemory(d: PhysicalDeviceInfo, force: "auto" | "on" | "off" = "auto"): MemoryPlan {
  const deviceLocal = findMemoryType(d, DL) ?? findMemoryType(d, 0)!;
  const mappableDL = findMemoryType(d, DL | HV | HC, CACHED);
  const hostVisible = findMemoryType(d, HV | HC, CACHED);
  if (hostVisible === undefined) throw new Error(`${d.name} has no host-visible coherent memory type`);
  const readbackType = findMemoryType(d, HV | HC | CACHED) ?? hostVisible;
  const unified = d.type === PhysicalDeviceType.INTEGRATED_GPU || d.type === PhysicalDeviceType.CPU || d.heaps.every((h) => h.deviceLocal);
  const largestDL = d.heaps.filter((h) => h.deviceLocal).reduce((m, h) => (h.size > m ? h.size : m), 0n);
  const mappableHeap = mappableDL === undefined ? 0n : d.heaps[d.types[mappableDL]!.heap]!.size;
  const bigMappable = mappableDL !== undefined && mappableHeap * 4n >= largestDL;

  if (force === "on") return { model: "staged", why: "VKMOE_STAGED=on", deviceType: deviceLocal, uploadType: hostVisible, readbackType };
  if (mappableDL !== undefined && (unified || bigMappable || force === "off")) {
    const model = unified ? "unified" : "rebar";
    const why = force === "off" ? "VKMOE_STAGED=off" : unified ? "device-local memory is host-visible (shared memory)" : `host-visible device-local heap of ${mappableHeap >> 20n} MiB (ReBAR)`;
    return { model, why, deviceType: mappableDL, uploadType: mappableDL, readbackType };
  }
  return {
    model: "staged",
    why: mappableDL === undefined ? "no host-visible device-local memory" : `host-visible device-local heap only ${mappableHeap >> 20n} MiB`,
    deviceType: deviceLocal,
    uploadType: hostVisible,
    readbackType,
  };
}
