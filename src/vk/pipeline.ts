/** Compute pipelines: a set layout of N storage buffers, push constants, specialization constants. */
import { InvalidArgumentError } from "../errors.ts";
import { VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, VK_SHADER_STAGE_COMPUTE_BIT } from "./constants.ts";
import type { Device } from "./device.ts";
import { check } from "./errors.ts";
import { loadSpirv } from "./shader.ts";
import {
  VkComputePipelineCreateInfo, VkDescriptorSetLayoutBinding, VkDescriptorSetLayoutCreateInfo, VkPipelineLayoutCreateInfo,
  VkPipelineShaderStageCreateInfo, VkPipelineShaderStageRequiredSubgroupSizeCreateInfo, VkPushConstantRange,
  VkShaderModuleCreateInfo, VkSpecializationInfo, VkSpecializationMapEntry,
} from "./structs.ts";

export interface PipelineSpec {
  /** Path of the .spv file. */
  spirv: string;
  /** Number of storage-buffer bindings in set 0 (bindings 0..n-1). */
  storageBuffers: number;
  /** Descriptor count of each binding (arrays of storage buffers); default 1 each. */
  descriptorCounts?: number[];
  /** Bytes of push constants (a multiple of 4). */
  pushConstantBytes: number;
  /** constant_id -> 32-bit value (booleans as 0/1). */
  specialization?: Record<number, number>;
  /** Pins the subgroup size (needs subgroupSizeControl). */
  requiredSubgroupSize?: number;
}

export class ComputePipeline implements Disposable {
  readonly device: Device;
  readonly setLayout: bigint;
  readonly layout: bigint;
  readonly pipeline: bigint;
  readonly storageBuffers: number;
  readonly descriptorCounts: number[];
  readonly pushConstantBytes: number;
  private disposed = false;

