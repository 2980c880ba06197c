/**
 * A decoder matrix in device memory with the kernel that multiplies by it: float weights
 * (f32/f16/bf16, the file's bytes as they are) through GemvHalfKernel, or for calls of more than
 * GEMV_HALF_MAX_S tokens of a matrix of few rows through FloatGemmKernel (one dispatch
 * for any S); q4/q8 QuantMatrix
 * through QuantGemvKernel, or for a prompt chunk of GEMM_FROM_TOKENS tokens or more through
 * QuantGemmKernel (tiles that read each weight once for the whole chunk); GGML block tensors
 * (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, the file's blocks as they are) through GgmlGemvKernel (64
 * tokens a dispatch), or where the integer-dot decision is on, for calls of up to
 * GGML_IDP_MAX_TOKENS tokens, GgmlGemvIdpKernel, and for prompt chunks of up to
 * GGML_IDP_GEMM_MAX_TOKENS, GgmlGemmIdpKernel (the same tiles over x quantized to int8); their
 * other calls of GEMM_FROM_TOKENS tokens or more go through GgmlGemmKernel (tiles that dequantize
 * each weight once for the whole chunk, one dispatch for any S; CPU devices too, see LinearKernels).
 * The GEMMs of matrices of few rows split their columns over several workgroups (gemmSplits), each
 * matrix with its own GemmSplitScratch.
 */
import { DeviceMatrix } from "../kernels/gemv.ts";
import { GEMV_HALF_MAX_S, GemvHalfKernel } from "../kernels/decoder/gemv-half.ts";
import { FLOAT_GEMM_MAX_ROWS, FLOAT_GEMM_TILE_FROM_TOKENS, FloatGemmKernel, floatGemmShape, FloatGemmTileKernel, type FloatGemm } from "../kernels/decoder/float-gemm.ts";
import { readConfig } from "../config.ts";
import { GgmlGemmIdpKernel, GgmlGemmKernel } from "../kernels/decoder/ggml-gemm.ts";
import { DeviceGgmlMatrix, GGML_GEMV_MAX_S, GgmlGemvIdpKernel, GgmlGemvKernel, GgmlIdpScratch } from "../kernels/decoder/ggml-gemv.ts";
import { planKernels } from "../kernels/setup.ts";
import { COOPMAT_GEMM_ROWS, GEMM_ROWS, GEMM_TOKENS, GemmSplitScratch, gemmSplits, QuantGemmKernel, splitRuns } from "../kernels/decoder/quant-gemm.ts";
import { QuantGemmIdpKernel } from "../kernels/decoder/quant-gemm-idp.ts";
import { GgmlGemmWideKernel, QuantGemmWideKernel, WIDE_GEMM_FROM_TOKENS, wideGemmPasses } from "../kernels/decoder/wide-gemm.ts";
import { matrixCoresPass } from "../kernels/decoder/coopmat-check.ts";
import { QuantGateUpKernel, QuantGemvKernel } from "../kernels/decoder/quant-gemv.ts";
import { FloatLinear, GgmlBlockLinear, QuantLinear, type Linear } from "../model/linear.ts";
import { GGML_BLOCK_LAYOUTS, type GgmlBlockType } from "../quant/ggml-blocks.ts";
import type { CommandBuffer } from "../vk/commands.ts";
import type { Device } from "../vk/device.ts";
import { Buffer } from "../vk/memory.ts";
import { uploadBytes } from "../vk/transfer.ts";
import { InvalidArgumentError } from "../errors.ts";
import { GraphUnsupportedError } from "./errors.ts";

/** Calls of this many tokens or more run q4/q8 matrices through the tiled GEMM instead of the GEMV. */
export const GEMM_FROM_TOKENS = 8;
/**
 * Matrices at least this many rows and columns take the matrix-core GEMM where it is on; smaller ones
 * keep the integer-dot / f32 GEMMs, which were faster there (H100, 2026-12-06, bench:gemm-pool, S = 64:
 * the shared expert's gate 2048 -> 512 rows 0.8-0.9x the f32 GEMM's speed on the matrix cores, its
 * down 512 -> 2048 columns 0.92-1.08x; qkv 2048 -> 8192 2.0-2.3x, out 4096 -> 2048 1.5x).
 */
export const MATRIX_CORE_MIN_DIM = 1024;

/**
 * Matrices of fewer rows than MATRIX_CORE_MIN_DIM but at least this many (and MATRIX_CORE_MIN_DIM
 * columns) take the wide tile too, for the calls it takes: k and v (512 rows) beside q, which ran the
 * integer-dot GEMM before (H100, 2026-12-07: a 512-token chunk's q/k/v 308.9 -> 196.7 µs a layer).
 */
export const WIDE_GEMM_MIN_ROWS = 256;

/** What takesWideTile decides from: the kernels' switches, the matrix's kind and shape, the call's tokens. */
export interface WideTileCase {
  /** LinearKernels.matrixCores. */
  matrixCores: boolean;
  /** LinearKernels.wideGemm. */
  wideGemm: boolean | "ggml";
  /** A matrix of GGML blocks (else q4/q8 groups). */
  ggml: boolean;
  rows: number;
  cols: number;
  S: number;
}

/** Whether a call of S tokens of a q4/q8 or GGML block matrix (the latter with LinearKernels.ggmlGemm) takes the wide tile. */
export function takesWideTile(c: WideTileCase): boolean {
  return c.matrixCores && c.rows >= WIDE_GEMM_MIN_ROWS && c.cols >= MATRIX_CORE_MIN_DIM && c.S >= WIDE_GEMM_FROM_TOKENS
    && (c.wideGemm === true || (c.wideGemm === "ggml" && c.ggml));
}

