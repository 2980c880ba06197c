/** Exact dequantization: W[r][c] = q(r,c) * scale(r, floor(c / groupSize)), rounded once to f32. */
import { colsPerWord, decodeScales } from "./layout.ts";
import { unpackRow } from "./pack.ts";
import type { QuantMatrix } from "./types.ts";
import { validateQuantMatrix } from "./validate.ts";

/**
 * Row-major [rows, cols] f32 values. With f16 scales q*scale is exact in f32 (11 + 8 bits); with f32
 * scales it is the correctly rounded f32 of the exact product.
 */
export function dequantize(m: QuantMatrix): Float32Array {
  validateQuantMatrix(m);
  const { rows, cols, groupSize, groupsPerRow } = m;
  const scales = decodeScales(m);
  const out = new Float32Array(rows * cols);
  const rowQ = new Int8Array(m.rowWords * colsPerWord(m.format));
  for (let r = 0; r < rows; r++) {
    unpackRow(m.format, m.weights, r * m.rowWords, m.rowWords, rowQ);
    const base = r * cols;
    for (let c = 0; c < cols; c++) out[base + c] = rowQ[c] * scales[r * groupsPerRow + Math.floor(c / groupSize)];
  }
  return out;
}
