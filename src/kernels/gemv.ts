/**
 * Host side of the GEMV kernels: pipelines cached per (shader, scale type, group size), matrices
 * resident in device memory, and `GemvOp`, one recorded GEMV / gate+up / integer-dot GEMV that is
 * replayed per call (tests and benchmarks; the MoE layer records its own grouped dispatches).
 */
import { InvalidArgumentError } from "../errors.ts";
import type { QuantMatrix } from "../quant/types.ts";
import { validateQuantMatrix } from "../quant/validate.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import { DescriptorPool } from "../vk/descriptors.ts";
import type { Device } from "../vk/device.ts";
import { Buffer } from "../vk/memory.ts";
import { ComputePipeline } from "../vk/pipeline.ts";
import { Fence, Submission } from "../vk/sync.ts";
import { uploadBytes } from "../vk/transfer.ts";
import { GATEUP, GEMV, GEMV_IDP, pipelineSpec, QUANTIZE_ACT, type ShaderInterface } from "./shaders.ts";
import { specialization, type KernelConfig } from "./tuning.ts";

export class GemvKernels implements Disposable {
  readonly device: Device;
  readonly config: KernelConfig;
  private readonly pipelines = new Map<string, ComputePipeline>();

  constructor(device: Device, config: KernelConfig) {
    this.device = device;
    this.config = config;
  }

  pipeline(shader: ShaderInterface, scaleF16: boolean, groupSize: number): ComputePipeline {
    const key = `${shader.name}/${scaleF16 ? "f16" : "f32"}/${groupSize}`;
    let p = this.pipelines.get(key);
    if (!p) {
      p = new ComputePipeline(this.device, pipelineSpec(shader, specialization(this.config, scaleF16, groupSize)));
      this.pipelines.set(key, p);
    }
    return p;
  }

  /** Workgroup grid for `count` workgroups: x up to maxComputeWorkGroupCount[0], the rest over y. */
  grid(count: number): [number, number] {
    const maxX = this.device.info.limits.maxComputeWorkGroupCount[0]!;
    if (count <= maxX) return [Math.max(1, count), 1];
    const x = maxX;
    return [x, Math.ceil(count / x)];
  }

  [Symbol.dispose](): void {
    for (const p of this.pipelines.values()) p[Symbol.dispose]();
    this.pipelines.clear();
  }
}

/** A quantized matrix in device memory: weights at offset 0, scales after them (16-byte aligned). */
export class DeviceMatrix implements Disposable {
  readonly matrix: Omit<QuantMatrix, "weights" | "scales">;
  readonly buffer: Buffer;
  /** Byte offsets inside `buffer`. */
  readonly weightOffset: number;
  readonly scaleOffset: number;
  readonly bytes: number;

  constructor(device: Device, m: QuantMatrix) {
    validateQuantMatrix(m);
    const { weights, scales, ...meta } = m;
    this.matrix = meta;
    this.weightOffset = 0;
    this.scaleOffset = alignUp(weights.byteLength, 16);
    this.bytes = this.scaleOffset + scales.byteLength;
    this.buffer = new Buffer(device, { size: BigInt(alignUp(this.bytes, 16)), memory: "device" });
    const staging = new Uint8Array(alignUp(this.bytes, 16));
    staging.set(new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength), 0);
    staging.set(new Uint8Array(scales.buffer, scales.byteOffset, scales.byteLength), this.scaleOffset);
    uploadBytes(device, this.buffer, 0n, staging);
  }

  [Symbol.dispose](): void {
    this.buffer[Symbol.dispose]();
  }
}

export const alignUp = (n: number, a: number) => Math.ceil(n / a) * a;

/** Words written past the end of every output buffer; any change is an out-of-bounds write. */
export const SENTINEL_WORDS = 16;
export const SENTINEL = 0x7fc0dead;

export type GemvPath = "float" | "idp";