/**
 * GGML block matrices take the integer-dot path for calls of up to this many tokens (decode and small
 * batches, bandwidth-bound: the dot products cut the work per weight to a fraction of the float
 * path's). Each such matrix owns its quantized-x scratch (q, k and v are recorded back to back
 * without a barrier, so a shared one would race), of this many tokens where the integer-dot GEMM is
 * off; longer prompt chunks take the tiled GEMMs, which read a slice once per chunk of tokens.
 */
export const GGML_IDP_MAX_TOKENS = 8;

/** GGML matrices of at least this many rows (an lm_head) keep the GEMV kernel's default shape on a GPU (LinearKernels.ggmlOptions). */
export const GGML_GEMV_WIDE_ROWS = 65536;

export interface GgmlGemvShape {
  workgroupSize?: number;
  rowsPerWorkgroup?: number;
  tokensPerChunk?: number;
}

/** Which shape table a device takes: a CPU device (Lavapipe), an NVIDIA GPU (where the shapes were measured), any other GPU. */
export type GemvDeviceKind = "cpu" | "nvidia" | "other";

export function gemvDeviceKind(d: { type: number; vendorId: number }): GemvDeviceKind {
  return d.type === 4 ? "cpu" : d.vendorId === 0x10de ? "nvidia" : "other";
}

/**
 * The graphs' GGML GEMV shape for a call of S tokens of a matrix of `rows` rows (undefined fields:
 * the kernel's defaults, 32 x 4, 1 token a register chunk). Several tokens (a batch's decode step, a
 * short prompt chunk) take chunks of 2 or 4 tokens on a GPU: a slice is then unpacked once a chunk,
 * not once a token (measured with `bench:gemv --ggml --idp-alone --only S=`: README). Other GPUs
 * (not measured) take the chunks of 4 at the default shape.
 */
export function ggmlGemvShape(kind: GemvDeviceKind, rows: number, S = 1): GgmlGemvShape {
  if (kind === "cpu") return { workgroupSize: 8, rowsPerWorkgroup: 4, tokensPerChunk: 1 };
  const nvidiaNarrow = kind === "nvidia" && rows < GGML_GEMV_WIDE_ROWS;
  if (S === 2 && nvidiaNarrow) return { workgroupSize: 64, rowsPerWorkgroup: 2, tokensPerChunk: 2 };
  if (S >= 2) return { workgroupSize: 32, rowsPerWorkgroup: 4, tokensPerChunk: 4 };
  return nvidiaNarrow ? { workgroupSize: 64, rowsPerWorkgroup: 2 } : {};
}

/**
 * Prompt chunks past GGML_IDP_MAX_TOKENS, up to this many tokens (the graphs' 64-token chunks), take
 * the integer-dot GEMM where the GEMV does; the matrix's scratch, and the norms' and attention's
 * shared ones (LinearKernels.quantizedTokens), are then sized for this many tokens (1.5 bytes a
 * column a token: 192 KiB at 2048 columns). Longer calls take the float GEMM.
 */
export const GGML_IDP_GEMM_MAX_TOKENS = GGML_GEMV_MAX_S;

export interface LinearKernelsOptions {
  /** GGML block matrices on the integer-dot path (default: the integer-dot decision, planKernels: VKMOE_IDP, blocklist, probe). */
  integerDot?: boolean;
  /** GGML block matrices' calls of GEMM_FROM_TOKENS tokens or more (off the integer-dot path) through the tiled GEMM (default true; false: the GEMV at every S). */
  ggmlGemm?: boolean;
  /**
   * Where integerDot and ggmlGemm are on: prompt chunks of GGML_IDP_MAX_TOKENS + 1 ..
   * GGML_IDP_GEMM_MAX_TOKENS tokens through the integer-dot GEMM (default true; false: the float GEMM,
   * e.g. to compare the two in one run).
   */
  ggmlGemmIdp?: boolean;
  /**
   * Where integerDot is on: q4/q8 matrices' (Q4_0 / Q8_0 files') prompt chunks of GEMM_FROM_TOKENS ..
   * GGML_IDP_GEMM_MAX_TOKENS tokens through the integer-dot GEMM (QuantGemmIdpKernel; default
   * VKMOE_QUANT_GEMM_IDP, on: bench:gemm-pool timed it 1.19-1.35x the float GEMM on every Qwen3.6-like
   * matrix, H200, 2026-12-04; false: the float GEMM).
   */
  quantGemmIdp?: boolean;
  /**
   * Column runs a matrix's prompt-chunk GEMM is split into (default gemmSplits: a few for matrices of
   * few rows on a GPU, none on a CPU device); tests pass their own to run the split GEMMs on Lavapipe.
   */
  gemmSplits?: (rows: number, cols: number, tileRows: number) => number;
  /**
   * Prompt chunks (GEMM_FROM_TOKENS tokens or more) of q4/q8 and GGML block matrices of MATRIX_CORE_MIN_DIM
   * rows and columns or more on the matrix-core GEMMs (default: where the device has cooperativeMatrix
   * enabled, VKMOE_COOPMAT, and the kernel passes its self-check, coopmat-check.ts; false: the f32 /
   * integer-dot GEMMs for every matrix).
   */
  matrixCores?: boolean;
  /**
   * With matrixCores: calls of WIDE_GEMM_FROM_TOKENS tokens or more on the 128-row tiles (wide-gemm.ts),
   * for matrices of WIDE_GEMM_MIN_ROWS rows or more (takesWideTile), "ggml" for GGML block matrices only (default VKMOE_WIDE_GEMM, where the tile passes its self-check,
   * wide-gemm.ts; on an H100 the Qwen3-30B-like
   * Q4_K_M graph's GPU time a prompt token fell 1.6% with them, the Qwen3.6-like Q4_0 one's rose 1.3%
   * with the q4 matrices' on them, 2026-12-07).
   */
  wideGemm?: boolean | "ggml";
  /**
   * The q4/q8 GEMVs' shape for calls of one token on matrices of fewer than GGML_GEMV_WIDE_ROWS rows
   * (default: 64 threads x 2 rows on an NVIDIA GPU with VKMOE_QUANT_GEMV_SHAPE=narrow, else the
   * tuning table's, as every other call takes).
   */
  quantDecodeShape?: { workgroupSize: number; rowsPerWorkgroup: number };
}

