/**
 * Dense matrix products of a prompt chunk on q4/q8 weights (shaders/dec_gemm_quant.comp): tiles of
 * 32 rows x 64 tokens, the weights dequantized into shared memory once for all the chunk's tokens.
 * The decode graph uses it for calls of more than a few tokens, where the GEMV kernels (one weight
 * load per few tokens) spend most of a prompt chunk's time; decode keeps the GEMVs.
 *
 * A matrix of few rows (o_proj: 2048 rows, 64 tiles a chunk) would leave most of a GPU's cores idle:
 * given a GemmSplitScratch its tiles' columns are split over several workgroups (gemmSplits), the
 * last of a tile's workgroups adding the partials in split order (shaders/dec_gemm_quant.comp). The
 * GGML GEMMs (ggml-gemm.ts) split the same way, their runs whole blocks, over the same scratch.
 * With matrixCores both take the matrix-core tiles instead (64 rows, gemm_coopmat_tile.glsl).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { QuantFormat } from "../../quant/types.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { uploadBytes } from "../../vk/transfer.ts";
import type { DeviceMatrix } from "../gemv.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import type { QuantGemvArgs } from "./quant-gemv.ts";

/** weights `uint[]`, scales `uint[]` (the same DeviceMatrix buffer), x, y, partial tiles, arrival words; push as the GEMV's + splits, splitCols: 44 B. */
export const DEC_GEMM_QUANT: ShaderInterface = { name: "dec_gemm_quant", storageBuffers: 6, pushConstantBytes: 44 };
/** The same on the matrix cores (shaders/dec_gemm_quant_cm.comp, gemm_coopmat_tile.glsl): bindings and push constants as dec_gemm_quant's. */
export const DEC_GEMM_QUANT_CM: ShaderInterface = { ...DEC_GEMM_QUANT, name: "dec_gemm_quant_cm" };
/** Its test variant: the same tiles with plain sums in place of the matrix products (dec_gemm_quant_cm_emu.comp). */
export const DEC_GEMM_QUANT_CM_EMU: ShaderInterface = { ...DEC_GEMM_QUANT, name: "dec_gemm_quant_cm_emu" };
/** Rows and tokens of one workgroup's tile. */
export const GEMM_ROWS = 32;
export const GEMM_TOKENS = 64;
/** Rows of the matrix-core GEMMs' tile (tokens: GEMM_TOKENS). */
export const COOPMAT_GEMM_ROWS = 64;

export interface ChunkGemmOptions extends DecoderKernelOptions {
  /**
   * true: on the matrix cores (the device's cooperativeMatrix feature): 64-row tiles, weights and x
   * rounded to f16 for the products, f32 sums. "emulated" (tests): the same tiles and f16 rounding with
   * plain sums in place of the matrix products, on any device with shaderFloat16 and the Vulkan memory
   * model. Default false: the f32 tiles.
   */
  matrixCores?: boolean | "emulated";
}

/**
 * A matrix-core kernel's shader for this device: `cm` (NAME_cm, its VK_NV_cooperative_matrix build, or
 * NAME_cmk, the KHR rewrite) where cooperative matrices are enabled, or its test variant `emulated`
 * (plain sums) on any device with shaderFloat16 and the Vulkan memory model.
 */
export function matrixCoreShader(device: Device, shaders: { cm: ShaderInterface; emulated: ShaderInterface }, matrixCores: true | "emulated"): ShaderInterface {
  if (matrixCores === "emulated") {
    if (!device.enabled.shaderFloat16 || !device.enabled.vulkanMemoryModel) throw new InvalidArgumentError(`the emulated matrix-core GEMM needs shaderFloat16 and vulkanMemoryModel, not enabled on ${device.info.name}`);
    return shaders.emulated;
  }
  if (!device.enabled.cooperativeMatrix) throw new InvalidArgumentError(`the matrix-core GEMM needs VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix, not enabled on ${device.info.name}`);
  // on VK_KHR_cooperative_matrix: NAME_cmk.spv, the shader build's KHR rewrite of NAME_cm.spv
  return device.enabled.cooperativeMatrixExtension === "khr" ? { ...shaders.cm, name: `${shaders.cm.name}k` } : shaders.cm;
}

