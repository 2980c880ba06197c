/**
 * Host-memory implementations of {@link SlabProvider} and {@link ExpertUploader}: slabs are
 * ArrayBuffers. Used by the tests and the cache benchmark, and usable as a CPU-side stand-in for
 * device memory. Includes fault injection (fail the next N slab creations) and a capacity limit,
 * both reported as {@link OutOfDeviceMemoryError}.
 */
import { InvalidArgumentError } from "../errors.ts";
import type { ExpertUploader, FillCallback } from "./cache.ts";
import { OutOfDeviceMemoryError } from "./errors.ts";
import type { SlabAllocation, SlabProvider } from "./suballocator.ts";

export interface HostSlab {
  readonly id: number;
  readonly bytes: number;
  /** Backing bytes; null for a virtual provider (`backed: false`). */
  readonly memory: Uint8Array | null;
  /** Fake base device address. */
  readonly address: bigint;
  destroyed: boolean;
}

export interface HostMemorySlabProviderOptions {
  /** Allocate real ArrayBuffers (default true). Virtual slabs have no bytes: for benchmarks of bookkeeping. */
  backed?: boolean;
  /** Total bytes of live slabs allowed; creating beyond it throws OutOfDeviceMemoryError (default unlimited). */
  capacityBytes?: number;
  /** Base address of the first slab (default 0x1_0000_0000n). Slab i gets base + i * addressStride. */
  baseAddress?: bigint;
  /** Distance between slab base addresses (default 1 TiB, so slabs never overlap in address space). */
  addressStride?: bigint;
}

export class HostMemorySlabProvider implements SlabProvider<HostSlab> {
  readonly backed: boolean;
  capacityBytes: number;
  private readonly baseAddress: bigint;
  private readonly addressStride: bigint;
  private nextId = 0;
  private failures = 0;
  private liveSet = new Set<HostSlab>();
  private liveByteCount = 0;
  /** Counters for tests. */
  created = 0;
  destroyed = 0;
  failedCreates = 0;

  constructor(options: HostMemorySlabProviderOptions = {}) {
    this.backed = options.backed ?? true;
    this.capacityBytes = options.capacityBytes ?? Number.POSITIVE_INFINITY;
    this.baseAddress = options.baseAddress ?? 0x1_0000_0000n;
    this.addressStride = options.addressStride ?? 1n << 40n;
  }

  /** Fault hook: the next `n` createSlab calls throw OutOfDeviceMemoryError. */
  failNext(n: number): void {
    if (!Number.isSafeInteger(n) || n < 0) throw new InvalidArgumentError(`failNext needs a count >= 0, got ${n}`);
    this.failures = n;
  }

  get pendingFailures(): number {
    return this.failures;
  }

  get liveSlabs(): number {
    return this.liveSet.size;
  }

  get liveBytes(): number {
    return this.liveByteCount;
  }

  createSlab(bytes: number): HostSlab {
    if (this.failures > 0) {
      this.failures--;
      this.failedCreates++;
      throw new OutOfDeviceMemoryError(bytes, `injected out-of-device-memory creating a slab of ${bytes} bytes`);
    }
    if (this.liveByteCount + bytes > this.capacityBytes) {
      this.failedCreates++;
      throw new OutOfDeviceMemoryError(bytes);
    }
    const id = this.nextId++;
    const slab: HostSlab = {
      id,
      bytes,
      memory: this.backed ? new Uint8Array(bytes) : null,
      address: this.baseAddress + BigInt(id) * this.addressStride,
      destroyed: false,
    };
    this.liveSet.add(slab);
    this.liveByteCount += bytes;
    this.created++;
    return slab;
  }

  destroySlab(slab: HostSlab): void {
    if (!this.liveSet.delete(slab)) throw new InvalidArgumentError(`slab ${slab.id} destroyed twice or not ours`);
    slab.destroyed = true;
    this.liveByteCount -= slab.bytes;
    this.destroyed++;
  }

  slabDeviceAddress(slab: HostSlab): bigint {
    return slab.address;
  }
}

/** Copies expert bytes into host slabs (or, for virtual slabs, only counts). */
export class HostMemoryUploader implements ExpertUploader<HostSlab> {
  uploads = 0;
  bytes = 0;
  upload(allocation: SlabAllocation<HostSlab>, data: Uint8Array | FillCallback): void {
    const slab = allocation.slab;
    if (slab.destroyed) throw new InvalidArgumentError(`upload into destroyed slab ${slab.id}`);
    if (slab.memory !== null) {
      const dest = slab.memory.subarray(allocation.offset, allocation.offset + allocation.size);
      if (typeof data === "function") data(dest);
      else {
        if (data.byteLength !== allocation.size) throw new InvalidArgumentError(`upload of ${data.byteLength} bytes into ${allocation.size}`);
        dest.set(data);
      }
    }
    this.uploads++;
    this.bytes += allocation.size;
  }

  /** The bytes of an allocation (backed slabs only). */
  static view(allocation: SlabAllocation<HostSlab>): Uint8Array {
    const m = allocation.slab.memory;
    if (m === null) throw new InvalidArgumentError("virtual slab has no bytes");
    return m.subarray(allocation.offset, allocation.offset + allocation.size);
  }
}