/**
 * The q4/q8 GEMVs' one-token shape VKMOE_QUANT_GEMV_SHAPE asks for: "narrow" is the GGML GEMVs'
 * NVIDIA decode shape (ggmlGemvShape: 64 threads x 2 rows), "table" (the default) the tuning table's.
 */
export function quantDecodeShape(kind: GemvDeviceKind, asked: "table" | "narrow"): { workgroupSize: number; rowsPerWorkgroup: number } | undefined {
  return asked === "narrow" && kind === "nvidia" ? { workgroupSize: 64, rowsPerWorkgroup: 2 } : undefined;
}

/** The kernels every DeviceLinear of one graph records with (one pipeline per weight kind). */
export class LinearKernels implements Disposable {
  private half: GemvHalfKernel | undefined;
  /** The narrow shape by rows a workgroup (floatGemmShape). */
  private readonly floatGemm = new Map<number, FloatGemmKernel>();
  private floatTile: FloatGemmTileKernel | undefined;
  private readonly quant = new Map<string, QuantGemvKernel>();
  private readonly quantGateUp = new Map<string, QuantGateUpKernel>();
  private readonly gemm = new Map<string, QuantGemmKernel>();
  private readonly gemmIdp = new Map<string, QuantGemmIdpKernel>();
  /** By type and shape (ggmlOptions: by the matrix's rows on a GPU). */
  private readonly ggml = new Map<string, GgmlGemvKernel>();
  private readonly ggmlIdp = new Map<string, GgmlGemvIdpKernel>();
  private readonly ggmlGemmKernels = new Map<string, GgmlGemmKernel>();
  private readonly ggmlGemmIdpKernels = new Map<GgmlBlockType, GgmlGemmIdpKernel>();
  private readonly quantWide = new Map<string, QuantGemmWideKernel>();
  private readonly ggmlWide = new Map<GgmlBlockType, GgmlGemmWideKernel>();
  /** GGML block matrices take the integer-dot path (for calls of up to GGML_IDP_MAX_TOKENS tokens). */
  readonly integerDot: boolean;
  /** GGML block matrices' prompt chunks (GEMM_FROM_TOKENS tokens or more, off the integer-dot path) go through GgmlGemmKernel. */
  readonly ggmlGemm: boolean;
  /** GGML block matrices' prompt chunks of up to GGML_IDP_GEMM_MAX_TOKENS tokens go through GgmlGemmIdpKernel (integerDot and ggmlGemm both on). */
  readonly ggmlGemmIdp: boolean;
  /** q4/q8 matrices' prompt chunks of GEMM_FROM_TOKENS .. GGML_IDP_GEMM_MAX_TOKENS tokens go through QuantGemmIdpKernel (integerDot on). */
  readonly quantGemmIdp: boolean;
  /** Prompt chunks' GEMMs (q4/q8 and GGML blocks) run on the matrix cores (LinearKernelsOptions.matrixCores). */
  readonly matrixCores: boolean;
  /** Their calls of WIDE_GEMM_FROM_TOKENS tokens or more on the 128-row tiles (LinearKernelsOptions.wideGemm, takesWideTile). */
  readonly wideGemm: boolean | "ggml";
  /**
   * The most tokens a matrix's call takes x quantized for (0: none), and so what every
   * quantized-x scratch holds: each matrix's own, and the norms' and attention's shared rows that
   * its recordFrom reads (NormFeed, the graphs' attnQuant).
   */
  readonly quantizedTokens: number;
  /** Column runs a matrix's prompt-chunk GEMM is split into (LinearKernelsOptions.gemmSplits). */
  readonly gemmSplits: (rows: number, cols: number, tileRows: number) => number;
  /**
   * A CPU device (Lavapipe) runs a workgroup's barriers as context switches: one subgroup of 8
   * threads per workgroup, 8 rows each, took lm_head (151936 x 64, Q8_0) from 4.5 s to 0.29 s
   * (2-core host, 2026-12-01); GPUs keep the tuning table's shape.
   */
  private readonly shape: { workgroupSize: number; rowsPerWorkgroup: number } | undefined;
  /** The q4/q8 GEMVs' shape for one-token calls of matrices of fewer than GGML_GEMV_WIDE_ROWS rows (LinearKernelsOptions.quantDecodeShape). */
  private readonly quantDecode: { workgroupSize: number; rowsPerWorkgroup: number } | undefined;
  constructor(readonly device: Device, options: LinearKernelsOptions = {}) {
    this.shape = device.info.type === 4 ? { workgroupSize: 8, rowsPerWorkgroup: 8 } : undefined;
    this.quantDecode = options.quantDecodeShape ?? quantDecodeShape(gemvDeviceKind(device.info), readConfig().VKMOE_QUANT_GEMV_SHAPE);
    // The integer-dot pipelines are created only after the decision (a probe in a child process) says
    // they are safe. Its mode comes from the process env: the graphs do not pass the model's; a model
    // loaded with VKMOE_IDP=off has the feature off on its device, so that choice holds either way.
    this.integerDot = options.integerDot ?? (device.enabled.integerDotProduct && planKernels(device, readConfig()).integerDot.on);
    // The GEMM on a CPU device too: measured on Lavapipe at S = 64 it is as fast as the GEMV or
    // faster (Q6_K 2.8x); fewer tokens can favour the GEMV, but one rule serves every device.
    this.ggmlGemm = options.ggmlGemm ?? true;
    this.matrixCores = options.matrixCores ?? (device.enabled.cooperativeMatrix && matrixCoresPass(device));
    if (this.matrixCores && !device.enabled.cooperativeMatrix) throw new GraphUnsupportedError(`matrix-core GEMMs need VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix, not enabled on ${device.info.name}`);
    // what VKMOE_WIDE_GEMM asks for, where the tile passes its self-check (once per device); an explicit option as given
    const wide = readConfig().VKMOE_WIDE_GEMM, asked = wide === "ggml" ? "ggml" : wide === "on";
    this.wideGemm = this.matrixCores && (options.wideGemm ?? (asked && wideGemmPasses(device) ? asked : false));
    // with the matrix cores on, the matrices below MATRIX_CORE_MIN_DIM keep these
    this.ggmlGemmIdp = this.integerDot && this.ggmlGemm && (options.ggmlGemmIdp ?? true);
    this.quantGemmIdp = this.integerDot && (options.quantGemmIdp ?? readConfig().VKMOE_QUANT_GEMM_IDP === "on");
    this.quantizedTokens = this.ggmlGemmIdp || this.quantGemmIdp ? GGML_IDP_GEMM_MAX_TOKENS : this.integerDot ? GGML_IDP_MAX_TOKENS : 0;
    this.gemmSplits = options.gemmSplits ?? ((rows, cols, tileRows) => gemmSplits(device, rows, cols, tileRows));
    if (this.integerDot && !device.enabled.integerDotProduct) throw new GraphUnsupportedError(`integer-dot GGML GEMVs need shaderIntegerDotProduct, not enabled on ${device.info.name}`);
  }

