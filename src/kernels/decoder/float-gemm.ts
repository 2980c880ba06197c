/**
 * Dense matrix products of a prompt chunk on float weights (the routers, shared_expert_gate):
 * y[s, o] = Σ_i W[o, i] x[s, i] for any S, W as GemvHalfKernel reads it (f16/bf16 packed two per
 * uint, odd cols included, or f32 one per uint), f32 sums, one dispatch. GemvHalfKernel takes at most
 * GEMV_HALF_MAX_S tokens a dispatch, so a 512-token chunk was 64 dispatches, each reading the whole
 * matrix. Two shapes:
 * - FloatGemmKernel (shaders/dec_gemm_float.comp), for matrices of fewer than FLOAT_GEMM_MAX_ROWS
 *   rows (the shared expert's 1-row gate): the tokens spread over S / 8 workgroups of 1..4 rows
 *   each (floatGemmShape);
 * - FloatGemmTileKernel (shaders/dec_gemm_float_tile.comp), for the others' long chunks: 32 x 32
 *   tiles, each workgroup's four thread groups taking a quarter of the columns.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { checkFloatWeights, type GemvHalfArgs } from "./gemv-half.ts";

/** weights `uint[]` r, x r, y w; push O, I, S, weightOffset (uints), xOffset, yOffset (floats), flags (dec_gemv_half's): 28 B. */
export const DEC_GEMM_FLOAT: ShaderInterface = { name: "dec_gemm_float", storageBuffers: 3, pushConstantBytes: 28 };
/** DeviceLinear's float matrices of fewer rows than this take the GEMM for calls past GEMV_HALF_MAX_S tokens. */
export const FLOAT_GEMM_MAX_ROWS = 32;
/** At most this many rows a workgroup, and its tokens a workgroup. */
export const FLOAT_GEMM_NARROW_MAX_ROWS = 4;
export const FLOAT_GEMM_NARROW_TOKENS = 8;

/** dec_gemm_float_tile: DEC_GEMM_FLOAT's bindings and push constants. */
export const DEC_GEMM_FLOAT_TILE: ShaderInterface = { ...DEC_GEMM_FLOAT, name: "dec_gemm_float_tile" };
/**
 * DeviceLinear's matrices of FLOAT_GEMM_MAX_ROWS rows or more take the tile for calls of this many
 * tokens or more, the GEMV's 8-token dispatches below (faster there: the tile's workgroups each walk
 * a quarter of the columns, about 62 µs at any S for a 256 x 2048 router on an H100, 2026-12-07).
 */
export const FLOAT_GEMM_TILE_FROM_TOKENS = 256;
/** The tile's rows and tokens. */
export const FLOAT_GEMM_TILE_ROWS = 32;
export const FLOAT_GEMM_TILE_TOKENS = 32;

/** As the GEMV's arguments, S any positive integer. */
export type FloatGemmArgs = GemvHalfArgs;

export interface FloatGemmKernelOptions extends DecoderKernelOptions {
  /** Rows a workgroup, 1..4 (default 4). */
  narrowRows?: number;
}

/** The rows a workgroup for a matrix of `rows` rows (FloatGemmKernelOptions.narrowRows): min(rows, 4). */
export function floatGemmShape(rows: number): number {
  return Math.min(Math.max(1, rows), FLOAT_GEMM_NARROW_MAX_ROWS);
}

/** The grid of a call: row blocks x token blocks, refused past the device's workgroup counts. */
function floatGrid(device: Device, rows: number, S: number, blockRows: number, blockTokens: number): [number, number] {
  const gx = Math.ceil(rows / blockRows);
  const gy = Math.ceil(S / blockTokens);
  const [maxX, maxY] = device.info.limits.maxComputeWorkGroupCount;
  if (gx > maxX!) throw new InvalidArgumentError(`${rows} rows need ${gx} workgroups, past maxComputeWorkGroupCount[0] (${maxX})`);
  if (gy > maxY!) throw new InvalidArgumentError(`${S} tokens need ${gy} workgroups, past maxComputeWorkGroupCount[1] (${maxY})`);
  return [gx, gy];
}

