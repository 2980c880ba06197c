/** Quantized weight formats shared by the CPU path and the GPU shaders. The bit layout is specified in FORMATS.md. */

export type QuantFormat = "q4" | "q8";
export type ScaleType = "f32" | "f16";
export type GroupSize = 32 | 64 | 128;

export const SUPPORTED_GROUP_SIZES: readonly GroupSize[] = [32, 64, 128];
export const SUPPORTED_FORMATS: readonly QuantFormat[] = ["q4", "q8"];
export const SUPPORTED_SCALE_TYPES: readonly ScaleType[] = ["f32", "f16"];

/** Most tokens one GEMV call accepts. */
export const MAX_TOKENS = 64;

/**
 * A quantized matrix W with `rows` outputs and `cols` inputs: y[s,o] = sum_i x[s,i] * W[o,i].
 * W[r][c] = q(r,c) * scale(r, floor(c / groupSize)).
 */
export interface QuantMatrix {
  format: QuantFormat;
  rows: number;
  cols: number;
  groupSize: GroupSize;
  scaleType: ScaleType;
  /** u32 words per row, padded to a multiple of 4 (16 bytes). */
  rowWords: number;
  /** ceil(cols / groupSize); the last group may be partial. */
  groupsPerRow: number;
  /** rows * rowWords words. */
  weights: Uint32Array;
  /** f32: rows*groupsPerRow float bit patterns; f16: ceil(rows*groupsPerRow/2) words, scale k in half (k & 1) of word k >> 1. */
  scales: Uint32Array;
}

/** Dense source matrix, row-major [rows, cols], in one of the float encodings checkpoints use. */
export type DenseSource =
  | { dtype: "f32"; data: Float32Array }
  | { dtype: "f16"; data: Uint16Array }
  | { dtype: "bf16"; data: Uint16Array };

export interface QuantizeOptions {
  format: QuantFormat;
  groupSize: GroupSize;
  scaleType: ScaleType;
}