  floatKernel(): GemvHalfKernel {
    return (this.half ??= new GemvHalfKernel(this.device, { maxSets: 256, ...this.shape }));
  }

  /**
   * The prompt-chunk GEMM of a float matrix of `rows` rows (more than GEMV_HALF_MAX_S tokens): the
   * narrow shape at its rows a workgroup (floatGemmShape) under FLOAT_GEMM_MAX_ROWS rows, else the tile.
   */
  floatGemmKernel(rows: number): FloatGemm {
    if (rows >= FLOAT_GEMM_MAX_ROWS) return (this.floatTile ??= new FloatGemmTileKernel(this.device, { maxSets: 256 }));
    const narrowRows = floatGemmShape(rows);
    let k = this.floatGemm.get(narrowRows);
    if (!k) this.floatGemm.set(narrowRows, (k = new FloatGemmKernel(this.device, { maxSets: 256, narrowRows })));
    return k;
  }

  /** The wide-tile GEMM of a q4/q8 matrix kind (wideGemm on). */
  quantWideKernel(m: QuantLinear["matrix"]): QuantGemmWideKernel {
    const key = `${m.format}/${m.scaleType}/${m.groupSize}`;
    let k = this.quantWide.get(key);
    if (!k) this.quantWide.set(key, (k = new QuantGemmWideKernel(this.device, m.format, m.scaleType === "f16", m.groupSize, { maxSets: 256 })));
    return k;
  }

  /** The wide-tile GEMM of a GGML block type (wideGemm on). */
  ggmlWideKernel(type: GgmlBlockType): GgmlGemmWideKernel {
    let k = this.ggmlWide.get(type);
    if (!k) this.ggmlWide.set(type, (k = new GgmlGemmWideKernel(this.device, type, { maxSets: 256 })));
    return k;
  }

  /** The decode GEMV of a q4/q8 matrix kind for a call of S tokens (its shape: quantOptions). */
  quantKernel(m: QuantLinear["matrix"], S = 1): QuantGemvKernel {
    const options = this.quantOptions(m.rows, S), key = `${m.format}/${m.scaleType}/${m.groupSize}/${options.shape?.workgroupSize ?? 0}x${options.shape?.rowsPerWorkgroup ?? 0}`;
    let k = this.quant.get(key);
    if (!k) this.quant.set(key, (k = new QuantGemvKernel(this.device, m.format, m.scaleType === "f16", m.groupSize, options)));
    return k;
  }

  /** The fused gate+up GEMV of a q4/q8 matrix kind, in quantKernel's shape for the same call (so each matrix's rows are that kernel's). */
  quantGateUpKernel(m: QuantLinear["matrix"], S = 1): QuantGateUpKernel {
    const options = this.quantOptions(m.rows, S), key = `${m.format}/${m.scaleType}/${m.groupSize}/${options.shape?.workgroupSize ?? 0}x${options.shape?.rowsPerWorkgroup ?? 0}`;
    let k = this.quantGateUp.get(key);
    if (!k) this.quantGateUp.set(key, (k = new QuantGateUpKernel(this.device, m.format, m.scaleType === "f16", m.groupSize, options)));
    return k;
  }

