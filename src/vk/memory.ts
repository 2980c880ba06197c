/** Buffers with their own memory, mapped when host-visible, with a device address when asked. */
import { ffi } from "../ffi/index.ts";
import { InvalidArgumentError } from "../errors.ts";
import {
  VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT, VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, VK_BUFFER_USAGE_TRANSFER_DST_BIT,
  VK_BUFFER_USAGE_TRANSFER_SRC_BIT, VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
} from "./constants.ts";
import type { Device } from "./device.ts";
import { check } from "./errors.ts";
import {
  VkBufferCreateInfo, VkBufferDeviceAddressInfo, VkMemoryAllocateFlagsInfo, VkMemoryAllocateInfo,
  VkMemoryPriorityAllocateInfoEXT, VkMemoryRequirements,
} from "./structs.ts";

/** Where a buffer's memory lives: weights ("device"), CPU-written inputs ("upload"), CPU-read outputs ("readback"). */
export type MemoryUse = "device" | "upload" | "readback";

export interface BufferOptions {
  size: bigint;
  memory: MemoryUse;
  /** Request a 64-bit device address (needs bufferDeviceAddress enabled). */
  deviceAddress?: boolean;
  /** VK_EXT_memory_priority value in [0, 1]; ignored where the extension is off. */
  priority?: number;
}

export class Buffer implements Disposable {
  readonly device: Device;
  readonly handle: bigint;
  readonly memory: bigint;
  readonly size: bigint;
  readonly memoryType: number;
  /** The host mapping when the memory is host-visible. */
  readonly mapped: ArrayBuffer | undefined;
  /** The buffer's device address, or 0n when not requested. */
  readonly address: bigint;
  private disposed = false;

  constructor(device: Device, options: BufferOptions) {
    const { size } = options;
    if (typeof size !== "bigint" || size <= 0n) throw new InvalidArgumentError(`buffer size must be a positive bigint, got ${String(size)}`);
    if (options.deviceAddress && !device.enabled.bufferDeviceAddress) {
      throw new InvalidArgumentError("deviceAddress requested but bufferDeviceAddress is not enabled on this device");
    }
    this.device = device;
    this.size = size;
    const vk = device.vk;
    const a = device.arena;
    using _ = a.scope();
    let usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT;
    if (options.deviceAddress) usage |= VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
    const info = a.alloc(VkBufferCreateInfo.size);
    VkBufferCreateInfo.write(a.view, info, { size, usage });
    const out = a.alloc(8);
    check("vkCreateBuffer", vk.vkCreateBuffer(device.handle, a.address(info), 0n, a.address(out)));
    this.handle = a.view.getBigUint64(out, true);

    const req = a.alloc(VkMemoryRequirements.size);
    vk.vkGetBufferMemoryRequirements(device.handle, this.handle, a.address(req));
    const requirements = VkMemoryRequirements.read(a.view, req);
    const plan = device.memory;
    const wanted = options.memory === "device" ? plan.deviceType : options.memory === "upload" ? plan.uploadType : plan.readbackType;
    const typeBits = requirements.memoryTypeBits as number;
    const wantedFlags = device.info.types[wanted]!.flags;
    const typeIndex = (typeBits >>> wanted) & 1 ? wanted : device.info.types.find((t) => (typeBits >>> t.index) & 1 && (t.flags & wantedFlags) === wantedFlags)?.index;
    if (typeIndex === undefined) {
      vk.vkDestroyBuffer(device.handle, this.handle, 0n);
      throw new InvalidArgumentError(`no memory type for a ${options.memory} buffer (allowed bits 0x${typeBits.toString(16)})`);
    }
    this.memoryType = typeIndex;

    let next = 0n;
    if (device.enabled.memoryPriority && options.priority !== undefined) {
      const p = a.alloc(VkMemoryPriorityAllocateInfoEXT.size);
      VkMemoryPriorityAllocateInfoEXT.write(a.view, p, { priority: Math.min(1, Math.max(0, options.priority)) });
      next = a.address(p);
    }
    if (options.deviceAddress) {
      const fl = a.alloc(VkMemoryAllocateFlagsInfo.size);
      VkMemoryAllocateFlagsInfo.write(a.view, fl, { pNext: next, flags: VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT });
      next = a.address(fl);
    }
    const alloc = a.alloc(VkMemoryAllocateInfo.size);
    VkMemoryAllocateInfo.write(a.view, alloc, { pNext: next, allocationSize: requirements.size as bigint, memoryTypeIndex: typeIndex });
    const mem = a.alloc(8);
    try {
      check("vkAllocateMemory", vk.vkAllocateMemory(device.handle, a.address(alloc), 0n, a.address(mem)));
    } catch (e) {
      vk.vkDestroyBuffer(device.handle, this.handle, 0n);
      throw e;
    }
    this.memory = a.view.getBigUint64(mem, true);
    try {
      check("vkBindBufferMemory", vk.vkBindBufferMemory(device.handle, this.handle, this.memory, 0n));
      if (device.info.types[typeIndex]!.flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
        const ptr = a.alloc(8);
        check("vkMapMemory", vk.vkMapMemory(device.handle, this.memory, 0n, size, 0, a.address(ptr)));
        this.mapped = ffi.view(a.view.getBigUint64(ptr, true), Number(size));
      }
    } catch (e) {
      vk.vkDestroyBuffer(device.handle, this.handle, 0n);
      vk.vkFreeMemory(device.handle, this.memory, 0n);
      throw e;
    }
    if (options.deviceAddress) {
      const ai = a.alloc(VkBufferDeviceAddressInfo.size);
      VkBufferDeviceAddressInfo.write(a.view, ai, { buffer: this.handle });
      this.address = BigInt(vk.vkGetBufferDeviceAddress(device.handle, a.address(ai)));
    } else {
      this.address = 0n;
    }
  }

  /** The mapping; throws if this buffer is not host-visible (staged device memory). */
  host(): ArrayBuffer {
    if (!this.mapped) throw new InvalidArgumentError("buffer memory is not host-visible; upload through a staging buffer");
    return this.mapped;
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    const { vk, handle } = this.device;
    // vkFreeMemory unmaps implicitly.
    vk.vkDestroyBuffer(handle, this.handle, 0n);
    vk.vkFreeMemory(handle, this.memory, 0n);
  }
}
