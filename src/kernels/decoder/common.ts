/**
 * Shared host side of the decoder kernels (shaders/dec_*.comp): one pipeline per kernel object,
 * descriptor sets cached per tuple of buffers (written once, then reused by every recording),
 * push constants packed as std430 words, and a submit-and-wait helper for tests and setup.
 * Offsets and sizes travel in push constants, so a dispatch is recorded once and replayed.
 */
import { InvalidArgumentError } from "../../errors.ts";
import { CommandPool, type CommandBuffer } from "../../vk/commands.ts";
import { DescriptorPool } from "../../vk/descriptors.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import { ComputePipeline } from "../../vk/pipeline.ts";
import { Fence, Submission } from "../../vk/sync.ts";
import { pipelineSpec, type ShaderInterface } from "../shaders.ts";

export interface DecoderKernelOptions {
  /** Descriptor sets per pool (a pool is added when one is full); default 32. */
  maxSets?: number;
}

/** std430 push-constant block of 4-byte fields; `f` marks the float fields by index. */
export function pushWords(values: readonly number[], floats: readonly number[] = []): Uint8Array {
  const dv = new DataView(new ArrayBuffer(4 * values.length));
  values.forEach((v, i) => {
    if (floats.includes(i)) dv.setFloat32(4 * i, v, true);
    else {
      if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new InvalidArgumentError(`push constant ${i} = ${v} is not a u32`);
      dv.setUint32(4 * i, v, true);
    }
  });
  return new Uint8Array(dv.buffer);
}

/** A distinct number per Buffer object (handles can be reused once a buffer is destroyed). */
const bufferIds = new WeakMap<Buffer, number>();
let nextBufferId = 1;
function bufferId(b: Buffer): number {
  let id = bufferIds.get(b);
  if (id === undefined) bufferIds.set(b, (id = nextBufferId++));
  return id;
}

export abstract class DecoderKernel implements Disposable {
  readonly device: Device;
  readonly pipeline: ComputePipeline;
  private readonly pools: DescriptorPool[] = [];
  private readonly sets = new Map<string, bigint>();
  private readonly setsPerPool: number;
  private readonly bindings: number;
  private inPool = 0;

  protected constructor(device: Device, shader: ShaderInterface, specialization: Record<number, number>, options: DecoderKernelOptions = {}) {
    this.device = device;
    this.setsPerPool = options.maxSets ?? 32;
    this.bindings = shader.storageBuffers;
    this.pipeline = new ComputePipeline(device, pipelineSpec(shader, specialization));
  }

  /**
   * The descriptor set binding `buffers` (whole buffers, bindings 0..n-1), written on first use
   * and cached per tuple of Buffer objects; more pools are added as needed. A set stays valid
   * while its buffers live; `releaseSets()` drops them all (when no recording using them is pending).
   */
  protected setFor(buffers: readonly Buffer[]): bigint {
    const key = buffers.map(bufferId).join(",");
    let set = this.sets.get(key);
    if (set === undefined) {
      if (this.pools.length === 0 || this.inPool >= this.setsPerPool) {
        this.pools.push(new DescriptorPool(this.device, this.setsPerPool, this.setsPerPool * this.bindings));
        this.inPool = 0;
      }
      set = this.pools[this.pools.length - 1]!.allocate(this.pipeline, buffers.map((buffer) => ({ buffer })));
      this.inPool++;
      this.sets.set(key, set);
    }
    return set;
  }

  /** Frees every cached descriptor set (the GPU must not be using any recording of this kernel). */
  releaseSets(): void {
    for (const p of this.pools) p[Symbol.dispose]();
    this.pools.length = 0;
    this.sets.clear();
    this.inPool = 0;
  }

  /** Workgroup grid for `count` workgroups: x up to maxComputeWorkGroupCount[0], the rest over y. */
  protected grid(count: number): [number, number] {
    const maxX = this.device.info.limits.maxComputeWorkGroupCount[0]!;
    return count <= maxX ? [Math.max(1, count), 1] : [maxX, Math.ceil(count / maxX)];
  }

  [Symbol.dispose](): void {
    this.releaseSets();
    this.pipeline[Symbol.dispose]();
  }
}

/** Throws unless `words` 4-byte elements from element `offset` lie inside `buffer`. */
export function checkRange(what: string, buffer: Buffer, offset: number, words: number): void {
  if (!Number.isInteger(offset) || offset < 0 || (offset + words) * 4 > Number(buffer.size)) {
    throw new InvalidArgumentError(`${what}: elements ${offset}..${offset + words} outside a buffer of ${Number(buffer.size) / 4} words`);
  }
}

/**
 * Records with `record`, then a compute-to-host barrier, submits, and waits (setup and tests;
 * the decode graph records its own command buffer).
 */
export function submitAndWait(device: Device, record: (cb: CommandBuffer) => void, timeoutNs = 60_000_000_000n): void {
  using pool = new CommandPool(device);
  const cb = pool.allocate().begin();
  record(cb);
  cb.barrier("computeToHost").end();
  using fence = new Fence(device);
  using submission = new Submission(device, [cb], { fence });
  submission.submit();
  if (!fence.wait(timeoutNs)) {
    device.waitIdle();
    throw new Error("decoder kernel timed out");
  }
}
