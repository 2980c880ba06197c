/** A logical device: feature negotiation (each feature on/off with a reason), one compute queue, the memory plan. */
import { NativeArena } from "../ffi/index.ts";
import { VK_API_VERSION_1_3 } from "./constants.ts";
import { check, NoDeviceError } from "./errors.ts";
import type { Instance } from "./instance.ts";
import { stringArray } from "./instance.ts";
import type { CoreCommands } from "./loader.ts";
import type { StructLayout, Values } from "./layout.ts";
import type { PhysicalDeviceInfo } from "./physical.ts";
import { computeQueueFamily, planMemory, type MemoryPlan } from "./select.ts";
import {
  VkDeviceCreateInfo, VkDeviceQueueCreateInfo, VkPhysicalDeviceCooperativeMatrixFeaturesKHR, VkPhysicalDeviceCooperativeMatrixFeaturesNV, VkPhysicalDeviceFeatures2, VkPhysicalDeviceMemoryPriorityFeaturesEXT,
  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, VkPhysicalDeviceShaderIntegerDotProductFeatures, VkPhysicalDeviceSubgroupSizeControlFeatures,
  VkPhysicalDeviceVulkan11Features, VkPhysicalDeviceVulkan12Features,
} from "./structs.ts";

export interface DeviceOptions {
  /** "off" forces the descriptor path even where buffer device address exists (VKMOE_BDA). */
  bufferDeviceAddress?: "auto" | "off";
  /** "off" never enables integer dot product (VKMOE_IDP). */
  integerDotProduct?: "auto" | "on" | "off";
  /** "off" never enables VK_EXT_shader_atomic_float (VKMOE_FLOAT_ATOMICS): MoE calls of few tokens then run grouped. */
  floatAtomics?: "auto" | "off";
  /**
   * Prompt chunks' GEMMs on the matrix cores (VKMOE_COOPMAT): "auto" (the default; "on" is the same)
   * enables VK_NV_cooperative_matrix where it offers the kernel's shape, else VK_KHR_cooperative_matrix;
   * "khr" / "nv" only that extension; "off" never (the f32 / integer-dot GEMMs).
   */
  cooperativeMatrix?: "auto" | "on" | "off" | "khr" | "nv";
  /** Memory model override (VKMOE_STAGED). */
  staged?: "auto" | "on" | "off";
}

export interface FeatureDecision {
  name: string;
  on: boolean;
  reason: string;
}

export interface EnabledFeatures {
  bufferDeviceAddress: boolean;
  shaderInt64: boolean;
  shaderInt8: boolean;
  storageBuffer8BitAccess: boolean;
  storageBuffer16BitAccess: boolean;
  integerDotProduct: boolean;
  subgroupSizeControl: boolean;
  memoryPriority: boolean;
  memoryBudget: boolean;
  storageBufferArrayDynamicIndexing: boolean;
  /** atomicAdd on float32 in storage buffers (VK_EXT_shader_atomic_float): the one-dispatch MoE call. */
  bufferFloat32AtomicAdd: boolean;
  /**
   * VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix with the 16 x 8 x 16 f16 x f16 -> f32 subgroup
   * shape, shaderFloat16 and the Vulkan memory model: the prompt chunks' matrix-core GEMMs
   * (src/kernels/decoder/quant-gemm.ts, ggml-gemm.ts).
   */
  cooperativeMatrix: boolean;
  /** Which extension the matrix-core GEMM runs on, where cooperativeMatrix is on (its SPIR-V differs). */
  cooperativeMatrixExtension?: "khr" | "nv";
  /** Enabled wherever supported: the matrix-core GEMM's f16 tiles (and their test variant on any device). */
  shaderFloat16: boolean;
  vulkanMemoryModel: boolean;
}

/** The one cooperative-matrix shape the matrix-core GEMM is written for: M 16 x N 8 x K 16, f16 A and B (0), f32 C and D (1), subgroup scope (3). */
export function offersCoopmatShape(info: PhysicalDeviceInfo, extension: "khr" | "nv" = "nv"): boolean {
  return (extension === "khr" ? info.cooperativeMatrixShapesKHR : info.cooperativeMatrixShapesNV)
    .some((s) => s.M === 16 && s.N === 8 && s.K === 16 && s.a === 0 && s.b === 0 && s.c === 1 && s.d === 1 && s.scope === 3);
}

export class Device implements Disposable {
  readonly instance: Instance;
  readonly info: PhysicalDeviceInfo;
  readonly vk: CoreCommands;
  readonly handle: bigint;
  readonly queue: bigint;
  readonly queueFamily: number;
  readonly memory: MemoryPlan;
  readonly decisions: FeatureDecision[];
  readonly enabled: EnabledFeatures;
  /** Scratch native memory for setup calls; hot paths keep their own. */
  readonly arena = new NativeArena(1 << 20);
  private disposed = false;

