/**
 * Dense matrix products of a prompt chunk straight from GGML block tensors (Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K) on the GPU (shaders/dec_gemm_ggml.comp): tiles of 32 rows x 64 tokens walking the row
 * one 32-weight slice at a time, each slice dequantized into shared memory (GGML's weights bit for
 * bit, ggml_blocks.glsl) once for all the tile's tokens. What QuantGemmKernel is to the q4/q8 GEMVs,
 * this is to GgmlGemvKernel: that one re-reads and re-forms every weight per few tokens.
 *
 * The integer-dot path (GgmlGemmIdpKernel, shaders/dec_gemm_ggml_idp.comp): the same tiles over x
 * quantized by quantize_act in groups of 16 (GgmlQuantizeKernel), the slice's quant bytes dotted with
 * it 4 x 8 bits at a time and the scales and mins applied in f32 per 16-column run, as
 * GgmlGemvIdpKernel does per row. Only where the integer-dot decision (idp-policy.ts) is on.
 *
 * Both take an optional GemmSplitScratch (quant-gemm.ts, runs of whole blocks): a matrix of few rows
 * then has each tile's row split over several workgroups, the last of a tile's adding the partials in
 * split order (shaders/gemm_split.glsl), as QuantGemmKernel does.
 */
import { InvalidArgumentError } from "../../errors.ts";
import { GGML_BLOCK_LAYOUTS, GGML_BLOCK_TYPES, type GgmlBlockType } from "../../quant/ggml-blocks.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { DEC_GEMM_GGML_IDP, type ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { GGML_IDP_GROUP, GgmlIdpScratch, GgmlQuantizeKernel, type DeviceGgmlMatrix, type GgmlGemvArgs, type QuantizedRows } from "./ggml-gemv.ts";
import { chunkGemmTile, GEMM_ROWS, GEMM_TOKENS, type ChunkGemmOptions, type GemmSplitScratch } from "./quant-gemm.ts";

/**
 * blocks `uint[]` r, x r, y w, partial tiles rw, arrival words rw; push O, I, S, blockOffset (bytes),
 * xOffset, yOffset (floats), splits, splitCols: 32 B.
 */
export const DEC_GEMM_GGML: ShaderInterface = { name: "dec_gemm_ggml", storageBuffers: 5, pushConstantBytes: 32 };
/** The same on the matrix cores (shaders/dec_gemm_ggml_cm.comp): bindings and push constants as dec_gemm_ggml's. */
export const DEC_GEMM_GGML_CM: ShaderInterface = { ...DEC_GEMM_GGML, name: "dec_gemm_ggml_cm" };
/** Its test variant (dec_gemm_ggml_cm_emu.comp), as DEC_GEMM_QUANT_CM_EMU. */
export const DEC_GEMM_GGML_CM_EMU: ShaderInterface = { ...DEC_GEMM_GGML, name: "dec_gemm_ggml_cm_emu" };
/** Rows and tokens of one workgroup's tile (dec_gemm_quant's: GemmSplitScratch's tiles fit both). */
export const GGML_GEMM_ROWS = GEMM_ROWS;
export const GGML_GEMM_TOKENS = GEMM_TOKENS;

/** ggml_blocks.glsl's GGML_FMT_* (specialization constant 0), as dec_gemv_ggml's FORMAT. */
export const GGML_FORMAT_ID: Readonly<Record<GgmlBlockType, number>> = { Q4_1: 0, Q5_0: 1, Q5_1: 2, Q4_K: 3, Q5_K: 4, Q6_K: 5 };

/** The arguments of GgmlGemvKernel.record, for any S >= 1 (one dispatch: ceil(S / 64) token tiles). */
export type GgmlGemmArgs = GgmlGemvArgs;

