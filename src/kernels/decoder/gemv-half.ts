/**
 * Dense GEMV with f16, bf16 or f32 weights on the GPU (shaders/dec_gemv_half.comp): y[s, o] =
 * Σ_i W[o, i] x[s, i] for S = 1..8 tokens, W row-major [rows][cols] of 16-bit floats packed two
 * per uint (the float GGUF / safetensors tensor as it is, odd cols included) or of f32 (one per
 * uint, used as they are: float checkpoints run without rounding their weights), f32 accumulation.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** weights `uint[]` r, x r, y w; push O, I, S, weightOffset (uints), xOffset, yOffset (floats), flags (bit 0 bf16, bit 1 f32): 28 B. */
export const DEC_GEMV_HALF: ShaderInterface = { name: "dec_gemv_half", storageBuffers: 3, pushConstantBytes: 28 };
export const GEMV_HALF_MAX_S = 8;

export type HalfDType = "f16" | "bf16";
/** What the weights are: 16-bit floats (two per uint) or f32 (one per uint). */
export type GemvWeightDType = HalfDType | "f32";

export interface GemvHalfArgs {
  /**
   * rows x cols weights from uint `weightOffset`: 16-bit floats (element 2j of the flat array in
   * the low half) or f32 (one per uint).
   */
  weights: Buffer;
  /** S rows of cols floats from xOffset. */
  x: Buffer;
  /** S rows of `rows` floats from yOffset. */
  y: Buffer;
  rows: number;
  cols: number;
  S: number;
  dtype: GemvWeightDType;
  /**
   * In uints: pairs of halves for f16/bf16 (a multiple of 4 with cols % 8 == 0 gets 16-byte weight
   * loads), f32 elements for f32 (a multiple of 4 with cols % 4 == 0 gets 16-byte weight loads).
   */
  weightOffset?: number;
  /** In floats; a multiple of 4 with cols % 4 == 0 gets vec4 x loads. */
  xOffset?: number;
  yOffset?: number;
}

export interface GemvHalfKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup, a power of two (default 128). */
  workgroupSize?: number;
  /** Rows per workgroup (default 4). */
  rowsPerWorkgroup?: number;
  /** Reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

/**
 * A float matrix of `elements` weights at uint weightOffset checked as gemv_half.glsl reads it
 * (GemvHalfKernel's, and RouterRouteKernel's router), `what` naming the kernel; its dtype flags word.
 */
export function checkFloatWeights(what: string, weights: Buffer, dtype: GemvWeightDType, weightOffset: number, elements: number): number {
  if (dtype !== "f16" && dtype !== "bf16" && dtype !== "f32") throw new InvalidArgumentError(`dtype must be "f16", "bf16" or "f32", got ${String(dtype)}`);
  if (!Number.isInteger(weightOffset) || weightOffset < 0) throw new InvalidArgumentError(`weightOffset must be a non-negative integer, got ${weightOffset}`);
  if (dtype === "f32") {
    // f32: the shader indexes uints (one element each): weightOffset + O * I must stay below 2^32
    if (weightOffset + elements + 8 > 2 ** 32) throw new InvalidArgumentError(`weights: ${elements} f32 at uint ${weightOffset} exceed 32-bit indexing`);
    checkRange(`${what} weights`, weights, weightOffset, elements);
  } else {
    // the shader indexes halves with 32-bit integers: 2 * weightOffset + O * I must stay below 2^32
    if (2 * weightOffset + elements + 8 > 2 ** 32) throw new InvalidArgumentError(`weights: ${elements} halves at uint ${weightOffset} exceed 32-bit half indexing`);
    checkRange(`${what} weights`, weights, weightOffset, Math.ceil(elements / 2));
  }
  return dtype === "f32" ? 2 : dtype === "bf16" ? 1 : 0;
}

export class GemvHalfKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly rowsPerWorkgroup: number;

  constructor(device: Device, options: GemvHalfKernelOptions = {}) {
    const wg = options.workgroupSize ?? 128;
    if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
    const rpw = options.rowsPerWorkgroup ?? 4;
    if (!Number.isInteger(rpw) || rpw < 1 || rpw > 16) throw new InvalidArgumentError(`rowsPerWorkgroup must be an integer in 1..16, got ${rpw}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_GEMV_HALF, { 0: wg, 1: rpw, 2: sub ? 1 : 0 }, options);
    this.workgroupSize = wg;
    this.rowsPerWorkgroup = rpw;
  }

  /** Records one dispatch of ceil(rows / rowsPerWorkgroup) workgroups (split over y past the x limit). The caller places barriers around it. */
  record(cb: CommandBuffer, a: GemvHalfArgs): CommandBuffer {
    const { rows: O, cols: I, S } = a;
    if (!Number.isInteger(O) || O < 1) throw new InvalidArgumentError(`rows must be a positive integer, got ${O}`);
    if (!Number.isInteger(I) || I < 1) throw new InvalidArgumentError(`cols must be a positive integer, got ${I}`);
    if (!Number.isInteger(S) || S < 1 || S > GEMV_HALF_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${GEMV_HALF_MAX_S}, got ${S}`);
    const weightOffset = a.weightOffset ?? 0, xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    const flags = checkFloatWeights("gemv-half", a.weights, a.dtype, weightOffset, O * I);
    checkRange("gemv-half x", a.x, xOffset, S * I);
    checkRange("gemv-half y", a.y, yOffset, S * O);
    const set = this.setFor([a.weights, a.x, a.y]);
    const [gx, gy] = this.grid(Math.ceil(O / this.rowsPerWorkgroup));
    const pc = pushWords([O, I, S, weightOffset, xOffset, yOffset, flags]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}