  /** The q4/q8 GEMVs' options: the one-token shape (quantDecode) where asked, else the CPU device's shape (`shape`) or the tuning table's. */
  private quantOptions(rows: number, S: number) {
    const decode = this.quantDecode && S === 1 && rows < GGML_GEMV_WIDE_ROWS ? this.quantDecode : undefined;
    const shape = decode ?? this.shape;
    return { maxSets: 256, ...(shape && { shape }) };
  }

  /** The prompt-chunk GEMM of a q4/q8 matrix: on the matrix cores (only where they are on) or the f32 tiles. */
  gemmKernel(m: QuantLinear["matrix"], matrixCores = false): QuantGemmKernel {
    const key = `${m.format}/${m.scaleType}/${m.groupSize}/${matrixCores}`;
    let k = this.gemm.get(key);
    if (!k) this.gemm.set(key, (k = new QuantGemmKernel(this.device, m.format, m.scaleType === "f16", m.groupSize, { maxSets: 256, matrixCores: matrixCores && this.matrixCores })));
    return k;
  }

  gemmIdpKernel(m: QuantLinear["matrix"]): QuantGemmIdpKernel {
    const key = `${m.format}/${m.scaleType}/${m.groupSize}`;
    let k = this.gemmIdp.get(key);
    if (!k) this.gemmIdp.set(key, (k = new QuantGemmIdpKernel(this.device, m.format, m.scaleType === "f16", m.groupSize, { maxSets: 256 })));
    return k;
  }

  /** The decode GEMV of a GGML type for a call of S tokens of a matrix of `rows` rows (its shape: ggmlOptions). */
  ggmlKernel(type: GgmlBlockType, rows: number, S = 1): GgmlGemvKernel {
    const options = this.ggmlOptions(rows, S), key = `${type}/${options.workgroupSize ?? 0}x${options.rowsPerWorkgroup ?? 0}x${options.tokensPerChunk ?? 0}`;
    let k = this.ggml.get(key);
    if (!k) this.ggml.set(key, (k = new GgmlGemvKernel(this.device, type, options)));
    return k;
  }

  /** The prompt-chunk GEMM of a GGML block type: on the matrix cores (only where they are on) or the f32 tiles. */
  ggmlGemmKernel(type: GgmlBlockType, matrixCores = false): GgmlGemmKernel {
    const key = `${type}/${matrixCores}`;
    let k = this.ggmlGemmKernels.get(key);
    if (!k) this.ggmlGemmKernels.set(key, (k = new GgmlGemmKernel(this.device, type, { maxSets: 256, matrixCores: matrixCores && this.matrixCores })));
    return k;
  }

  ggmlGemmIdpKernel(type: GgmlBlockType): GgmlGemmIdpKernel {
    let k = this.ggmlGemmIdpKernels.get(type);
    if (!k) this.ggmlGemmIdpKernels.set(type, (k = new GgmlGemmIdpKernel(this.device, type, { maxSets: 256 })));
    return k;
  }

  /** The integer-dot decode GEMV of a GGML type for a call of S tokens of a matrix of `rows` rows (its shape: ggmlOptions). */
  ggmlIdpKernel(type: GgmlBlockType, rows: number, S = 1): GgmlGemvIdpKernel {
    const options = this.ggmlOptions(rows, S), key = `${type}/${options.workgroupSize ?? 0}x${options.rowsPerWorkgroup ?? 0}x${options.tokensPerChunk ?? 0}`;
    let k = this.ggmlIdp.get(key);
    if (!k) this.ggmlIdp.set(key, (k = new GgmlGemvIdpKernel(this.device, type, options)));
    return k;
  }

  /**
   * The GGML GEMVs' shape (ggmlGemvShape). CPU device: one subgroup of 8 threads a workgroup as
   * above, 4 rows and 1 token a chunk (LLVM compiles the unrolled 8 x 2 in 20 s). NVIDIA, one token:
   * 64 threads x 2 rows for matrices of fewer than GGML_GEMV_WIDE_ROWS rows, the kernel's default
   * 32 x 4 for more (lm_head); other GPUs (not measured) keep 32 x 4. Several tokens: chunks of 2 or 4.
   * H200, 2026-12-04 (profile:graph, Qwen3-30B-like Q4_K_M 8 layers, decode, µs a layer at
   * 32 x 4 / 64 x 2): q, k, v 13.1 / 8.6, o 17.3 / 9.0; lm_head (151936 rows) 108 / 122.
   */
  private ggmlOptions(rows: number, S: number): GgmlGemvShape & { maxSets: number } {
    return { maxSets: 256, ...ggmlGemvShape(gemvDeviceKind(this.device.info), rows, S) };
  }

  [Symbol.dispose](): void {
    this.half?.[Symbol.dispose]();
    for (const k of this.floatGemm.values()) k[Symbol.dispose]();
    this.floatTile?.[Symbol.dispose]();
    for (const k of this.quantWide.values()) k[Symbol.dispose]();
    for (const k of this.ggmlWide.values()) k[Symbol.dispose]();
    for (const k of this.ggml.values()) k[Symbol.dispose]();
    for (const k of this.ggmlIdp.values()) k[Symbol.dispose]();
    for (const k of this.ggmlGemmKernels.values()) k[Symbol.dispose]();
    for (const k of this.ggmlGemmIdpKernels.values()) k[Symbol.dispose]();
    for (const k of this.quant.values()) k[Symbol.dispose]();
    for (const k of this.quantGateUp.values()) k[Symbol.dispose]();
    for (const k of this.gemm.values()) k[Symbol.dispose]();
    for (const k of this.gemmIdp.values()) k[Symbol.dispose]();
  }
}

