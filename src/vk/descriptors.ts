/** Descriptor pools and sets of storage buffers. Sets are written once at setup, never per call. */
import { InvalidArgumentError } from "../errors.ts";
import { VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, VK_WHOLE_SIZE } from "./constants.ts";
import type { Device } from "./device.ts";
import { check } from "./errors.ts";
import type { Buffer } from "./memory.ts";
import type { ComputePipeline } from "./pipeline.ts";
import { VkDescriptorBufferInfo, VkDescriptorPoolCreateInfo, VkDescriptorPoolSize, VkDescriptorSetAllocateInfo, VkWriteDescriptorSet } from "./structs.ts";

export interface BufferBinding {
  buffer: Buffer;
  offset?: bigint;
  range?: bigint;
}

export class DescriptorPool implements Disposable {
  readonly device: Device;
  readonly handle: bigint;
  private disposed = false;

  constructor(device: Device, maxSets: number, maxStorageBuffers: number) {
    this.device = device;
    const a = device.arena;
    using _ = a.scope();
    const size = a.alloc(VkDescriptorPoolSize.size);
    VkDescriptorPoolSize.write(a.view, size, { type: VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount: maxStorageBuffers });
    const info = a.alloc(VkDescriptorPoolCreateInfo.size);
    VkDescriptorPoolCreateInfo.write(a.view, info, { maxSets, poolSizeCount: 1, pPoolSizes: a.address(size) });
    const out = a.alloc(8);
    check("vkCreateDescriptorPool", device.vk.vkCreateDescriptorPool(device.handle, a.address(info), 0n, a.address(out)));
    this.handle = a.view.getBigUint64(out, true);
  }

  /** A set for `pipeline`'s layout with every binding written (an array binding takes an array). */
  allocate(pipeline: ComputePipeline, bindings: readonly (BufferBinding | readonly BufferBinding[])[]): bigint {
    if (bindings.length !== pipeline.storageBuffers) {
      throw new InvalidArgumentError(`pipeline has ${pipeline.storageBuffers} storage-buffer bindings, got ${bindings.length}`);
    }
    bindings.forEach((b, i) => {
      const n = Array.isArray(b) ? b.length : 1;
      if (n !== pipeline.descriptorCounts[i]) throw new InvalidArgumentError(`binding ${i} takes ${pipeline.descriptorCounts[i]} buffer(s), got ${n}`);
    });
    const { vk, handle } = this.device;
    const a = this.device.arena;
    using _ = a.scope();
    const layouts = a.alloc(8);
    a.view.setBigUint64(layouts, pipeline.setLayout, true);
    const info = a.alloc(VkDescriptorSetAllocateInfo.size);
    VkDescriptorSetAllocateInfo.write(a.view, info, { descriptorPool: this.handle, descriptorSetCount: 1, pSetLayouts: a.address(layouts) });
    const out = a.alloc(8);
    check("vkAllocateDescriptorSets", vk.vkAllocateDescriptorSets(handle, a.address(info), a.address(out)));
    const set = a.view.getBigUint64(out, true);
    writeStorageBuffers(this.device, set, bindings);
    return set;
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.device.vk.vkDestroyDescriptorPool(this.device.handle, this.handle, 0n);
  }
}

/** Writes bindings (an array binding: consecutive elements from 0) of `set`. */
export function writeStorageBuffers(device: Device, set: bigint, bindings: readonly (BufferBinding | readonly BufferBinding[])[]): void {
  const a = device.arena;
  using _ = a.scope();
  const flat: { binding: number; element: number; b: BufferBinding }[] = [];
  bindings.forEach((b, binding) => {
    if (Array.isArray(b)) b.forEach((e, element) => flat.push({ binding, element, b: e }));
    else flat.push({ binding, element: 0, b: b as BufferBinding });
  });
  const infos = a.alloc(VkDescriptorBufferInfo.size * flat.length);
  const writes = a.alloc(VkWriteDescriptorSet.size * flat.length);
  flat.forEach(({ binding, element, b }, i) => {
    const range = b.range ?? VK_WHOLE_SIZE;
    const limit = BigInt(device.info.limits.maxStorageBufferRange);
    const effective = range === VK_WHOLE_SIZE ? b.buffer.size - (b.offset ?? 0n) : range;
    if (effective > limit) {
      throw new InvalidArgumentError(`binding ${binding}[${element}]: range of ${effective} bytes exceeds maxStorageBufferRange (${limit})`);
    }
    VkDescriptorBufferInfo.write(a.view, infos + i * VkDescriptorBufferInfo.size, { buffer: b.buffer.handle, offset: b.offset ?? 0n, range });
    VkWriteDescriptorSet.write(a.view, writes + i * VkWriteDescriptorSet.size, {
      dstSet: set, dstBinding: binding, dstArrayElement: element, descriptorCount: 1, descriptorType: VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
      pBufferInfo: a.address(infos + i * VkDescriptorBufferInfo.size),
    });
  });
  device.vk.vkUpdateDescriptorSets(device.handle, flat.length, a.address(writes), 0, 0n);
}
