/** RMSNorm of rows on the GPU (shaders/dec_rmsnorm.comp), optionally with the residual add fused in. */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** x rw, add r, w r, y w, add2 r, gate r; push R, n, xOffset, xStride, addOffset, wOffset, yOffset, yStride, eps (f32), flags, gateOffset: 44 B. */
export const DEC_RMSNORM: ShaderInterface = { name: "dec_rmsnorm", storageBuffers: 6, pushConstantBytes: 44 };
export const RMSNORM_MAX_N = 8192;

export interface RmsNormArgs {
  /** Input rows (updated in place to x + add when `add` is given). */
  x: Buffer;
  /** Weights of n floats at wOffset. */
  w: Buffer;
  /** Output rows; may be x (in place). */
  y: Buffer;
  /** Residual: x[r] += add[r] first (same row stride as x). */
  add?: Buffer;
  /**
   * With `add`: Qwen3.5's gated shared expert as well, x[r] += add[r] + sigmoid(gate[gateOffset + r]) * x2[r]
   * (x2 laid out as add; dec_gating's scaled add folded in).
   */
  scaledAdd?: { x: Buffer; gate: Buffer; gateOffset?: number };
  rows: number;
  n: number;
  eps: number;
  /** Element offsets and row strides (default: 0 and n). */
  xOffset?: number;
  xStride?: number;
  addOffset?: number;
  wOffset?: number;
  yOffset?: number;
  yStride?: number;
}

/** flags: bit 0 the residual, bit 1 the scaled second add. */
const normFlags = (a: RmsNormArgs) => (a.add ? 1 : 0) | (a.scaledAdd ? 2 : 0);

/** Checks the scaled add's buffers (laid out as add; one gate a row) and returns it with its offset. */
function checkScaledAdd(a: RmsNormArgs, R: number, xStride: number, n: number): { x: Buffer; gate: Buffer; gateOffset: number } | undefined {
  const sa = a.scaledAdd;
  if (!sa) return undefined;
  if (!a.add) throw new InvalidArgumentError("a scaled add needs the residual add");
  const gateOffset = sa.gateOffset ?? 0;
  checkRange("rmsnorm scaled add", sa.x, a.addOffset ?? 0, (R - 1) * xStride + n);
  checkRange("rmsnorm gate", sa.gate, gateOffset, R);
  return { x: sa.x, gate: sa.gate, gateOffset };
}

