/** Command pools and buffers. Recording allocates nothing on the JS heap per command beyond arena scratch. */
import { InvalidArgumentError } from "../errors.ts";
import {
  VK_ACCESS_HOST_READ_BIT, VK_ACCESS_SHADER_READ_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT,
  VK_ACCESS_TRANSFER_WRITE_BIT, VK_COMMAND_BUFFER_LEVEL_PRIMARY, VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
  VK_PIPELINE_BIND_POINT_COMPUTE, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT,
  VK_PIPELINE_STAGE_TRANSFER_BIT, VK_QUEUE_FAMILY_IGNORED, VK_SHADER_STAGE_COMPUTE_BIT, VK_WHOLE_SIZE,
} from "./constants.ts";
import type { Device } from "./device.ts";
import { check } from "./errors.ts";
import type { Buffer } from "./memory.ts";
import type { ComputePipeline } from "./pipeline.ts";
import type { QueryPool } from "./sync.ts";
import { VkBufferCopy, VkBufferMemoryBarrier, VkCommandBufferAllocateInfo, VkCommandBufferBeginInfo, VkCommandPoolCreateInfo, VkMemoryBarrier } from "./structs.ts";

export class CommandPool implements Disposable {
  readonly device: Device;
  readonly handle: bigint;
  private disposed = false;

  constructor(device: Device) {
    this.device = device;
    const a = device.arena;
    using _ = a.scope();
    const info = a.alloc(VkCommandPoolCreateInfo.size);
    VkCommandPoolCreateInfo.write(a.view, info, { flags: VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex: device.queueFamily });
    const out = a.alloc(8);
    check("vkCreateCommandPool", device.vk.vkCreateCommandPool(device.handle, a.address(info), 0n, a.address(out)));
    this.handle = a.view.getBigUint64(out, true);
  }

  allocate(): CommandBuffer {
    const a = this.device.arena;
    using _ = a.scope();
    const info = a.alloc(VkCommandBufferAllocateInfo.size);
    VkCommandBufferAllocateInfo.write(a.view, info, { commandPool: this.handle, level: VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount: 1 });
    const out = a.alloc(8);
    check("vkAllocateCommandBuffers", this.device.vk.vkAllocateCommandBuffers(this.device.handle, a.address(info), a.address(out)));
    return new CommandBuffer(this.device, a.view.getBigUint64(out, true));
  }

  /** Destroying the pool frees its command buffers. */
  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.device.vk.vkDestroyCommandPool(this.device.handle, this.handle, 0n);
  }
}

/** Named execution/memory dependencies; each is one global VkMemoryBarrier (none where both access masks are 0). */
export const Barrier = {
  computeToCompute: [VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT],
  /** Writes made visible to later reads only (not to later writes of the same memory). */
  computeToComputeRead: [VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT],
  /** Execution only: later dispatches start after earlier ones end (enough where they only write what earlier ones read). */
  computeExecution: [VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0],
  computeToHost: [VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT],
  computeToTransfer: [VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT],
  transferToCompute: [VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT],
  transferToTransfer: [VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT],
  transferToHost: [VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT],
} as const satisfies Record<string, readonly [number, number, number, number]>;
export type BarrierKind = keyof typeof Barrier;

export class CommandBuffer {
  readonly device: Device;
  readonly handle: bigint;

  constructor(device: Device, handle: bigint) {
    this.device = device;
    this.handle = handle;
  }

  begin(flags = 0): this {
    const a = this.device.arena;
    using _ = a.scope();
    const info = a.alloc(VkCommandBufferBeginInfo.size);
    VkCommandBufferBeginInfo.write(a.view, info, { flags });
    check("vkBeginCommandBuffer", this.device.vk.vkBeginCommandBuffer(this.handle, a.address(info)));
    return this;
  }

  end(): this {
    check("vkEndCommandBuffer", this.device.vk.vkEndCommandBuffer(this.handle));
    return this;
  }

  bind(pipeline: ComputePipeline, descriptorSet: bigint): this {
    const vk = this.device.vk;
    const a = this.device.arena;
    using _ = a.scope();
    vk.vkCmdBindPipeline(this.handle, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline);
    const sets = a.alloc(8);
    a.view.setBigUint64(sets, descriptorSet, true);
    vk.vkCmdBindDescriptorSets(this.handle, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1, a.address(sets), 0, 0n);
    return this;
  }