  constructor(device: Device, spec: PipelineSpec) {
    if (spec.pushConstantBytes % 4 !== 0 || spec.pushConstantBytes > device.info.limits.maxPushConstantsSize) {
      throw new InvalidArgumentError(`push constants of ${spec.pushConstantBytes} bytes (must be a multiple of 4, at most ${device.info.limits.maxPushConstantsSize})`);
    }
    const code = loadSpirv(spec.spirv); // before any Vulkan object exists: a bad file creates nothing
    this.device = device;
    this.storageBuffers = spec.storageBuffers;
    this.descriptorCounts = spec.descriptorCounts ?? Array.from({ length: spec.storageBuffers }, () => 1);
    if (this.descriptorCounts.length !== spec.storageBuffers || this.descriptorCounts.some((c) => !Number.isInteger(c) || c < 1)) {
      throw new InvalidArgumentError(`descriptorCounts must give a positive count for each of the ${spec.storageBuffers} bindings`);
    }
    this.pushConstantBytes = spec.pushConstantBytes;
    const { vk, handle } = device;
    const a = device.arena;
    using _ = a.scope();
    const out = a.alloc(8);

    const bindings = a.alloc(VkDescriptorSetLayoutBinding.size * Math.max(1, spec.storageBuffers));
    for (let i = 0; i < spec.storageBuffers; i++) {
      VkDescriptorSetLayoutBinding.write(a.view, bindings + i * VkDescriptorSetLayoutBinding.size, {
        binding: i, descriptorType: VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount: this.descriptorCounts[i]!, stageFlags: VK_SHADER_STAGE_COMPUTE_BIT,
      });
    }
    const dsl = a.alloc(VkDescriptorSetLayoutCreateInfo.size);
    VkDescriptorSetLayoutCreateInfo.write(a.view, dsl, { bindingCount: spec.storageBuffers, pBindings: spec.storageBuffers ? a.address(bindings) : 0n });
    check("vkCreateDescriptorSetLayout", vk.vkCreateDescriptorSetLayout(handle, a.address(dsl), 0n, a.address(out)));
    this.setLayout = a.view.getBigUint64(out, true);

    const range = a.alloc(VkPushConstantRange.size);
    VkPushConstantRange.write(a.view, range, { stageFlags: VK_SHADER_STAGE_COMPUTE_BIT, offset: 0, size: spec.pushConstantBytes });
    const setLayouts = a.alloc(8);
    a.view.setBigUint64(setLayouts, this.setLayout, true);
    const pl = a.alloc(VkPipelineLayoutCreateInfo.size);
    VkPipelineLayoutCreateInfo.write(a.view, pl, {
      setLayoutCount: 1, pSetLayouts: a.address(setLayouts),
      pushConstantRangeCount: spec.pushConstantBytes ? 1 : 0, pPushConstantRanges: spec.pushConstantBytes ? a.address(range) : 0n,
    });
    try {
      check("vkCreatePipelineLayout", vk.vkCreatePipelineLayout(handle, a.address(pl), 0n, a.address(out)));
    } catch (e) {
      vk.vkDestroyDescriptorSetLayout(handle, this.setLayout, 0n);
      throw e;
    }
    this.layout = a.view.getBigUint64(out, true);

    try {
      const codeAt = a.alloc(code.byteLength, 4);
      a.bytes.set(new Uint8Array(code.buffer, code.byteOffset, code.byteLength), codeAt);
      const sm = a.alloc(VkShaderModuleCreateInfo.size);
      VkShaderModuleCreateInfo.write(a.view, sm, { codeSize: BigInt(code.byteLength), pCode: a.address(codeAt) });
      check("vkCreateShaderModule", vk.vkCreateShaderModule(handle, a.address(sm), 0n, a.address(out)));
      const module = a.view.getBigUint64(out, true);

      const entries = Object.entries(spec.specialization ?? {});
      let specInfo = 0n;
      if (entries.length) {
        const map = a.alloc(VkSpecializationMapEntry.size * entries.length);
        const data = a.alloc(4 * entries.length, 4);
        entries.forEach(([id, value], i) => {
          if (!Number.isInteger(value)) throw new InvalidArgumentError(`specialization constant ${id} = ${value} is not an integer`);
          VkSpecializationMapEntry.write(a.view, map + i * VkSpecializationMapEntry.size, { constantID: Number(id), offset: 4 * i, size: 4n });
          a.view.setUint32(data + 4 * i, value >>> 0, true);
        });
        const si = a.alloc(VkSpecializationInfo.size);
        VkSpecializationInfo.write(a.view, si, { mapEntryCount: entries.length, pMapEntries: a.address(map), dataSize: BigInt(4 * entries.length), pData: a.address(data) });
        specInfo = a.address(si);
      }
      let stageNext = 0n;
      if (spec.requiredSubgroupSize) {
        const rs = a.alloc(VkPipelineShaderStageRequiredSubgroupSizeCreateInfo.size);
        VkPipelineShaderStageRequiredSubgroupSizeCreateInfo.write(a.view, rs, { requiredSubgroupSize: spec.requiredSubgroupSize });
        stageNext = a.address(rs);
      }
      const cp = a.alloc(VkComputePipelineCreateInfo.size);
      VkComputePipelineCreateInfo.write(a.view, cp, {
        stage: {
          sType: VkPipelineShaderStageCreateInfo.defaults.sType, pNext: stageNext,
          stage: VK_SHADER_STAGE_COMPUTE_BIT, module, pName: a.cString("main"), pSpecializationInfo: specInfo,
        },
        layout: this.layout,
      });
      const result = vk.vkCreateComputePipelines(handle, 0n, 1, a.address(cp), 0n, a.address(out));
      vk.vkDestroyShaderModule(handle, module, 0n);
      check("vkCreateComputePipelines", result);
      this.pipeline = a.view.getBigUint64(out, true);
    } catch (e) {
      vk.vkDestroyPipelineLayout(handle, this.layout, 0n);
      vk.vkDestroyDescriptorSetLayout(handle, this.setLayout, 0n);
      throw e;
    }
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    const { vk, handle } = this.device;
    vk.vkDestroyPipeline(handle, this.pipeline, 0n);
    vk.vkDestroyPipelineLayout(handle, this.layout, 0n);
    vk.vkDestroyDescriptorSetLayout(handle, this.setLayout, 0n);
  }
}