export interface GemvOpOptions {
  /** One matrix: y = x·Wᵀ. Two (gate, up): h = silu(x·Wgᵀ) ⊙ (x·Wuᵀ) (float path only). */
  matrices: DeviceMatrix[];
  S: number;
  path?: GemvPath;
  /** SwiGLU clamp for gate+up; undefined = none. */
  limit?: number;
}

export class OutOfBoundsWriteError extends Error {}

/** One GEMV recorded once with its own buffers; `run(x)` writes x, submits, waits and returns y. */
export class GemvOp implements Disposable {
  readonly kernels: GemvKernels;
  readonly S: number;
  readonly O: number;
  readonly I: number;
  readonly x: Buffer;
  readonly y: Buffer;
  private readonly scratch: Buffer[] = [];
  private readonly descriptors: DescriptorPool;
  private readonly commands: CommandPool;
  readonly commandBuffer: CommandBuffer;
  private readonly fence: Fence;
  private readonly submission: Submission;

  constructor(kernels: GemvKernels, options: GemvOpOptions) {
    const { matrices, S } = options;
    const path = options.path ?? "float";
    const m = matrices[0]!.matrix;
    if (!Number.isInteger(S) || S < 1 || S > 64) throw new InvalidArgumentError(`S must be an integer in 1..64, got ${S}`);
    if (matrices.length === 2) {
      const u = matrices[1]!.matrix;
      if (u.rows !== m.rows || u.cols !== m.cols || u.format !== m.format || u.groupSize !== m.groupSize || u.scaleType !== m.scaleType) {
        throw new InvalidArgumentError(`gate ${m.rows}x${m.cols} ${m.format}/${m.groupSize}/${m.scaleType} and up ${u.rows}x${u.cols} ${u.format}/${u.groupSize}/${u.scaleType} differ`);
      }
      if (path !== "float") throw new InvalidArgumentError("fused gate+up runs on the float path");
    } else if (matrices.length !== 1) throw new InvalidArgumentError("one matrix, or two (gate, up)");
    if (options.limit !== undefined && !(options.limit > 0 && Number.isFinite(options.limit))) {
      throw new InvalidArgumentError(`limit must be a finite number > 0, got ${options.limit}`);
    }
    const device = kernels.device;
    this.kernels = kernels;
    this.S = S;
    this.O = m.rows;
    this.I = m.cols;
    const f16 = m.scaleType === "f16";
    this.x = new Buffer(device, { size: BigInt(4 * S * m.cols), memory: "upload", priority: 1 });
    this.y = new Buffer(device, { size: BigInt(4 * (S * m.rows + SENTINEL_WORDS)), memory: "readback", priority: 1 });
    new Uint32Array(this.y.host()).fill(SENTINEL);
    this.descriptors = new DescriptorPool(device, 2, 12);
    this.commands = new CommandPool(device);
    const cb = (this.commandBuffer = this.commands.allocate()).begin();
    const rows = kernels.config.rowsPerWorkgroup;
    const [gx, gy] = kernels.grid(Math.ceil(m.rows / rows));
    const pc = new DataView(new ArrayBuffer(48));
    const words = (values: number[]) => {
      values.forEach((v, i) => pc.setUint32(4 * i, v, true));
      return new Uint8Array(pc.buffer, 0, 4 * values.length);
    };
    const vec = (bytes: number) => bytes / 16;
    const wordsOf = (bytes: number) => bytes / 4;

    if (path === "float" && matrices.length === 1) {
      const p = kernels.pipeline(GEMV[m.format], f16, m.groupSize);
      const d = matrices[0]!;
      const set = this.descriptors.allocate(p, [{ buffer: d.buffer }, { buffer: d.buffer }, { buffer: this.x }, { buffer: this.y }]);
      cb.bind(p, set).pushConstants(p, words([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, vec(d.weightOffset), wordsOf(d.scaleOffset), 0, 0])).dispatch(gx, gy);
    } else if (path === "float") {
      const p = kernels.pipeline(GATEUP[m.format], f16, m.groupSize);
      const [g, u] = matrices as [DeviceMatrix, DeviceMatrix];
      const set = this.descriptors.allocate(p, [{ buffer: g.buffer }, { buffer: g.buffer }, { buffer: u.buffer }, { buffer: u.buffer }, { buffer: this.x }, { buffer: this.y }]);
      words([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, vec(g.weightOffset), wordsOf(g.scaleOffset), vec(u.weightOffset), wordsOf(u.scaleOffset), 0, 0]);
      pc.setFloat32(44, options.limit ?? 0, true);
      cb.bind(p, set).pushConstants(p, new Uint8Array(pc.buffer, 0, 48)).dispatch(gx, gy);
    } else {
      const xqRowWords = Math.ceil(m.cols / 16) * 4;
      const xq = new Buffer(device, { size: BigInt(4 * S * xqRowWords), memory: "device", priority: 1 });
      const xscale = new Buffer(device, { size: BigInt(4 * S * m.groupsPerRow), memory: "device", priority: 1 });
      const xsum = new Buffer(device, { size: BigInt(4 * S * m.groupsPerRow), memory: "device", priority: 1 });
      this.scratch.push(xq, xscale, xsum);
      const qp = kernels.pipeline(QUANTIZE_ACT, false, m.groupSize);
      const qset = this.descriptors.allocate(qp, [{ buffer: this.x }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }]);
      const threads = S * m.groupsPerRow * (m.groupSize / 4);
      const [qx, qy] = kernels.grid(Math.ceil(threads / kernels.config.workgroupSize));
      cb.fillBuffer(xq, 0).barrier("transferToCompute");
      cb.bind(qp, qset).pushConstants(qp, words([m.cols, S, m.groupsPerRow, 0, xqRowWords])).dispatch(qx, qy).barrier("computeToCompute");
      const p = kernels.pipeline(GEMV_IDP[m.format], f16, m.groupSize);
      const d = matrices[0]!;
      const set = this.descriptors.allocate(p, [{ buffer: d.buffer }, { buffer: d.buffer }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }, { buffer: this.y }]);
      cb.bind(p, set).pushConstants(p, words([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, vec(d.weightOffset), wordsOf(d.scaleOffset), xqRowWords, 0])).dispatch(gx, gy);
    }
    cb.barrier("computeToHost").end();
    this.fence = new Fence(device);
    this.submission = new Submission(device, [cb], { fence: this.fence });
  }

  /** Writes x (S*I floats), runs, checks the sentinels, returns a copy of y (S*O floats). */
  run(x: Float32Array): Float32Array {
    if (x.length !== this.S * this.I) throw new InvalidArgumentError(`x has ${x.length} floats, expected S*I = ${this.S * this.I}`);
    new Float32Array(this.x.host()).set(x);
    this.submission.submit();
    if (!this.fence.wait()) throw new Error("GEMV timed out");
    this.fence.reset();
    const out = new Float32Array(this.y.host(), 0, this.S * this.O).slice();
    const tail = new Uint32Array(this.y.host(), 4 * this.S * this.O, SENTINEL_WORDS);
    const bad = tail.findIndex((w) => w !== SENTINEL);
    if (bad >= 0) throw new OutOfBoundsWriteError(`output sentinel word ${bad} past the end was overwritten (0x${tail[bad]!.toString(16)})`);
    return out;
  }

  /** Reads the integer-dot path's quantized activations back (for bit-exact checks). */
  scratchBuffers(): Buffer[] {
    return this.scratch;
  }

  [Symbol.dispose](): void {
    // A run that timed out may still be executing: never free what the GPU may be using.
    this.kernels.device.waitIdle();
    this.submission[Symbol.dispose]();
    this.fence[Symbol.dispose]();
    this.commands[Symbol.dispose]();
    this.descriptors[Symbol.dispose]();
    for (const b of this.scratch) b[Symbol.dispose]();
    this.y[Symbol.dispose]();
    this.x[Symbol.dispose]();
  }
}
