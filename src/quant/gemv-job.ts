/** Everything a CPU GEMV kernel needs, flattened into typed arrays and numbers so the kernels stay monomorphic. */

export interface GemvJob {
  weights: Uint32Array;
  rows: number;
  rowWords: number;
  groupsPerRow: number;
  /** groupSize / colsPerWord. */
  wordsPerGroup: number;
  /** true: read scales through halfTable[scalesF16[k ^ halfIndexFlip]]; false: scalesF32[k]. */
  f16Scales: boolean;
  scalesF32: Float32Array;
  scalesF16: Uint16Array;
  halfTable: Float32Array;
  /** 0 on little-endian hosts; 1 on big-endian ones, where half k of a u32 word sits at u16 index k ^ 1. */
  halfIndexFlip: number;
  S: number;
  /** Activations [S][xStride] in f64, zero beyond cols so padding columns contribute nothing. */
  x: Float64Array;
  xStride: number;
  /** q4 only: [S][groupsPerRow] sums of x over each group, for the unsigned-nibble offset (u - 8). */
  groupSums: Float64Array;
  /** Output [S][rows]. */
  y: Float32Array;
}