export class DeviceLinear implements Disposable {
  readonly rows: number;
  readonly cols: number;
  private readonly float: { buffer: Buffer; dtype: "f32" | "f16" | "bf16" } | undefined;
  private readonly matrix: DeviceMatrix | undefined;
  private readonly blocks: DeviceGgmlMatrix | undefined;
  /** The integer-dot path's quantized x (GGML block matrices where LinearKernels.integerDot, q4/q8 ones where quantGemmIdp), for LinearKernels.quantizedTokens tokens. */
  private readonly idpScratch: GgmlIdpScratch | undefined;
  /**
   * Matrices of few rows (q4/q8, and GGML blocks on either GEMM): their prompt chunks' GEMM split over
   * the columns (quant-gemm.ts), for up to GEMM_TOKENS tokens. This matrix's own: q, k and v are
   * recorded without a barrier between them, and calls on one scratch must not overlap.
   */
  private readonly gemmSplit: GemmSplitScratch | undefined;
  /** Prompt chunks of this matrix run the matrix-core GEMM's 64 x 64 tiles (LinearKernels.matrixCores and MATRIX_CORE_MIN_DIM); the wide tile is takesWide's. */
  readonly onMatrixCores: boolean;
  /** A q4/q8 matrix, or a GGML block one with LinearKernels.ggmlGemm: long chunks may take the wide tile (takesWideTile). */
  private readonly wideKind: boolean;

  /**
   * `floatKernel`: a float matrix records its GEMV calls through this GEMV instead of the graph's
   * shared one (the decode graph's routers: the shape its router-route fold computes, on every
   * device); a matrix of few rows takes the graph's float GEMM past GEMV_HALF_MAX_S tokens either way.
   */
  constructor(private readonly kernels: LinearKernels, readonly name: string, linear: Linear, private readonly floatKernel?: GemvHalfKernel) {
    const device = kernels.device;
    this.rows = linear.rows;
    this.cols = linear.cols;
    this.wideKind = linear instanceof QuantLinear || (linear instanceof GgmlBlockLinear && kernels.ggmlGemm);
    this.onMatrixCores = kernels.matrixCores && this.wideKind && linear.rows >= MATRIX_CORE_MIN_DIM && linear.cols >= MATRIX_CORE_MIN_DIM;
    const tileRows = this.onMatrixCores ? COOPMAT_GEMM_ROWS : GEMM_ROWS;
    const limit = device.info.limits.maxStorageBufferRange;
    if (linear.bytes > limit) throw new GraphUnsupportedError(`${name} takes ${linear.bytes} bytes, past this device's maxStorageBufferRange of ${limit}`);
    if (linear instanceof FloatLinear) {
      const data = linear.data;
      const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      const buffer = new Buffer(device, { size: BigInt(Math.max(16, Math.ceil(bytes.byteLength / 16) * 16)), memory: "device" });
      try {
        uploadBytes(device, buffer, 0n, bytes);
      } catch (e) {
        buffer[Symbol.dispose]();
        throw e;
      }
      this.float = { buffer, dtype: linear.dtype === "F32" ? "f32" : linear.dtype === "F16" ? "f16" : "bf16" };
    } else if (linear instanceof QuantLinear) {
      this.matrix = new DeviceMatrix(device, linear.matrix);
      try {
        // the integer-dot GEMM takes rows of whole 32-column slices (GGUF's Q4_0 / Q8_0 always are)
        if (kernels.quantGemmIdp && !this.onMatrixCores && linear.cols % 32 === 0) this.idpScratch = new GgmlIdpScratch(device, linear.cols, kernels.quantizedTokens);
        const splits = kernels.gemmSplits(linear.rows, linear.cols, tileRows);
        if (splits > 1 && splitRuns(linear.cols, splits).splits > 1) this.gemmSplit = new GemmSplitScratch(device, linear.rows, linear.cols, GEMM_TOKENS, splits);
      } catch (e) {
        this.idpScratch?.[Symbol.dispose]();
        this.matrix[Symbol.dispose]();
        throw e;
      }
    } else if (linear instanceof GgmlBlockLinear) {
      this.blocks = new DeviceGgmlMatrix(device, linear.tensor);
      try {
        if (kernels.integerDot) this.idpScratch = new GgmlIdpScratch(device, linear.cols, kernels.quantizedTokens);
        // runs of whole blocks (a K-quant's 256 columns): a matrix of few blocks a row may not split
        const block = GGML_BLOCK_LAYOUTS[linear.tensor.type].blockElements, splits = kernels.gemmSplits(linear.rows, linear.cols, tileRows);
        if (kernels.ggmlGemm && splits > 1 && splitRuns(linear.cols, splits, block).splits > 1) {
          this.gemmSplit = new GemmSplitScratch(device, linear.rows, linear.cols, GEMM_TOKENS, splits, block);
        }
      } catch (e) {
        this.idpScratch?.[Symbol.dispose]();
        this.blocks[Symbol.dispose]();
        throw e;
      }
    } else {
      throw new GraphUnsupportedError(`${name}: a ${linear.kind} matrix has no GPU kernel`);
    }
  }

  /** A float matrix's weights as the float kernel reads them (undefined for other formats). */
  get floatWeights(): { buffer: Buffer; dtype: "f32" | "f16" | "bf16" } | undefined {
    return this.float;
  }

