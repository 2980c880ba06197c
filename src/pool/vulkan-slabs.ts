/**
 * Device memory for the expert pool: slabs (one VkBuffer + VkDeviceMemory each, sized within the
 * device's limits) and the uploaders for the three memory models. Expert data is written straight
 * into mapped device memory on unified memory and ReBAR, and through a staging ring otherwise.
 */
import { InvalidArgumentError } from "../errors.ts";
import { Buffer } from "../vk/memory.ts";
import type { Device } from "../vk/device.ts";
import { OutOfMemoryError } from "../vk/errors.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import { Fence, Submission } from "../vk/sync.ts";
import { VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT } from "../vk/constants.ts";
import { OutOfDeviceMemoryError } from "./errors.ts";
import type { SlabAllocation, SlabProvider } from "./suballocator.ts";
import type { FillCallback } from "./cache.ts";

/** Priority of expert memory under VK_EXT_memory_priority: cold experts page out before the per-call working set (1.0). */
export const EXPERT_PRIORITY = 0.4;

export interface DeviceSlab {
  readonly index: number;
  readonly buffer: Buffer;
  /** Base device address (0n on the descriptor path). */
  readonly address: bigint;
}

export interface SlabLimits {
  /** Largest slab the device allows for this addressing path. */
  maxSlabBytes: number;
  /** Normal slab size: large, so few VkDeviceMemory objects exist. */
  slabBytes: number;
  /** Allocation alignment: buffer requirements and minStorageBufferOffsetAlignment, at least 256. */
  alignment: number;
}

/**
 * maxMemoryAllocationSize and maxBufferSize bound every slab; on the descriptor path a slab is
 * bound whole, so maxStorageBufferRange bounds it too.
 */
export function slabLimits(device: Device, deviceAddresses: boolean, preferredSlabBytes = 1 << 30): SlabLimits {
  const l = device.info.limits;
  let max = l.maxMemoryAllocationSize < l.maxBufferSize ? l.maxMemoryAllocationSize : l.maxBufferSize;
  if (!deviceAddresses && BigInt(l.maxStorageBufferRange) < max) max = BigInt(l.maxStorageBufferRange);
  // Round down to 64 KiB so slabs of "4 GiB - 1" limits stay nicely aligned.
  const maxSlabBytes = Number(max) - (Number(max) % 65536);
  const alignment = Math.max(256, Number(l.minStorageBufferOffsetAlignment));
  return { maxSlabBytes, slabBytes: Math.min(preferredSlabBytes, maxSlabBytes), alignment };
}

export interface SlabProviderOptions {
  deviceAddresses: boolean;
  /** Test hook: the next N createSlab calls fail as if the device were out of memory. */
  failNext?: number;
}

export class VulkanSlabProvider implements SlabProvider<DeviceSlab> {
  readonly device: Device;
  readonly deviceAddresses: boolean;
  private nextIndex = 0;
  private failures: number;
  live = 0;

  constructor(device: Device, options: SlabProviderOptions) {
    this.device = device;
    this.deviceAddresses = options.deviceAddresses;
    this.failures = options.failNext ?? 0;
  }

  /** Fault hook: make the next `n` slab allocations fail with out-of-device-memory. */
  failNext(n: number): void {
    this.failures = n;
  }

  createSlab(bytes: number): DeviceSlab {
    if (this.failures > 0) {
      this.failures--;
      throw new OutOfDeviceMemoryError(bytes, `injected out-of-device-memory for a slab of ${bytes} bytes`);
    }
    let buffer: Buffer;
    try {
      buffer = new Buffer(this.device, { size: BigInt(bytes), memory: "device", deviceAddress: this.deviceAddresses, priority: EXPERT_PRIORITY });
    } catch (e) {
      if (e instanceof OutOfMemoryError) throw new OutOfDeviceMemoryError(bytes, e.message, { cause: e });
      throw e;
    }
    this.live++;
    return { index: this.nextIndex++, buffer, address: buffer.address };
  }

  destroySlab(slab: DeviceSlab): void {
    slab.buffer[Symbol.dispose]();
    this.live--;
  }

  slabDeviceAddress(slab: DeviceSlab): bigint {
    return slab.address;
  }
}

export interface Uploader {
  upload(allocation: SlabAllocation<DeviceSlab>, data: Uint8Array | FillCallback): void;
  /** Waits until every upload is visible to later submissions. */
  flush(): void;
  readonly bytes: number;
  [Symbol.dispose](): void;
}