function checkGemmArgs(kernelType: GgmlBlockType, m: DeviceGgmlMatrix, S: number): void {
  if (m.type !== kernelType) throw new InvalidArgumentError(`a ${m.type} matrix on a ${kernelType} kernel`);
  if (!Number.isInteger(S) || S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${S}`);
}

/** A split scratch fits the call: the matrix's shape, S tokens, runs of whole blocks. */
function checkSplit(m: DeviceGgmlMatrix, S: number, split: GemmSplitScratch | undefined): void {
  if (!split) return;
  if (split.rows !== m.rows || split.cols !== m.cols || split.maxTokens < S) {
    throw new InvalidArgumentError(`a split scratch of ${split.rows} x ${split.cols} for ${split.maxTokens} tokens on a ${m.rows} x ${m.cols} call of ${S}`);
  }
  const block = GGML_BLOCK_LAYOUTS[m.type].blockElements;
  if (split.splitCols % block !== 0) throw new InvalidArgumentError(`split runs of ${split.splitCols} columns: not whole ${m.type} blocks of ${block}`);
}

/** The GEMMs' grid: ceil(rows / tileRows) x ceil(S / 64) tiles x the split's runs, refused past the device's workgroup counts. */
function gemmGrid(device: Device, m: DeviceGgmlMatrix, S: number, split: GemmSplitScratch | undefined, tileRows = GGML_GEMM_ROWS): [number, number, number] {
  const gx = Math.ceil(m.rows / tileRows), gy = Math.ceil(S / GGML_GEMM_TOKENS), gz = split?.splits ?? 1;
  const [maxX, maxY, maxZ] = device.info.limits.maxComputeWorkGroupCount;
  if (gx > maxX!) throw new InvalidArgumentError(`${m.rows} rows need ${gx} workgroups, past maxComputeWorkGroupCount[0] (${maxX})`);
  if (gy > maxY!) throw new InvalidArgumentError(`${S} tokens need ${gy} workgroups, past maxComputeWorkGroupCount[1] (${maxY})`);
  if (gz > maxZ!) throw new InvalidArgumentError(`${gz} split runs, past maxComputeWorkGroupCount[2] (${maxZ})`);
  return [gx, gy, gz];
}

/** The push constants' split words: the runs and their columns (one run of every column without a split). */
const splitWords = (m: DeviceGgmlMatrix, split: GemmSplitScratch | undefined) => [split?.splits ?? 1, split?.splitCols ?? m.cols];

/** One pipeline per GGML type (make one object per type): f32 tiles or the matrix cores' (options.matrixCores). */
export class GgmlGemmKernel extends DecoderKernel {
  /** Rows of one workgroup's tile. */
  readonly tileRows: number;

  constructor(device: Device, readonly type: GgmlBlockType, options: ChunkGemmOptions = {}) {
    if (!GGML_BLOCK_TYPES.includes(type)) throw new InvalidArgumentError(`no GPU GEMM for GGML type ${String(type)}; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
    const { shader, tileRows } = chunkGemmTile(device, { f32: DEC_GEMM_GGML, cm: DEC_GEMM_GGML_CM, emulated: DEC_GEMM_GGML_CM_EMU }, options.matrixCores);
    super(device, shader, { 0: GGML_FORMAT_ID[type] }, options);
    this.tileRows = tileRows;
  }

  /**
   * Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ, grid ceil(rows / tileRows) x ceil(S / 64), split over
   * the columns with `split` (the matrix's own: calls on one scratch must not overlap). The caller
   * places barriers around it.
   */
  record(cb: CommandBuffer, a: GgmlGemmArgs, split?: GemmSplitScratch): CommandBuffer {
    const m = a.matrix, S = a.S;
    checkGemmArgs(this.type, m, S);
    checkSplit(m, S, split);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    if (xOffset % 4 !== 0) throw new InvalidArgumentError(`xOffset must be a multiple of 4 floats (vec4 loads), got ${xOffset}`);
    checkRange("ggml gemm x", a.x, xOffset, S * m.cols);
    checkRange("ggml gemm y", a.y, yOffset, S * m.rows);
    const grid = gemmGrid(this.device, m, S, split, this.tileRows);
    // without a split the partials' bindings are y (never read: splits is 1)
    const set = this.setFor([m.buffer, a.x, a.y, split?.part ?? a.y, split?.arrived ?? a.y]);
    const pc = pushWords([m.rows, m.cols, S, 0, xOffset, yOffset, ...splitWords(m, split)]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(...grid);
  }
}

export interface GgmlGemmIdpKernelOptions extends DecoderKernelOptions {
  /**
   * Slices (32 columns) a step between two barriers, 1..4 (default 1): more give the next step's loads
   * longer to arrive and fewer barriers, for 4.5 KiB of shared memory and ~18 registers a slice more.
   * The sums are the same, bit for bit (slices in the same order; the last step's surplus slices add zeros).
   */
  slicesPerStep?: number;
}

export interface GgmlGemmIdpArgs extends GgmlGemmArgs {
  /**
   * Where x is quantized: S rows of cols bytes, scales and sums of cols / 16 (a GgmlIdpScratch of the
   * matrix's cols and at least S tokens, or any buffers that large).
   */
  scratch: QuantizedRows;
}

/**
 * The integer-dot GEMM of one GGML type (make one object per type): record() quantizes x into the
 * scratch, places a compute barrier, then runs dec_gemm_ggml_idp; recordQuantized() runs the GEMM
 * alone over rows already quantized. Either splits over the columns with a GemmSplitScratch, as
 * GgmlGemmKernel. The device must have shaderIntegerDotProduct enabled, and the
 * caller must have the integer-dot decision on (the pipeline is created only then: some drivers crash
 * creating it, idp-policy.ts).
 */
export class GgmlGemmIdpKernel extends DecoderKernel {
  readonly slicesPerStep: number;
  private readonly quantize: GgmlQuantizeKernel;

  constructor(device: Device, readonly type: GgmlBlockType, options: GgmlGemmIdpKernelOptions = {}) {
    if (!GGML_BLOCK_TYPES.includes(type)) throw new InvalidArgumentError(`no GPU GEMM for GGML type ${String(type)}; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
    if (!device.enabled.integerDotProduct) throw new InvalidArgumentError(`the integer-dot GGML GEMM needs shaderIntegerDotProduct, not enabled on ${device.info.name}`);
    const step = options.slicesPerStep ?? 1;
    if (!Number.isInteger(step) || step < 1 || step > 4) throw new InvalidArgumentError(`slicesPerStep must be an integer in 1..4, got ${step}`);
    super(device, DEC_GEMM_GGML_IDP, { 0: GGML_FORMAT_ID[type], 1: step }, options);
    this.slicesPerStep = step;
    try {
      this.quantize = new GgmlQuantizeKernel(device, options);
    } catch (e) {
      super[Symbol.dispose]();
      throw e;
    }
  }

  /** Records quantize, a compute-to-compute barrier, and the GEMM. The caller places barriers around the whole. */
  record(cb: CommandBuffer, a: GgmlGemmIdpArgs, split?: GemmSplitScratch): CommandBuffer {
    const m = a.matrix, xOffset = a.xOffset ?? 0;
    this.checkArgs(a, split);
    checkRange("ggml idp gemm x", a.x, xOffset, a.S * m.cols);
    this.quantize.record(cb, a.x, xOffset, a.scratch, m.cols, a.S).barrier("computeToCompute");
    return this.recordQuantized(cb, a, split);
  }

  /**
   * Records the GEMM alone, over x as the scratch already holds it quantized (by quantize_act or
   * RmsNormQuantKernel, groups of 16); `a.x` is not read. The caller places the barrier after
   * whatever wrote the scratch.
   */
  recordQuantized(cb: CommandBuffer, a: Omit<GgmlGemmIdpArgs, "x" | "xOffset">, split?: GemmSplitScratch): CommandBuffer {
    const m = a.matrix, S = a.S, sc = a.scratch;
    this.checkArgs(a, split);
    const yOffset = a.yOffset ?? 0;
    checkRange("ggml idp gemm y", a.y, yOffset, S * m.rows);
    const grid = gemmGrid(this.device, m, S, split);
    // without a split the partials' bindings are y (never read: splits is 1)
    const set = this.setFor([m.buffer, sc.xq, sc.xscale, sc.xsum, a.y, split?.part ?? a.y, split?.arrived ?? a.y]);
    const pc = pushWords([m.rows, m.cols, S, 0, yOffset, ...splitWords(m, split)]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(...grid);
  }

  private checkArgs(a: Omit<GgmlGemmIdpArgs, "x" | "xOffset">, split: GemmSplitScratch | undefined): void {
    const m = a.matrix, S = a.S, sc = a.scratch;
    checkGemmArgs(this.type, m, S);
    checkSplit(m, S, split);
    if (sc instanceof GgmlIdpScratch && (sc.cols !== m.cols || sc.maxTokens < S)) throw new InvalidArgumentError(`a scratch of ${sc.maxTokens} tokens x ${sc.cols} columns for ${S} tokens x ${m.cols}`);
    const groups = (S * m.cols) / GGML_IDP_GROUP;
    checkRange("ggml idp gemm xq", sc.xq, 0, 4 * groups);
    checkRange("ggml idp gemm xscale", sc.xscale, 0, groups);
    checkRange("ggml idp gemm xsum", sc.xsum, 0, groups);
  }

  override [Symbol.dispose](): void {
    this.quantize[Symbol.dispose]();
    super[Symbol.dispose]();
  }
}