  /** Dispatches `record` makes for S tokens. */
  dispatches(S = 1): number {
    if (this.blocks) {
      const path = this.ggmlPath(S);
      // the integer-dot kernels quantize x first
      return path === "idp-gemv" || path === "idp-gemm" ? 2 : path === "gemm" ? 1 : Math.ceil(S / GGML_GEMV_MAX_S);
    }
    if (this.matrix) return this.quantPath(S) === "idp-gemm" ? 2 : 1;
    // float: the GEMM for a prompt chunk, else the GEMV GEMV_HALF_MAX_S tokens a dispatch
    return this.floatGemmTakes(S) ? 1 : Math.ceil(S / GEMV_HALF_MAX_S);
  }

  /**
   * Whether a float matrix's call of S tokens takes the float GEMM (LinearKernels.floatGemmKernel's
   * shape for its rows): past GEMV_HALF_MAX_S tokens under FLOAT_GEMM_MAX_ROWS rows (a 1-row
   * shared_expert_gate 98 -> 45 µs at 512 tokens on an H100), from FLOAT_GEMM_TILE_FROM_TOKENS tokens
   * for more rows (a 256 x 2048 router at 512 tokens 157-208 -> 62 µs; the GEMV's dispatches are
   * faster at 128 tokens or fewer; H100, 2026-12-07).
   */
  private floatGemmTakes(S: number): boolean {
    return S > GEMV_HALF_MAX_S && (this.rows < FLOAT_GEMM_MAX_ROWS || S >= FLOAT_GEMM_TILE_FROM_TOKENS);
  }

  /** The kernel a q4/q8 matrix's call of S tokens runs: the GEMV for few tokens, else the integer-dot GEMM for the chunks its scratch holds, or the float GEMM. */
  private quantPath(S: number): "idp-gemm" | "gemm" | "gemv" {
    if (S < GEMM_FROM_TOKENS) return "gemv";
    if (this.takesWide(S)) return "gemm";
    return this.idpScratch && S <= this.idpScratch.maxTokens ? "idp-gemm" : "gemm";
  }

  /**
   * The kernel a GGML block matrix's call of S tokens runs: the integer-dot GEMV for few tokens, the
   * integer-dot GEMM for prompt chunks its scratch holds, else the float GEMM (GEMM_FROM_TOKENS tokens
   * or more) or the float GEMV.
   */
  private ggmlPath(S: number): "idp-gemv" | "idp-gemm" | "gemm" | "gemv" {
    if (this.idpScratch && S <= GGML_IDP_MAX_TOKENS) return "idp-gemv";
    if (this.takesWide(S)) return "gemm";
    if (this.onMatrixCores && S >= GEMM_FROM_TOKENS) return "gemm";
    if (this.idpScratch && this.kernels.ggmlGemmIdp && S <= this.idpScratch.maxTokens) return "idp-gemm";
    return this.kernels.ggmlGemm && S >= GEMM_FROM_TOKENS ? "gemm" : "gemv";
  }

  /**
   * Whether a call of S tokens can take a norm's (or attention's) quantized output instead of x: the
   * integer-dot GEMV's and GEMM's calls (up to LinearKernels.quantizedTokens tokens, what the shared
   * scratches hold).
   */
  takesQuantized(S: number): boolean {
    if (this.matrix) return this.quantPath(S) === "idp-gemm";
    if (!this.blocks) return false;
    const path = this.ggmlPath(S);
    return path === "idp-gemv" || path === "idp-gemm";
  }

  /**
   * As record, where `quantized` (when given) already holds x quantized for the integer-dot path
   * (RmsNormQuantKernel's output or the attention combine's, written before the barrier that precedes
   * this): a matrix that takes it runs its GEMV or GEMM alone. Returns the dispatches recorded.
   */
  recordFrom(cb: CommandBuffer, x: Buffer, quantized: GgmlIdpScratch | undefined, y: Buffer, S = 1): number {
    const takes = quantized && quantized.cols === this.cols && quantized.maxTokens >= S && this.takesQuantized(S);
    if (takes && this.matrix) {
      this.kernels.gemmIdpKernel(this.matrix.matrix as QuantLinear["matrix"]).recordQuantized(cb, { matrix: this.matrix, y, S, scratch: quantized }, this.splitFor(S));
      return 1;
    }
    if (takes && this.blocks) {
      const args = { matrix: this.blocks, y, S, scratch: quantized };
      if (this.ggmlPath(S) === "idp-gemv") this.kernels.ggmlIdpKernel(this.blocks.type, this.rows, S).recordQuantized(cb, args);
      else this.kernels.ggmlGemmIdpKernel(this.blocks.type).recordQuantized(cb, args, this.splitFor(S));
      return 1;
    }
    this.record(cb, x, y, S);
    return this.dispatches(S);
  }

  /**
   * Where a call of S tokens takes the integer-dot GEMV of GGML blocks: records x's quantization into
   * this matrix's own scratch and returns the scratch, for a recordFrom behind a barrier (so that the
   * two can run beside other steps' work); elsewhere records nothing and returns undefined.
   */
  recordQuantize(cb: CommandBuffer, x: Buffer, S = 1): GgmlIdpScratch | undefined {
    if (!this.blocks || this.ggmlPath(S) !== "idp-gemv") return undefined;
    this.kernels.ggmlIdpKernel(this.blocks.type, this.rows, S).recordQuantize(cb, { matrix: this.blocks, x, S, scratch: this.idpScratch! });
    return this.idpScratch;
  }