export interface RmsNormKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup (one row each): a power of two, default 256. */
  workgroupSize?: number;
  /** Reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

export class RmsNormKernel extends DecoderKernel {
  readonly workgroupSize: number;

  constructor(device: Device, options: RmsNormKernelOptions = {}) {
    const wg = options.workgroupSize ?? 256;
    if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_RMSNORM, { 0: wg, 2: sub ? 1 : 0 }, options);
    this.workgroupSize = wg;
  }

  /** Records one dispatch (one workgroup per row). The caller places barriers around it. */
  record(cb: CommandBuffer, a: RmsNormArgs): CommandBuffer {
    const { rows: R, n } = a;
    if (!Number.isInteger(R) || R < 1) throw new InvalidArgumentError(`rows must be a positive integer, got ${R}`);
    if (!Number.isInteger(n) || n < 1 || n > RMSNORM_MAX_N) throw new InvalidArgumentError(`n must be an integer in 1..${RMSNORM_MAX_N}, got ${n}`);
    if (!(a.eps >= 0 && Number.isFinite(a.eps))) throw new InvalidArgumentError(`eps must be finite and >= 0, got ${a.eps}`);
    const xOffset = a.xOffset ?? 0, xStride = a.xStride ?? n, addOffset = a.addOffset ?? 0;
    const wOffset = a.wOffset ?? 0, yOffset = a.yOffset ?? 0, yStride = a.yStride ?? n;
    checkRange("rmsnorm x", a.x, xOffset, (R - 1) * xStride + n);
    if (a.add) checkRange("rmsnorm add", a.add, addOffset, (R - 1) * xStride + n);
    checkRange("rmsnorm w", a.w, wOffset, n);
    checkRange("rmsnorm y", a.y, yOffset, (R - 1) * yStride + n);
    const sa = checkScaledAdd(a, R, xStride, n);
    const set = this.setFor([a.x, a.add ?? a.x, a.w, a.y, sa?.x ?? a.x, sa?.gate ?? a.x]);
    const [gx, gy] = this.grid(R);
    const pc = pushWords([R, n, xOffset, xStride, addOffset, wOffset, yOffset, yStride, a.eps, normFlags(a), sa?.gateOffset ?? 0], [8]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}

/** dec_rmsnorm_quant: dec_rmsnorm's first four buffers, then xq, xscale, xsum, add2, gate; the same push constants. */
export const DEC_RMSNORM_QUANT: ShaderInterface = { name: "dec_rmsnorm_quant", storageBuffers: 9, pushConstantBytes: 44 };

/** Where dec_rmsnorm_quant writes its quantized output (GgmlIdpScratch's buffers and shape). */
export interface QuantizedRows {
  xq: Buffer;
  xscale: Buffer;
  xsum: Buffer;
  /** Row length the buffers were sized for (must equal the norm's n). */
  cols: number;
  /** Rows they hold at most. */
  maxTokens: number;
}

/**
 * RMSNorm that also writes its rows quantized for the integer-dot GGML GEMVs (groups of 16, as
 * quantize_act): the GEMVs reading the norm then skip their own quantize dispatch and its barrier.
 */
export class RmsNormQuantKernel extends DecoderKernel {
  static readonly GROUP = 16;
  readonly workgroupSize: number;

  constructor(device: Device, options: RmsNormKernelOptions = {}) {
    const wg = options.workgroupSize ?? 128;
    if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_RMSNORM_QUANT, { 0: wg, 2: sub ? 1 : 0 }, options);
    this.workgroupSize = wg;
  }

  /** Whether `a`'s offsets and strides are multiples of 4 floats (the kernel reads vec4s). */
  static aligned(a: RmsNormArgs): boolean {
    return [a.xOffset ?? 0, a.xStride ?? a.n, a.addOffset ?? 0, a.wOffset ?? 0, a.yOffset ?? 0, a.yStride ?? a.n].every((v) => v % 4 === 0);
  }

  /** Records one dispatch (one workgroup per row). The caller places barriers around it. */
  record(cb: CommandBuffer, a: RmsNormArgs, out: QuantizedRows): CommandBuffer {
    const { rows: R, n } = a;
    if (!Number.isInteger(R) || R < 1) throw new InvalidArgumentError(`rows must be a positive integer, got ${R}`);
    if (!Number.isInteger(n) || n < 1 || n > RMSNORM_MAX_N || n % RmsNormQuantKernel.GROUP !== 0) {
      throw new InvalidArgumentError(`n must be a multiple of ${RmsNormQuantKernel.GROUP} in 1..${RMSNORM_MAX_N}, got ${n}`);
    }
    if (out.cols !== n || out.maxTokens < R) throw new InvalidArgumentError(`quantized rows of ${out.maxTokens} x ${out.cols} for ${R} rows of ${n}`);
    if (!(a.eps >= 0 && Number.isFinite(a.eps))) throw new InvalidArgumentError(`eps must be finite and >= 0, got ${a.eps}`);
    const xOffset = a.xOffset ?? 0, xStride = a.xStride ?? n, addOffset = a.addOffset ?? 0;
    const wOffset = a.wOffset ?? 0, yOffset = a.yOffset ?? 0, yStride = a.yStride ?? n;
    if (!RmsNormQuantKernel.aligned(a)) throw new InvalidArgumentError("the quantizing RMSNorm reads vec4s: offsets and strides must be multiples of 4 floats");
    checkRange("rmsnorm x", a.x, xOffset, (R - 1) * xStride + n);
    if (a.add) checkRange("rmsnorm add", a.add, addOffset, (R - 1) * xStride + n);
    checkRange("rmsnorm w", a.w, wOffset, n);
    checkRange("rmsnorm y", a.y, yOffset, (R - 1) * yStride + n);
    const groups = (R * n) / RmsNormQuantKernel.GROUP;
    checkRange("rmsnorm xq", out.xq, 0, 4 * groups);
    checkRange("rmsnorm xscale", out.xscale, 0, groups);
    checkRange("rmsnorm xsum", out.xsum, 0, groups);
    const sa = checkScaledAdd(a, R, xStride, n);
    const set = this.setFor([a.x, a.add ?? a.x, a.w, a.y, out.xq, out.xscale, out.xsum, sa?.x ?? a.x, sa?.gate ?? a.x]);
    const [gx, gy] = this.grid(R);
    const pc = pushWords([R, n, xOffset, xStride, addOffset, wOffset, yOffset, yStride, a.eps, normFlags(a), sa?.gateOffset ?? 0], [8]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}