/** The shader and tile rows of a chunk GEMM (f32 tiles, the matrix cores' or their emulation), checked against the device's features. */
export function chunkGemmTile(
  device: Device, shaders: { f32: ShaderInterface; cm: ShaderInterface; emulated: ShaderInterface }, matrixCores: boolean | "emulated" | undefined,
): { shader: ShaderInterface; tileRows: number } {
  if (!matrixCores) return { shader: shaders.f32, tileRows: GEMM_ROWS };
  return { shader: matrixCoreShader(device, shaders, matrixCores), tileRows: COOPMAT_GEMM_ROWS };
}

/** cm_slice_tile.glsl's shared memory at `tokens` a tile (the experts' matrix-core kernels): two weight tiles (128 rows of 80 B) or the f32 C tile, two x tiles, a word. */
export function cmTileSharedBytes(tokens: number): number {
  return Math.max(2 * 128 * 80, tokens * 128 * 4) + 2 * tokens * 80 + 16;
}

/** Workgroups a split call aims at (a few per core on a large GPU), and the fewest columns a split run takes. */
const SPLIT_TARGET_WORKGROUPS = 256;
const SPLIT_MIN_COLS = 512;

/**
 * Column runs for a chunk GEMM of `rows` x `cols` (one token tile of tiles of `tileRows` rows): enough for about
 * SPLIT_TARGET_WORKGROUPS workgroups, each run at least SPLIT_MIN_COLS columns; 1 on a CPU device
 * (its cores are few: the tiles already fill them) and for matrices with tiles enough.
 */
export function gemmSplits(device: Device, rows: number, cols: number, tileRows = GEMM_ROWS): number {
  if (device.info.type === 4) return 1;
  const tiles = Math.ceil(rows / tileRows);
  return Math.max(1, Math.min(Math.ceil(SPLIT_TARGET_WORKGROUPS / tiles), Math.floor(cols / SPLIT_MIN_COLS)));
}

/**
 * Columns a run takes for `splits` runs over `cols` (a multiple of `blockCols`: dec_gemm_quant's
 * 32-column step, or a GGML type's block), and the runs that leaves (fewer where runs round up).
 */
export function splitRuns(cols: number, splits: number, blockCols = 32): { splitCols: number; splits: number } {
  const splitCols = Math.ceil(cols / splits / blockCols) * blockCols;
  return { splitCols, splits: Math.ceil(cols / splitCols) };
}

/**
 * One matrix's split-call scratch: partial tiles [tile][split][32 x 64] (or [64 x 64] for the
 * matrix-core GEMMs: room for either) and a word per tile (zero between calls: the last workgroup
 * of a tile resets it). `blockCols`: what a run's columns are a
 * multiple of (splitRuns); the runs may come out fewer than asked, but at least 2.
 */
export class GemmSplitScratch implements Disposable {
  readonly part: Buffer;
  readonly arrived: Buffer;
  readonly splits: number;
  readonly splitCols: number;

  constructor(device: Device, readonly rows: number, readonly cols: number, readonly maxTokens: number, splits: number, readonly blockCols = 32) {
    if (!Number.isInteger(splits) || splits < 2) throw new InvalidArgumentError(`a split scratch needs 2 or more splits, got ${splits}`);
    ({ splits: this.splits, splitCols: this.splitCols } = splitRuns(cols, splits, blockCols));
    if (this.splits < 2) throw new InvalidArgumentError(`${cols} columns in runs of whole ${blockCols}-column blocks leave 1 run for ${splits} splits`);
    // 32-row tiles of rows rounded up to 64: the matrix-core GEMM's 64-row tiles fit too
    const tiles = 2 * Math.ceil(rows / COOPMAT_GEMM_ROWS) * Math.ceil(maxTokens / GEMM_TOKENS);
    this.part = new Buffer(device, { size: BigInt(4 * tiles * this.splits * GEMM_ROWS * GEMM_TOKENS), memory: "device" });
    try {
      this.arrived = new Buffer(device, { size: BigInt(Math.max(16, 4 * tiles)), memory: "device" });
      uploadBytes(device, this.arrived, 0n, new Uint8Array(Number(this.arrived.size)));
    } catch (e) {
      this.part[Symbol.dispose]();
      throw e;
    }
  }

