/** The GEMM tests' oracles: f64 sums over exact weights, in column order. */
import { gemvReference } from "../../src/quant/gemv-reference.ts";
import { dequantizeGgml, type GgmlBlockTensor } from "../../src/quant/ggml-blocks.ts";
import type { QuantMatrix } from "../../src/quant/types.ts";

/** y[s, r] = Σ_c W[r, c] * x[s, c] in f64, W dense [rows][cols]. */
export function exactGemm(weights: ArrayLike<number>, rows: number, cols: number, x: ArrayLike<number>, S: number): Float64Array {
  const y = new Float64Array(S * rows);
  for (let s = 0; s < S; s++) {
    for (let r = 0; r < rows; r++) {
      let a = 0;
      for (let c = 0; c < cols; c++) a += weights[r * cols + c]! * x[s * cols + c]!;
      y[s * rows + r] = a;
    }
  }
  return y;
}

/** exactGemm over GGML's exact weights (dequantizeGgml). */
export const ggmlGemmReference = (w: GgmlBlockTensor, x: ArrayLike<number>, S: number): Float64Array => exactGemm(dequantizeGgml(w), w.rows, w.cols, x, S);

/** gemvReference (f64 over the exact q * scale weights) for any S: it takes at most 64 tokens a call. */
export function quantGemmReference(m: QuantMatrix, x: Float32Array, S: number): Float64Array {
  const y = new Float64Array(S * m.rows);
  for (let s0 = 0; s0 < S; s0 += 64) {
    const n = Math.min(64, S - s0);
    y.set(gemvReference(m, x.subarray(s0 * m.cols, (s0 + n) * m.cols), n), s0 * m.rows);
  }
  return y;
}
