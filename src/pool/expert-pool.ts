/**
 * The expert pool on a Vulkan device: slabs within the device's limits, best-fit suballocation,
 * the expert cache under a budget, and how kernels find a resident expert:
 *  - "bda": its 64-bit buffer device address (bigint end to end; two u32 words in tables);
 *  - "descriptor": (slab index, offset in uvec4 units) with slabs bound as storage buffers.
 */
import type { Device } from "../vk/device.ts";
import { ExpertCache, type ExpertSource, type ResidentExpert, type BatchTicket, type CacheStats } from "./cache.ts";
import type { PolicyName } from "./policy.ts";
import { SlabAllocator, type SlabAllocation } from "./suballocator.ts";
import { createUploader, slabLimits, VulkanSlabProvider, type DeviceSlab, type Uploader } from "./vulkan-slabs.ts";
import { expertLayout, type ExpertLayout, type ExpertShape } from "./expert-layout.ts";

export type Addressing = "bda" | "descriptor";

export interface ExpertPoolOptions {
  shape: ExpertShape;
  budgetBytes: number;
  /** Default: "bda" where bufferDeviceAddress is enabled (VKMOE_BDA=off disables it), else "descriptor". */
  addressing?: Addressing;
  policy?: PolicyName;
  /** Preferred slab size (clamped to the device's limits). */
  slabBytes?: number;
  /** Empty slabs kept instead of freed. */
  spareSlabs?: number;
}

/** Where a resident expert is, in both addressing schemes. */
export interface ExpertLocation {
  slab: DeviceSlab;
  /** Byte offset of the blob in its slab. */
  offset: number;
  /** 64-bit device address of the blob (0n on the descriptor path). */
  address: bigint;
}

export class ExpertPool implements Disposable {
  readonly device: Device;
  readonly layout: ExpertLayout;
  readonly addressing: Addressing;
  readonly provider: VulkanSlabProvider;
  readonly allocator: SlabAllocator<DeviceSlab>;
  readonly cache: ExpertCache<DeviceSlab>;
  readonly uploader: Uploader;

  constructor(device: Device, options: ExpertPoolOptions) {
    this.device = device;
    this.layout = expertLayout(options.shape);
    this.addressing = options.addressing ?? (device.enabled.bufferDeviceAddress ? "bda" : "descriptor");
    if (this.addressing === "bda" && !device.enabled.bufferDeviceAddress) throw new Error("bda addressing needs bufferDeviceAddress enabled");
    const limits = slabLimits(device, this.addressing === "bda", options.slabBytes);
    this.provider = new VulkanSlabProvider(device, { deviceAddresses: this.addressing === "bda" });
    this.allocator = new SlabAllocator(this.provider, {
      maxSlabBytes: limits.maxSlabBytes,
      slabBytes: limits.slabBytes,
      alignment: limits.alignment,
      spareSlabs: options.spareSlabs ?? 1,
    });
    this.uploader = createUploader(device);
    this.cache = new ExpertCache({
      allocator: this.allocator,
      uploader: this.uploader,
      budgetBytes: options.budgetBytes,
      policy: options.policy,
      expertBytes: this.layout.bytes,
    });
  }

  ensure(layer: number, expert: number, source?: ExpertSource): ResidentExpert<DeviceSlab> {
    return this.cache.ensure(layer, expert, source);
  }

  /** A batch that pins the experts it ensures; `reuse`, a released batch of this pool, is opened again (no allocation). */
  beginBatch(reuse?: BatchTicket<DeviceSlab>): BatchTicket<DeviceSlab> {
    return this.cache.beginBatch(reuse);
  }

  /** Where an allocation is (allocates; bigint math). Per call, prefer a resident expert's own fields: addressLo/addressHi, allocation.slab and .offset. */
  locate(allocation: SlabAllocation<DeviceSlab>): ExpertLocation {
    const slab = allocation.slab;
    return { slab, offset: allocation.offset, address: this.addressing === "bda" ? this.allocator.deviceAddressOf(allocation) : 0n };
  }

  /** Makes every upload so far visible to submissions that follow (staged uploads complete). */
  flush(): void {
    this.uploader.flush();
  }

  stats(): CacheStats & { uploadedBytesByUploader: number; slabs: number } {
    return { ...this.cache.stats(), uploadedBytesByUploader: this.uploader.bytes, slabs: this.allocator.totals().slabCount };
  }

  [Symbol.dispose](): void {
    this.uploader.flush();
    this.cache.dispose();
    this.allocator.dispose();
    this.uploader[Symbol.dispose]();
  }
}