/** Checks a call's arguments and returns its push constants (both shapes take the same). */
function floatPush(a: FloatGemmArgs): Uint8Array {
  const { rows: O, cols: I, S } = a;
  if (!Number.isInteger(O) || O < 1) throw new InvalidArgumentError(`rows must be a positive integer, got ${O}`);
  if (!Number.isInteger(I) || I < 1) throw new InvalidArgumentError(`cols must be a positive integer, got ${I}`);
  if (!Number.isInteger(S) || S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${S}`);
  const weightOffset = a.weightOffset ?? 0, xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
  const flags = checkFloatWeights("float gemm", a.weights, a.dtype, weightOffset, O * I);
  // the shaders index x and y with 32-bit integers
  if (xOffset + S * I > 2 ** 32 - 1 || yOffset + S * O > 2 ** 32 - 1) throw new InvalidArgumentError(`x or y of ${S} tokens exceed 32-bit indexing`);
  checkRange("float gemm x", a.x, xOffset, S * I);
  checkRange("float gemm y", a.y, yOffset, S * O);
  return pushWords([O, I, S, weightOffset, xOffset, yOffset, flags]);
}

/** A prompt chunk's product on a float matrix: either shape (LinearKernels.floatGemmKernel picks it by rows). */
export interface FloatGemm {
  record(cb: CommandBuffer, a: FloatGemmArgs): CommandBuffer;
}

export class FloatGemmKernel extends DecoderKernel implements FloatGemm {
  /** Rows a workgroup, 1..4. */
  readonly narrowRows: number;

  constructor(device: Device, options: FloatGemmKernelOptions = {}) {
    const narrowRows = options.narrowRows ?? FLOAT_GEMM_NARROW_MAX_ROWS;
    if (!Number.isInteger(narrowRows) || narrowRows < 1 || narrowRows > FLOAT_GEMM_NARROW_MAX_ROWS) {
      throw new InvalidArgumentError(`narrowRows must be an integer in 1..${FLOAT_GEMM_NARROW_MAX_ROWS}, got ${narrowRows}`);
    }
    super(device, DEC_GEMM_FLOAT, { 0: narrowRows }, options);
    this.narrowRows = narrowRows;
  }

  /** The workgroup grid of a call: row blocks x token blocks, refused past the device's workgroup counts. */
  workgroups(rows: number, S: number): [number, number] {
    return floatGrid(this.device, rows, S, this.narrowRows, FLOAT_GEMM_NARROW_TOKENS);
  }

  /** Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ. The caller places barriers around it. */
  record(cb: CommandBuffer, a: FloatGemmArgs): CommandBuffer {
    const pc = floatPush(a);
    const [gx, gy] = this.workgroups(a.rows, a.S);
    const set = this.setFor([a.weights, a.x, a.y]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}

export class FloatGemmTileKernel extends DecoderKernel implements FloatGemm {
  constructor(device: Device, options: DecoderKernelOptions = {}) {
    super(device, DEC_GEMM_FLOAT_TILE, {}, options);
  }

  /** The workgroup grid of a call: 32-row x 32-token tiles, refused past the device's workgroup counts. */
  workgroups(rows: number, S: number): [number, number] {
    return floatGrid(this.device, rows, S, FLOAT_GEMM_TILE_ROWS, FLOAT_GEMM_TILE_TOKENS);
  }

  /** Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ. The caller places barriers around it. */
  record(cb: CommandBuffer, a: FloatGemmArgs): CommandBuffer {
    const pc = floatPush(a);
    const [gx, gy] = this.workgroups(a.rows, a.S);
    const set = this.setFor([a.weights, a.x, a.y]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}