  constructor(instance: Instance, info: PhysicalDeviceInfo, options: DeviceOptions = {}) {
    this.instance = instance;
    this.info = info;
    this.vk = instance.vk;
    const family = computeQueueFamily(info);
    if (!family) throw new NoDeviceError(`${info.name} has no compute queue`);
    this.queueFamily = family.index;
    this.memory = planMemory(info, options.staged ?? "auto");

    const f = info.features;
    const is13 = info.apiVersion >= VK_API_VERSION_1_3;
    const has = (ext: string) => info.extensions.has(ext);
    const decisions: FeatureDecision[] = [];
    const extensions: string[] = [];
    const decide = (name: string, supported: boolean, notSupportedWhy: string, vetoWhy?: string, onWhy = "supported"): boolean => {
      const on = supported && !vetoWhy;
      decisions.push({ name, on, reason: on ? onWhy : !supported ? notSupportedWhy : vetoWhy! });
      return on;
    };

    const bda = decide("bufferDeviceAddress", f.bufferDeviceAddress, "not supported by the driver",
      options.bufferDeviceAddress === "off" ? "VKMOE_BDA=off" : undefined);
    const int64 = decide("shaderInt64", f.shaderInt64, "not supported by the driver");
    const int8 = decide("shaderInt8", f.shaderInt8, "not supported by the driver");
    const s8 = decide("storageBuffer8BitAccess", f.storageBuffer8BitAccess, "not supported by the driver");
    const s16 = decide("storageBuffer16BitAccess", f.storageBuffer16BitAccess, "not supported by the driver");
    const idpExt = !is13 && has("VK_KHR_shader_integer_dot_product");
    const idp = decide("shaderIntegerDotProduct", f.shaderIntegerDotProduct, "not reported by the driver",
      options.integerDotProduct === "off" ? "VKMOE_IDP=off" : undefined,
      info.integerDotProduct.accelerated4x8Packed ? "supported (4x8 packed accelerated)" : "supported (not accelerated)");
    if (idp && idpExt) extensions.push("VK_KHR_shader_integer_dot_product");
    const sscExt = !is13 && has("VK_EXT_subgroup_size_control");
    const ssc = decide("subgroupSizeControl", f.subgroupSizeControl, "not supported by the driver");
    if (ssc && sscExt) extensions.push("VK_EXT_subgroup_size_control");
    const dyn = decide("shaderStorageBufferArrayDynamicIndexing", f.storageBufferArrayDynamicIndexing, "not supported by the driver (descriptor addressing path unavailable)");
    const prio = decide("VK_EXT_memory_priority", has("VK_EXT_memory_priority") && f.memoryPriority, "extension not offered");
    if (prio) extensions.push("VK_EXT_memory_priority");
    const budget = decide("VK_EXT_memory_budget", has("VK_EXT_memory_budget"), "extension not offered");
    if (budget) extensions.push("VK_EXT_memory_budget");
    const atomicFloat = decide("shaderBufferFloat32AtomicAdd", has("VK_EXT_shader_atomic_float") && f.bufferFloat32AtomicAdd, "not supported by the driver (MoE calls of few tokens run grouped)",
      options.floatAtomics === "off" ? "VKMOE_FLOAT_ATOMICS=off" : undefined);
    if (atomicFloat) extensions.push("VK_EXT_shader_atomic_float");
    // NV first where both are offered (NVIDIA's drivers; Debian 12's validation layer predates KHR),
    // KHR elsewhere (AMD's drivers offer only it), unless VKMOE_COOPMAT names one
    const extName = (ext: "khr" | "nv") => `VK_${ext.toUpperCase()}_cooperative_matrix`;
    const usable = (ext: "khr" | "nv") => has(extName(ext)) && (ext === "khr" ? f.cooperativeMatrixKHR : f.cooperativeMatrixNV) && offersCoopmatShape(info, ext);
    const wanted: ("khr" | "nv")[] = options.cooperativeMatrix === "khr" ? ["khr"] : options.cooperativeMatrix === "nv" ? ["nv"] : ["nv", "khr"];
    const coopmatExt = wanted.find(usable);
    const named = wanted.map(extName).join(" or ");
    const coopmatWhy = !wanted.some((e) => has(extName(e))) ? `${named} not offered (prompt chunks keep the f32 / integer-dot GEMMs)`
      : !coopmatExt ? `${named} offered without its cooperativeMatrix feature or a 16 x 8 x 16 f16 -> f32 subgroup shape`
      : !f.shaderFloat16 || !f.vulkanMemoryModel ? "needs shaderFloat16 and vulkanMemoryModel"
      : `the matrix-core GEMM is written for subgroups of 32, not ${info.subgroup.size}`;
    const coopmat = decide("cooperativeMatrix", coopmatExt !== undefined && f.shaderFloat16 && f.vulkanMemoryModel && info.subgroup.size === 32,
      coopmatWhy, options.cooperativeMatrix === "off" ? "VKMOE_COOPMAT=off" : undefined,
      `supported (${coopmatExt && extName(coopmatExt)}, 16 x 8 x 16 f16 -> f32)`);
    if (coopmat) extensions.push(extName(coopmatExt!));
    const f16 = f.shaderFloat16, vmm = f.vulkanMemoryModel;
    this.decisions = decisions;
    this.enabled = {
      bufferDeviceAddress: bda, shaderInt64: int64, shaderInt8: int8, storageBuffer8BitAccess: s8,
      storageBuffer16BitAccess: s16, integerDotProduct: idp, subgroupSizeControl: ssc, memoryPriority: prio, memoryBudget: budget,
      storageBufferArrayDynamicIndexing: dyn, bufferFloat32AtomicAdd: atomicFloat, cooperativeMatrix: coopmat,
      ...(coopmat ? { cooperativeMatrixExtension: coopmatExt } : {}), shaderFloat16: f16, vulkanMemoryModel: vmm,
    };

    const a = this.arena;
    using _ = a.scope();
    const link = (layout: StructLayout, values: Values, next: bigint) => {
      const off = a.alloc(layout.size, layout.align);
      layout.write(a.view, off, { ...values, pNext: next });
      return a.address(off);
    };
    let next = 0n;
    if (prio) next = link(VkPhysicalDeviceMemoryPriorityFeaturesEXT, { memoryPriority: 1 }, next);
    if (ssc) next = link(VkPhysicalDeviceSubgroupSizeControlFeatures, { subgroupSizeControl: 1, computeFullSubgroups: f.computeFullSubgroups ? 1 : 0 }, next);
    if (atomicFloat) next = link(VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, { shaderBufferFloat32Atomics: 1, shaderBufferFloat32AtomicAdd: 1 }, next);
    if (idp) next = link(VkPhysicalDeviceShaderIntegerDotProductFeatures, { shaderIntegerDotProduct: 1 }, next);
    if (coopmat) next = link(coopmatExt === "khr" ? VkPhysicalDeviceCooperativeMatrixFeaturesKHR : VkPhysicalDeviceCooperativeMatrixFeaturesNV, { cooperativeMatrix: 1 }, next);
    next = link(VkPhysicalDeviceVulkan12Features, {
      bufferDeviceAddress: bda ? 1 : 0, shaderInt8: int8 ? 1 : 0, storageBuffer8BitAccess: s8 ? 1 : 0, timelineSemaphore: 1,
      shaderFloat16: f16 ? 1 : 0, vulkanMemoryModel: vmm ? 1 : 0, vulkanMemoryModelDeviceScope: vmm ? 1 : 0,
    }, next);
    next = link(VkPhysicalDeviceVulkan11Features, { storageBuffer16BitAccess: s16 ? 1 : 0 }, next);
    // Dynamic (workgroup-uniform) indexing of storage-buffer arrays: the descriptor addressing path.
    const features2 = link(VkPhysicalDeviceFeatures2, { features: { shaderInt64: int64 ? 1 : 0, shaderStorageBufferArrayDynamicIndexing: dyn ? 1 : 0 } }, next);

    const priority = a.alloc(4, 4);
    a.view.setFloat32(priority, 1, true);
    const queueInfo = a.alloc(VkDeviceQueueCreateInfo.size);
    VkDeviceQueueCreateInfo.write(a.view, queueInfo, { queueFamilyIndex: family.index, queueCount: 1, pQueuePriorities: a.address(priority) });
    const info2 = a.alloc(VkDeviceCreateInfo.size);
    VkDeviceCreateInfo.write(a.view, info2, {
      pNext: features2,
      queueCreateInfoCount: 1,
      pQueueCreateInfos: a.address(queueInfo),
      enabledExtensionCount: extensions.length,
      ppEnabledExtensionNames: stringArray(a, extensions),
    });
    const out = a.alloc(8);
    try {
      check("vkCreateDevice", this.vk.vkCreateDevice(info.handle, a.address(info2), 0n, a.address(out)));
    } catch (e) {
      this.arena[Symbol.dispose]();
      throw e;
    }
    this.handle = a.view.getBigUint64(out, true);
    const q = a.alloc(8);
    this.vk.vkGetDeviceQueue(this.handle, family.index, 0, a.address(q));
    this.queue = a.view.getBigUint64(q, true);
  }

  waitIdle(): void {
    check("vkDeviceWaitIdle", this.vk.vkDeviceWaitIdle(this.handle));
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.vk.vkDestroyDevice(this.handle, 0n);
    this.arena[Symbol.dispose]();
  }
}
