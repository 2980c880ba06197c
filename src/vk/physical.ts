/** What a physical device is and can do, read once into plain data. */
import { NativeArena } from "../ffi/index.ts";
import {
  DEVICE_TYPE_NAMES, DRIVER_ID_NAMES, VENDOR_NAMES, VK_API_VERSION_1_3, VK_MEMORY_HEAP_DEVICE_LOCAL_BIT,
  VK_SUBGROUP_FEATURE_ARITHMETIC_BIT,
  VK_SUBGROUP_FEATURE_SHUFFLE_BIT,
} from "./constants.ts";
import { enumerate } from "./enumerate.ts";
import type { NativeFn } from "../ffi/index.ts";
import type { CoreCommands } from "./loader.ts";
import type { StructLayout, Values } from "./layout.ts";
import {
  VkCooperativeMatrixPropertiesKHR, VkCooperativeMatrixPropertiesNV, VkExtensionProperties, VkPhysicalDeviceCooperativeMatrixFeaturesKHR, VkPhysicalDeviceCooperativeMatrixFeaturesNV, VkPhysicalDeviceDriverProperties, VkPhysicalDeviceFeatures2, VkPhysicalDeviceIDProperties,
  VkPhysicalDeviceMaintenance3Properties, VkPhysicalDeviceMaintenance4Properties, VkPhysicalDeviceMemoryBudgetPropertiesEXT,
  VkPhysicalDeviceMemoryPriorityFeaturesEXT, VkPhysicalDeviceMemoryProperties2, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, VkPhysicalDeviceProperties2,
  VkPhysicalDeviceShaderIntegerDotProductFeatures, VkPhysicalDeviceShaderIntegerDotProductProperties,
  VkPhysicalDeviceSubgroupProperties, VkPhysicalDeviceSubgroupSizeControlFeatures, VkPhysicalDeviceSubgroupSizeControlProperties,
  VkPhysicalDeviceVulkan11Features, VkPhysicalDeviceVulkan12Features, VkQueueFamilyProperties,
} from "./structs.ts";

export interface MemoryHeap {
  size: bigint;
  deviceLocal: boolean;
  /** From VK_EXT_memory_budget when present. */
  budget?: bigint;
  usage?: bigint;
}
export interface MemoryType {
  index: number;
  heap: number;
  flags: number;
}
export interface QueueFamily {
  index: number;
  flags: number;
  count: number;
  timestampValidBits: number;
}

/** The instance commands that list a cooperative-matrix extension's shapes. */
export type CooperativeMatrixQuery = "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV" | "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR";

/**
 * One matrix shape VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix offers (component types:
 * VkComponentTypeKHR, which the NV enum's values equal: 0 = f16, 1 = f32; scope 3 = subgroup).
 */
export interface CooperativeMatrixShape {
  M: number;
  N: number;
  K: number;
  a: number;
  b: number;
  c: number;
  d: number;
  scope: number;
}

export interface PhysicalDeviceInfo {
  index: number;
  handle: bigint;
  name: string;
  type: number;
  typeName: string;
  vendorId: number;
  vendorName: string;
  deviceId: number;
  apiVersion: number;
  driverVersion: number;
  driverId: number;
  driverName: string;
  driverInfo: string;
  /** 32 hex digits. */
  uuid: string;
  limits: {
    maxStorageBufferRange: number;
    maxMemoryAllocationSize: bigint;
    maxBufferSize: bigint;
    maxPushConstantsSize: number;
    maxComputeWorkGroupCount: number[];
    maxComputeWorkGroupInvocations: number;
    maxComputeSharedMemorySize: number;
    minStorageBufferOffsetAlignment: bigint;
    nonCoherentAtomSize: bigint;
    maxBoundDescriptorSets: number;
    maxPerStageDescriptorStorageBuffers: number;
    timestampPeriod: number;
    timestampComputeAndGraphics: boolean;
  };
  subgroup: { size: number; arithmetic: boolean; shuffle: boolean; minSize: number; maxSize: number; sizeControl: boolean };
  heaps: MemoryHeap[];
  types: MemoryType[];
  queueFamilies: QueueFamily[];
  extensions: Set<string>;
  /** Features as the driver reports them (before negotiation). */
  features: {
    shaderInt64: boolean;
    storageBufferArrayDynamicIndexing: boolean;
    shaderInt8: boolean;
    shaderFloat16: boolean;
    storageBuffer8BitAccess: boolean;
    storageBuffer16BitAccess: boolean;
    bufferDeviceAddress: boolean;
    timelineSemaphore: boolean;
    shaderIntegerDotProduct: boolean;
    subgroupSizeControl: boolean;
    computeFullSubgroups: boolean;
    memoryPriority: boolean;
    /** VK_EXT_shader_atomic_float: atomicAdd and atomicExchange on float32 in storage buffers (the fused MoE call). */
    bufferFloat32AtomicAdd: boolean;
    /** The Vulkan memory model with device scope (the matrix-core GEMM's split ending). */
    vulkanMemoryModel: boolean;
    /** VK_NV_cooperative_matrix's cooperativeMatrix feature. */
    cooperativeMatrixNV: boolean;
    /** VK_KHR_cooperative_matrix's cooperativeMatrix feature. */
    cooperativeMatrixKHR: boolean;
  };
  /** The shapes VK_NV_cooperative_matrix offers (empty without it). */
  cooperativeMatrixShapesNV: CooperativeMatrixShape[];
  /** The shapes VK_KHR_cooperative_matrix offers (empty without it). */
  cooperativeMatrixShapesKHR: CooperativeMatrixShape[];
  integerDotProduct: { accelerated4x8Packed: boolean; accelerated4x8PackedMixed: boolean };
  deviceLocalBytes: bigint;
}