  /**
   * Whether this matrix (a SwiGLU block's gate) and `up` can run a call of S tokens as one fused
   * gate+up GEMV (recordGateUp): both q4/q8 of one format and shape, on the GEMV path.
   */
  fusesGateUp(up: DeviceLinear, S: number): boolean {
    const g = this.matrix?.matrix, u = up.matrix?.matrix;
    return g !== undefined && u !== undefined && this.quantPath(S) === "gemv" && up.quantPath(S) === "gemv" && QuantGateUpKernel.pairs(g, u);
  }

  /** y[S][rows] = silu(x · gateᵀ) * (x · upᵀ), this matrix the gate, in one dispatch (fusesGateUp must hold). The caller places barriers around it. */
  recordGateUp(cb: CommandBuffer, up: DeviceLinear, x: Buffer, y: Buffer, S = 1): number {
    if (!this.fusesGateUp(up, S)) throw new InvalidArgumentError(`${this.rows}x${this.cols} gate and up matrices do not fuse for a call of ${S} tokens`);
    this.kernels.quantGateUpKernel(this.matrix!.matrix as QuantLinear["matrix"], S).record(cb, { gate: this.matrix!, up: up.matrix!, x, y, S });
    return 1;
  }

  /** y[S][rows] = x[S][cols] · Wᵀ. The caller places barriers around it. */
  record(cb: CommandBuffer, x: Buffer, y: Buffer, S = 1, xOffset = 0, yOffset = 0): void {
    if (this.float) {
      const args = { weights: this.float.buffer, x, y, rows: this.rows, cols: this.cols, S, dtype: this.float.dtype, xOffset, yOffset };
      if (this.floatGemmTakes(S)) {
        this.kernels.floatGemmKernel(this.rows).record(cb, args);
      } else {
        // the GEMV (this matrix's own where given) takes GEMV_HALF_MAX_S tokens a dispatch: more run as several (independent rows of y, no barrier)
        for (let t = 0; t < S; t += GEMV_HALF_MAX_S) {
          const n = Math.min(GEMV_HALF_MAX_S, S - t);
          (this.floatKernel ?? this.kernels.floatKernel()).record(cb, { ...args, S: n, xOffset: xOffset + t * this.cols, yOffset: yOffset + t * this.rows });
        }
      }
    } else if (this.blocks) {
      this.recordGgml(cb, this.blocks, x, y, S, xOffset, yOffset);
    } else {
      const m = this.matrix!.matrix as QuantLinear["matrix"];
      const args = { matrix: this.matrix!, x, y, S, xOffset, yOffset };
      const path = this.quantPath(S);
      if (path === "idp-gemm") this.kernels.gemmIdpKernel(m).record(cb, { ...args, scratch: this.idpScratch! }, this.splitFor(S));
      else if (path === "gemm" && this.takesWide(S)) this.kernels.quantWideKernel(m).record(cb, args);
      else if (path === "gemm") this.kernels.gemmKernel(m, this.onMatrixCores).record(cb, args, this.splitFor(S));
      else this.kernels.quantKernel(m, S).record(cb, args);
    }
  }

  private recordGgml(cb: CommandBuffer, blocks: DeviceGgmlMatrix, x: Buffer, y: Buffer, S: number, xOffset: number, yOffset: number): void {
    const path = this.ggmlPath(S);
    if (path === "idp-gemv") {
      this.kernels.ggmlIdpKernel(blocks.type, this.rows, S).record(cb, { matrix: blocks, x, y, S, xOffset, yOffset, scratch: this.idpScratch! });
    } else if (path === "idp-gemm") {
      this.kernels.ggmlGemmIdpKernel(blocks.type).record(cb, { matrix: blocks, x, y, S, xOffset, yOffset, scratch: this.idpScratch! }, this.splitFor(S));
    } else if (path === "gemm" && this.takesWide(S)) {
      this.kernels.ggmlWideKernel(blocks.type).record(cb, { matrix: blocks, x, y, S, xOffset, yOffset });
    } else if (path === "gemm") {
      this.kernels.ggmlGemmKernel(blocks.type, this.onMatrixCores).record(cb, { matrix: blocks, x, y, S, xOffset, yOffset }, this.splitFor(S));
    } else {
      for (let t = 0; t < S; t += GGML_GEMV_MAX_S) {
        const n = Math.min(GGML_GEMV_MAX_S, S - t);
        this.kernels.ggmlKernel(blocks.type, this.rows, n).record(cb, { matrix: blocks, x, y, S: n, xOffset: xOffset + t * this.cols, yOffset: yOffset + t * this.rows });
      }
    }
  }

  /** Whether a matrix-core GEMM call of S tokens takes the wide tile (LinearKernels.wideGemm). */
  private takesWide(S: number): boolean {
    const k = this.kernels;
    return this.wideKind && takesWideTile({ matrixCores: k.matrixCores, wideGemm: k.wideGemm, ggml: this.blocks !== undefined, rows: this.rows, cols: this.cols, S });
  }

  /** The split scratch for a GEMM call of S tokens: the matrix's, where it has one that holds S (one token tile). */
  private splitFor(S: number): GemmSplitScratch | undefined {
    return this.gemmSplit && S <= this.gemmSplit.maxTokens ? this.gemmSplit : undefined;
  }

  [Symbol.dispose](): void {
    this.float?.buffer[Symbol.dispose]();
    this.matrix?.[Symbol.dispose]();
    this.gemmSplit?.[Symbol.dispose]();
    this.blocks?.[Symbol.dispose]();
    this.idpScratch?.[Symbol.dispose]();
  }
}