  [Symbol.dispose](): void {
    this.part[Symbol.dispose]();
    this.arrived[Symbol.dispose]();
  }
}

/** One pipeline per (format, scale type, group size), as QuantGemvKernel; f32 tiles or the matrix cores' (options.matrixCores). */
export class QuantGemmKernel extends DecoderKernel {
  /** Rows of one workgroup's tile. */
  readonly tileRows: number;

  constructor(device: Device, readonly format: QuantFormat, readonly scaleF16: boolean, readonly groupSize: number, options: ChunkGemmOptions = {}) {
    if (![32, 64, 128].includes(groupSize)) throw new InvalidArgumentError(`groupSize must be 32, 64 or 128, got ${groupSize}`);
    const { shader, tileRows } = chunkGemmTile(device, { f32: DEC_GEMM_QUANT, cm: DEC_GEMM_QUANT_CM, emulated: DEC_GEMM_QUANT_CM_EMU }, options.matrixCores);
    super(device, shader, { 0: format === "q4" ? 4 : 8, 1: scaleF16 ? 1 : 0, 2: groupSize }, options);
    this.tileRows = tileRows;
  }

  /**
   * Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ, split over the columns with `split` (the
   * matrix's own: calls on one scratch must not overlap). The caller places barriers around it.
   */
  record(cb: CommandBuffer, a: QuantGemvArgs, split?: GemmSplitScratch): CommandBuffer {
    const m = a.matrix.matrix, S = a.S;
    const [gx, gy] = checkQuantGemmCall(this, a.matrix, S, split);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    checkRange("quant gemm x", a.x, xOffset, S * m.cols);
    checkRange("quant gemm y", a.y, yOffset, S * m.rows);
    const d: DeviceMatrix = a.matrix;
    // without a split the partials' bindings are y (never read: splits is 1)
    const set = this.setFor([d.buffer, d.buffer, a.x, a.y, split?.part ?? a.y, split?.arrived ?? a.y]);
    const splits = split?.splits ?? 1, splitCols = split?.splitCols ?? Math.ceil(m.cols / 32) * 32;
    const pc = pushWords([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, d.weightOffset / 16, d.scaleOffset / 4, xOffset, yOffset, splits, splitCols]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy, splits);
  }
}

/**
 * The checks a q4/q8 prompt-chunk GEMM call shares (QuantGemmKernel, QuantGemmIdpKernel): the
 * matrix's kind against the kernel's, S, the split scratch's shape, the grid. Returns the grid's x, y.
 */
export function checkQuantGemmCall(
  kernel: { device: Device; format: QuantFormat; scaleF16: boolean; groupSize: number; tileRows?: number }, d: DeviceMatrix, S: number, split: GemmSplitScratch | undefined,
): [number, number] {
  const m = d.matrix;
  if (m.format !== kernel.format || (m.scaleType === "f16") !== kernel.scaleF16 || m.groupSize !== kernel.groupSize) {
    throw new InvalidArgumentError(`a ${m.format}/${m.scaleType}/${m.groupSize} matrix on a ${kernel.format}/${kernel.scaleF16 ? "f16" : "f32"}/${kernel.groupSize} kernel`);
  }
  if (!Number.isInteger(S) || S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${S}`);
  if (split && (split.rows !== m.rows || split.cols !== m.cols || split.maxTokens < S)) {
    throw new InvalidArgumentError(`a split scratch of ${split.rows} x ${split.cols} for ${split.maxTokens} tokens on a ${m.rows} x ${m.cols} call of ${S}`);
  }
  const gx = Math.ceil(m.rows / (kernel.tileRows ?? GEMM_ROWS)), gy = Math.ceil(S / GEMM_TOKENS);
  const maxX = kernel.device.info.limits.maxComputeWorkGroupCount[0]!;
  if (gx > maxX) throw new InvalidArgumentError(`${m.rows} rows need ${gx} workgroups, past maxComputeWorkGroupCount[0] (${maxX})`);
  return [gx, gy];
}