/** Builds a pNext chain from the given (layout, wanted) pairs; returns each struct's offset. */
function chain(a: NativeArena, head: StructLayout, parts: [StructLayout, boolean][]): { head: number; at: Map<StructLayout, number> } {
  const at = new Map<StructLayout, number>();
  let next = 0n;
  for (const [layout, wanted] of parts.reverse()) {
    if (!wanted) continue;
    const off = a.alloc(layout.size, layout.align);
    layout.write(a.view, off, { pNext: next });
    at.set(layout, off);
    next = a.address(off);
  }
  const h = a.alloc(head.size, head.align);
  head.write(a.view, h, { pNext: next });
  return { head: h, at };
}

const bool = (v: unknown) => v === 1;

/** `instanceProc`: an instance-level extension command by name (undefined where the loader has none). */
export function queryPhysicalDevice(vk: CoreCommands, handle: bigint, index: number, instanceProc?: (name: CooperativeMatrixQuery) => NativeFn | undefined): PhysicalDeviceInfo {
  using a = new NativeArena(64 << 10);
  const extensions = new Set(
    enumerate(a, VkExtensionProperties, (n, p) => vk.vkEnumerateDeviceExtensionProperties(handle, 0n, n, p), "vkEnumerateDeviceExtensionProperties")
      .map((e) => e.extensionName as string),
  );

  // A struct may be chained only if the device's version or an extension defines it.
  const probe = chain(a, VkPhysicalDeviceProperties2, []);
  vk.vkGetPhysicalDeviceProperties2(handle, a.address(probe.head));
  const api = (VkPhysicalDeviceProperties2.read(a.view, probe.head).properties as Values).apiVersion as number;
  const is13 = api >= VK_API_VERSION_1_3;
  const has = (ext: string) => is13 || extensions.has(ext);

  const props = chain(a, VkPhysicalDeviceProperties2, [
    [VkPhysicalDeviceDriverProperties, true],
    [VkPhysicalDeviceIDProperties, true],
    [VkPhysicalDeviceSubgroupProperties, true],
    [VkPhysicalDeviceMaintenance3Properties, true],
    [VkPhysicalDeviceMaintenance4Properties, has("VK_KHR_maintenance4")],
    [VkPhysicalDeviceSubgroupSizeControlProperties, has("VK_EXT_subgroup_size_control")],
    [VkPhysicalDeviceShaderIntegerDotProductProperties, has("VK_KHR_shader_integer_dot_product")],
  ]);
  vk.vkGetPhysicalDeviceProperties2(handle, a.address(props.head));
  const read = (layout: StructLayout, map = props.at) => {
    const off = map.get(layout);
    return off === undefined ? undefined : layout.read(a.view, off);
  };
  const p = VkPhysicalDeviceProperties2.read(a.view, props.head).properties as Values;
  const limits = p.limits as Values;
  const driver = read(VkPhysicalDeviceDriverProperties)!;
  const id = read(VkPhysicalDeviceIDProperties)!;
  const subgroup = read(VkPhysicalDeviceSubgroupProperties)!;
  const m3 = read(VkPhysicalDeviceMaintenance3Properties)!;
  const m4 = read(VkPhysicalDeviceMaintenance4Properties);
  const sizeControl = read(VkPhysicalDeviceSubgroupSizeControlProperties);
  const idp = read(VkPhysicalDeviceShaderIntegerDotProductProperties);

  const feats = chain(a, VkPhysicalDeviceFeatures2, [
    [VkPhysicalDeviceVulkan11Features, true],
    [VkPhysicalDeviceVulkan12Features, true],
    [VkPhysicalDeviceShaderIntegerDotProductFeatures, has("VK_KHR_shader_integer_dot_product")],
    [VkPhysicalDeviceSubgroupSizeControlFeatures, has("VK_EXT_subgroup_size_control")],
    [VkPhysicalDeviceMemoryPriorityFeaturesEXT, extensions.has("VK_EXT_memory_priority")],
    [VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, extensions.has("VK_EXT_shader_atomic_float")],
    [VkPhysicalDeviceCooperativeMatrixFeaturesNV, extensions.has("VK_NV_cooperative_matrix")],
    [VkPhysicalDeviceCooperativeMatrixFeaturesKHR, extensions.has("VK_KHR_cooperative_matrix")],
  ]);
  vk.vkGetPhysicalDeviceFeatures2(handle, a.address(feats.head));
  const f10 = VkPhysicalDeviceFeatures2.read(a.view, feats.head).features as Values;
  const f11 = read(VkPhysicalDeviceVulkan11Features, feats.at)!;
  const f12 = read(VkPhysicalDeviceVulkan12Features, feats.at)!;
  const fIdp = read(VkPhysicalDeviceShaderIntegerDotProductFeatures, feats.at);
  const fSsc = read(VkPhysicalDeviceSubgroupSizeControlFeatures, feats.at);
  const fPrio = read(VkPhysicalDeviceMemoryPriorityFeaturesEXT, feats.at);
  const fAtomicFloat = read(VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, feats.at);
  const fCoopmat = read(VkPhysicalDeviceCooperativeMatrixFeaturesNV, feats.at);
  const cooperativeMatrixShapesNV = bool(fCoopmat?.cooperativeMatrix) ? queryCooperativeMatrixShapes(a, handle, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV", instanceProc) : [];
  const fCoopmatKhr = read(VkPhysicalDeviceCooperativeMatrixFeaturesKHR, feats.at);
  const cooperativeMatrixShapesKHR = bool(fCoopmatKhr?.cooperativeMatrix) ? queryCooperativeMatrixShapes(a, handle, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", instanceProc) : [];

  const mem = chain(a, VkPhysicalDeviceMemoryProperties2, [[VkPhysicalDeviceMemoryBudgetPropertiesEXT, extensions.has("VK_EXT_memory_budget")]]);
  vk.vkGetPhysicalDeviceMemoryProperties2(handle, a.address(mem.head));
  const mp = VkPhysicalDeviceMemoryProperties2.read(a.view, mem.head).memoryProperties as Values;
  const budget = read(VkPhysicalDeviceMemoryBudgetPropertiesEXT, mem.at);
  const heaps: MemoryHeap[] = (mp.memoryHeaps as Values[]).slice(0, mp.memoryHeapCount as number).map((h, i) => ({
    size: h.size as bigint,
    deviceLocal: ((h.flags as number) & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) !== 0,
    ...(budget ? { budget: (budget.heapBudget as bigint[])[i], usage: (budget.heapUsage as bigint[])[i] } : {}),
  }));
  const types: MemoryType[] = (mp.memoryTypes as Values[]).slice(0, mp.memoryTypeCount as number).map((t, i) => ({
    index: i,
    heap: t.heapIndex as number,
    flags: t.propertyFlags as number,
  }));

  const queueFamilies = enumerate(a, VkQueueFamilyProperties, (n, q) => (vk.vkGetPhysicalDeviceQueueFamilyProperties(handle, n, q), 0), "vkGetPhysicalDeviceQueueFamilyProperties")
    .map((q, i) => ({ index: i, flags: q.queueFlags as number, count: q.queueCount as number, timestampValidBits: q.timestampValidBits as number }));

  const hex = (bytes: number[]) => bytes.map((b) => b.toString(16).padStart(2, "0")).join("");
  const type = p.deviceType as number;
  const vendorId = p.vendorID as number;
  return {
    index,
    handle,
    name: p.deviceName as string,
    type,
    typeName: DEVICE_TYPE_NAMES[type] ?? `type ${type}`,
    vendorId,
    vendorName: VENDOR_NAMES[vendorId] ?? `0x${vendorId.toString(16)}`,
    deviceId: p.deviceID as number,
    apiVersion: api,
    driverVersion: p.driverVersion as number,
    driverId: driver.driverID as number,
    driverName: (driver.driverName as string) || DRIVER_ID_NAMES[driver.driverID as number] || "unknown",
    driverInfo: driver.driverInfo as string,
    uuid: hex(id.deviceUUID as number[]),
    limits: {
      maxStorageBufferRange: limits.maxStorageBufferRange as number,
      maxMemoryAllocationSize: m3.maxMemoryAllocationSize as bigint,
      maxBufferSize: (m4?.maxBufferSize as bigint | undefined) ?? (m3.maxMemoryAllocationSize as bigint),
      maxPushConstantsSize: limits.maxPushConstantsSize as number,
      maxComputeWorkGroupCount: limits.maxComputeWorkGroupCount as number[],
      maxComputeWorkGroupInvocations: limits.maxComputeWorkGroupInvocations as number,
      maxComputeSharedMemorySize: limits.maxComputeSharedMemorySize as number,
      minStorageBufferOffsetAlignment: limits.minStorageBufferOffsetAlignment as bigint,
      nonCoherentAtomSize: limits.nonCoherentAtomSize as bigint,
      maxBoundDescriptorSets: limits.maxBoundDescriptorSets as number,
      maxPerStageDescriptorStorageBuffers: limits.maxPerStageDescriptorStorageBuffers as number,
      timestampPeriod: limits.timestampPeriod as number,
      timestampComputeAndGraphics: bool(limits.timestampComputeAndGraphics),
    },
    subgroup: {
      size: subgroup.subgroupSize as number,
      arithmetic: ((subgroup.supportedOperations as number) & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) !== 0 && ((subgroup.supportedStages as number) & 0x20) !== 0,
      shuffle: ((subgroup.supportedOperations as number) & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) !== 0 && ((subgroup.supportedStages as number) & 0x20) !== 0,
      minSize: (sizeControl?.minSubgroupSize as number | undefined) ?? (subgroup.subgroupSize as number),
      maxSize: (sizeControl?.maxSubgroupSize as number | undefined) ?? (subgroup.subgroupSize as number),
      sizeControl: bool(fSsc?.subgroupSizeControl),
    },
    heaps,
    types,
    queueFamilies,
    extensions,
    features: {
      shaderInt64: bool(f10.shaderInt64),
      storageBufferArrayDynamicIndexing: bool(f10.shaderStorageBufferArrayDynamicIndexing),
      shaderInt8: bool(f12.shaderInt8),
      shaderFloat16: bool(f12.shaderFloat16),
      storageBuffer8BitAccess: bool(f12.storageBuffer8BitAccess),
      storageBuffer16BitAccess: bool(f11.storageBuffer16BitAccess),
      bufferDeviceAddress: bool(f12.bufferDeviceAddress),
      timelineSemaphore: bool(f12.timelineSemaphore),
      shaderIntegerDotProduct: bool(fIdp?.shaderIntegerDotProduct),
      subgroupSizeControl: bool(fSsc?.subgroupSizeControl),
      computeFullSubgroups: bool(fSsc?.computeFullSubgroups),
      memoryPriority: bool(fPrio?.memoryPriority),
      bufferFloat32AtomicAdd: bool(fAtomicFloat?.shaderBufferFloat32AtomicAdd) && bool(fAtomicFloat?.shaderBufferFloat32Atomics),
      vulkanMemoryModel: bool(f12.vulkanMemoryModel) && bool(f12.vulkanMemoryModelDeviceScope),
      cooperativeMatrixNV: bool(fCoopmat?.cooperativeMatrix),
      cooperativeMatrixKHR: bool(fCoopmatKhr?.cooperativeMatrix),
    },
    cooperativeMatrixShapesNV,
    cooperativeMatrixShapesKHR,
    integerDotProduct: {
      accelerated4x8Packed: bool(idp?.integerDotProduct4x8BitPackedSignedAccelerated),
      accelerated4x8PackedMixed: bool(idp?.integerDotProduct4x8BitPackedMixedSignednessAccelerated),
    },
    deviceLocalBytes: heaps.filter((h) => h.deviceLocal).reduce((s, h) => s + h.size, 0n),
  };
}

/** The extension's list of shapes; empty where the loader lacks the command or the call fails. */
function queryCooperativeMatrixShapes(a: NativeArena, handle: bigint, name: CooperativeMatrixQuery, instanceProc: ((name: CooperativeMatrixQuery) => NativeFn | undefined) | undefined): CooperativeMatrixShape[] {
  const query = instanceProc?.(name);
  if (!query) return [];
  const khr = name === "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR";
  try {
    return enumerate(a, khr ? VkCooperativeMatrixPropertiesKHR : VkCooperativeMatrixPropertiesNV, (n, p) => query(handle, n, p) as number, name).map((v) => (
      { M: v.MSize, N: v.NSize, K: v.KSize, a: v.AType, b: v.BType, c: v.CType, d: khr ? v.ResultType : v.DType, scope: v.scope } as CooperativeMatrixShape
    ));
  } catch {
    return [];  // the device is taken without the matrix-core GEMM
  }
}
