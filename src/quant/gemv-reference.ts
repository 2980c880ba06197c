/** The f64 oracle: y = x · Wᵀ from exact q*scale values with f64 accumulation. Slow; for tests. */
import { colsPerWord, decodeScales } from "./layout.ts";
import { unpackRow } from "./pack.ts";
import { checkGateUpArgs, swiglu } from "./swiglu.ts";
import type { QuantMatrix } from "./types.ts";
import { checkGemvArgs } from "./validate.ts";

/** y[s*rows + o] = sum_i x[s*cols + i] * W[o][i], in f64. */
export function gemvReference(m: QuantMatrix, x: Float32Array, S: number): Float64Array {
  checkGemvArgs(m, x, S);
  const { rows, cols, groupSize, groupsPerRow } = m;
  const scales = decodeScales(m);
  const y = new Float64Array(S * rows);
  const rowQ = new Int8Array(m.rowWords * colsPerWord(m.format));
  const rowW = new Float64Array(cols);
  for (let o = 0; o < rows; o++) {
    unpackRow(m.format, m.weights, o * m.rowWords, m.rowWords, rowQ);
    for (let c = 0; c < cols; c++) rowW[c] = rowQ[c] * scales[o * groupsPerRow + Math.floor(c / groupSize)];
    for (let s = 0; s < S; s++) {
      let acc = 0;
      const xBase = s * cols;
      for (let c = 0; c < cols; c++) acc += x[xBase + c] * rowW[c];
      y[s * rows + o] = acc;
    }
  }
  return y;
}

/** h = silu(g) * u with g = x · Wgᵀ, u = x · Wuᵀ (clamped by `limit` if given), in f64. */
export function gateUpReference(
  gate: QuantMatrix,
  up: QuantMatrix,
  x: Float32Array,
  S: number,
  limit?: number,
): Float64Array {
  checkGateUpArgs(gate, up, x, S, undefined, limit);
  const g = gemvReference(gate, x, S);
  const u = gemvReference(up, x, S);
  for (let i = 0; i < g.length; i++) g[i] = swiglu(g[i], u[i], limit);
  return g;
}