/** Unified memory and ReBAR: the slab is mapped; write into it. */
export class DirectUploader implements Uploader {
  bytes = 0;
  upload(allocation: SlabAllocation<DeviceSlab>, data: Uint8Array | FillCallback): void {
    const dest = new Uint8Array(allocation.slab.buffer.host(), allocation.offset, allocation.size);
    if (typeof data === "function") data(dest);
    else {
      if (data.byteLength !== allocation.size) throw new InvalidArgumentError(`upload of ${data.byteLength} bytes into ${allocation.size}`);
      dest.set(data);
    }
    this.bytes += allocation.size;
  }
  flush(): void {}
  [Symbol.dispose](): void {}
}

interface RingSlot {
  staging: Buffer;
  bytes: Uint8Array;
  commands: CommandBuffer;
  fence: Fence;
  submission: Submission;
  busy: boolean;
}

/**
 * Discrete GPUs without a large host-visible device-local heap: a ring of host-visible staging
 * buffers; each chunk is copied with vkCmdCopyBuffer while the CPU fills the next slot.
 */
export class StagedUploader implements Uploader {
  readonly device: Device;
  readonly slotBytes: number;
  bytes = 0;
  private readonly pool: CommandPool;
  private readonly slots: RingSlot[] = [];
  private next = 0;

  constructor(device: Device, slotBytes = 16 << 20, slotCount = 3) {
    this.device = device;
    this.slotBytes = slotBytes;
    this.pool = new CommandPool(device);
    for (let i = 0; i < slotCount; i++) {
      const staging = new Buffer(device, { size: BigInt(slotBytes), memory: "upload", priority: 1 });
      const commands = this.pool.allocate();
      const fence = new Fence(device);
      this.slots.push({ staging, bytes: new Uint8Array(staging.host()), commands, fence, submission: new Submission(device, [commands], { fence }), busy: false });
    }
  }

  private acquire(): RingSlot {
    const slot = this.slots[this.next]!;
    this.next = (this.next + 1) % this.slots.length;
    if (slot.busy) {
      slot.fence.wait();
      slot.fence.reset();
      slot.busy = false;
    }
    return slot;
  }

  private copy(slot: RingSlot, allocation: SlabAllocation<DeviceSlab>, at: number, length: number): void {
    // The barrier's second scope is every later command on the queue, in later submissions too:
    // kernels reading the expert need no barrier of their own (the MoE layer records none).
    slot.commands.begin(VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
      .copyBuffer(slot.staging, allocation.slab.buffer, BigInt(length), 0n, BigInt(allocation.offset + at))
      .barrier("transferToCompute")
      .end();
    slot.submission.submit();
    slot.busy = true;
  }

  upload(allocation: SlabAllocation<DeviceSlab>, data: Uint8Array | FillCallback): void {
    let source: Uint8Array;
    if (typeof data === "function") {
      if (allocation.size <= this.slotBytes) {
        // Fill the staging slot directly: no second copy.
        const slot = this.acquire();
        data(slot.bytes.subarray(0, allocation.size));
        this.copy(slot, allocation, 0, allocation.size);
        this.bytes += allocation.size;
        return;
      }
      source = new Uint8Array(allocation.size);
      data(source);
    } else {
      if (data.byteLength !== allocation.size) throw new InvalidArgumentError(`upload of ${data.byteLength} bytes into ${allocation.size}`);
      source = data;
    }
    for (let at = 0; at < source.byteLength; at += this.slotBytes) {
      const length = Math.min(this.slotBytes, source.byteLength - at);
      const slot = this.acquire();
      slot.bytes.set(source.subarray(at, at + length));
      this.copy(slot, allocation, at, length);
    }
    this.bytes += allocation.size;
  }

  flush(): void {
    for (const slot of this.slots) {
      if (!slot.busy) continue;
      slot.fence.wait();
      slot.fence.reset();
      slot.busy = false;
    }
  }

  [Symbol.dispose](): void {
    this.flush();
    for (const s of this.slots) {
      s.submission[Symbol.dispose]();
      s.fence[Symbol.dispose]();
      s.staging[Symbol.dispose]();
    }
    this.pool[Symbol.dispose]();
  }
}

export function createUploader(device: Device): Uploader {
  return device.memory.model === "staged" ? new StagedUploader(device) : new DirectUploader();
}