  /** Push constants as raw bytes (build them with a DataView or typed array in the shader's std430 order). */
  pushConstants(pipeline: ComputePipeline, data: ArrayBufferView): this {
    if (data.byteLength !== pipeline.pushConstantBytes) {
      throw new InvalidArgumentError(`push constants are ${pipeline.pushConstantBytes} bytes, got ${data.byteLength}`);
    }
    const a = this.device.arena;
    using _ = a.scope();
    const at = a.alloc(data.byteLength, 4);
    a.bytes.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), at);
    this.device.vk.vkCmdPushConstants(this.handle, pipeline.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, data.byteLength, a.address(at));
    return this;
  }

  dispatch(x: number, y = 1, z = 1): this {
    const max = this.device.info.limits.maxComputeWorkGroupCount;
    if (x < 1 || y < 1 || z < 1 || x > max[0]! || y > max[1]! || z > max[2]!) {
      throw new InvalidArgumentError(`dispatch (${x}, ${y}, ${z}) outside 1..maxComputeWorkGroupCount (${max.join(", ")})`);
    }
    this.device.vk.vkCmdDispatch(this.handle, x, y, z);
    return this;
  }

  /** A dispatch whose group counts (3 x u32) are read from `args` at `offset` when it executes. */
  dispatchIndirect(args: Buffer, offset = 0n): this {
    this.device.vk.vkCmdDispatchIndirect(this.handle, args.handle, offset);
    return this;
  }

  barrier(kind: BarrierKind): this {
    const [srcStage, srcAccess, dstStage, dstAccess] = Barrier[kind];
    const a = this.device.arena;
    using _ = a.scope();
    const mb = a.alloc(VkMemoryBarrier.size);
    VkMemoryBarrier.write(a.view, mb, { srcAccessMask: srcAccess, dstAccessMask: dstAccess });
    const memoryBarriers = srcAccess === 0 && dstAccess === 0 ? 0 : 1;
    this.device.vk.vkCmdPipelineBarrier(this.handle, srcStage, dstStage, 0, memoryBarriers, a.address(mb), 0, 0n, 0, 0n);
    return this;
  }

  /** The dependency `kind` as one VkBufferMemoryBarrier a buffer (each whole) instead of a global one. */
  bufferBarrier(kind: BarrierKind, buffers: readonly Buffer[]): this {
    const [srcStage, srcAccess, dstStage, dstAccess] = Barrier[kind];
    if (buffers.length === 0) throw new InvalidArgumentError("bufferBarrier needs at least one buffer");
    const a = this.device.arena;
    using _ = a.scope();
    const at = a.alloc(VkBufferMemoryBarrier.size * buffers.length);
    buffers.forEach((b, i) => VkBufferMemoryBarrier.write(a.view, at + i * VkBufferMemoryBarrier.size, {
      srcAccessMask: srcAccess, dstAccessMask: dstAccess, srcQueueFamilyIndex: VK_QUEUE_FAMILY_IGNORED, dstQueueFamilyIndex: VK_QUEUE_FAMILY_IGNORED,
      buffer: b.handle, offset: 0n, size: VK_WHOLE_SIZE,
    }));
    this.device.vk.vkCmdPipelineBarrier(this.handle, srcStage, dstStage, 0, 0, 0n, buffers.length, a.address(at), 0, 0n);
    return this;
  }

  copyBuffer(src: Buffer, dst: Buffer, size: bigint, srcOffset = 0n, dstOffset = 0n): this {
    if (srcOffset + size > src.size || dstOffset + size > dst.size) throw new InvalidArgumentError("copyBuffer range outside a buffer");
    const a = this.device.arena;
    using _ = a.scope();
    const region = a.alloc(VkBufferCopy.size);
    VkBufferCopy.write(a.view, region, { srcOffset, dstOffset, size });
    this.device.vk.vkCmdCopyBuffer(this.handle, src.handle, dst.handle, 1, a.address(region));
    return this;
  }

  fillBuffer(dst: Buffer, value: number, size = dst.size, offset = 0n): this {
    this.device.vk.vkCmdFillBuffer(this.handle, dst.handle, offset, size, value >>> 0);
    return this;
  }

  resetQueries(pool: QueryPool, first = 0, count = pool.count): this {
    this.device.vk.vkCmdResetQueryPool(this.handle, pool.handle, first, count);
    return this;
  }

  timestamp(pool: QueryPool, query: number, stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT): this {
    this.device.vk.vkCmdWriteTimestamp(this.handle, stage, pool.handle, query);
    return this;
  }
}
