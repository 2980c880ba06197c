/**
 * A matrix made of some rows of another, in a given order (rows are independent in every weight
 * layout, so this is lossless: the same bytes, regrouped). The hybrid graph splits Qwen3.5's q_proj,
 * whose rows interleave each head's query and output gate, into a query matrix and a gate matrix
 * that the GPU kernels take as they are.
 */
import { FloatLinear, GgmlBlockLinear, QuantLinear, type Linear } from "../model/linear.ts";
import type { QuantMatrix } from "../quant/types.ts";
import { GraphUnsupportedError } from "./errors.ts";

/** The matrix whose row i is row rows[i] of `m`. */
export function selectRows(m: Linear, rows: ArrayLike<number>, name: string): Linear {
  const n = rows.length;
  for (let i = 0; i < n; i++) {
    const r = rows[i]!;
    if (!Number.isInteger(r) || r < 0 || r >= m.rows) throw new GraphUnsupportedError(`${name}: row ${r} is outside 0..${m.rows - 1}`);
  }
  if (m instanceof FloatLinear) {
    const cols = m.cols, src = m.data;
    const out = src instanceof Float32Array ? new Float32Array(n * cols) : new Uint16Array(n * cols);
    for (let i = 0; i < n; i++) out.set(src.subarray(rows[i]! * cols, (rows[i]! + 1) * cols), i * cols);
    return new FloatLinear(m.dtype, out, n, cols);
  }
  if (m instanceof QuantLinear) {
    const q = m.matrix, W = q.rowWords, G = q.groupsPerRow;
    const weights = new Uint32Array(n * W);
    for (let i = 0; i < n; i++) weights.set(q.weights.subarray(rows[i]! * W, (rows[i]! + 1) * W), i * W);
    let scales: Uint32Array;
    if (q.scaleType === "f16") {
      // scale k in half (k & 1) of word k >> 1: a row's groups need not start on a word
      const src = new Uint16Array(q.scales.buffer, q.scales.byteOffset, q.scales.length * 2);
      scales = new Uint32Array(Math.ceil((n * G) / 2));
      const dst = new Uint16Array(scales.buffer);
      for (let i = 0; i < n; i++) dst.set(src.subarray(rows[i]! * G, (rows[i]! + 1) * G), i * G);
    } else {
      scales = new Uint32Array(n * G);
      for (let i = 0; i < n; i++) scales.set(q.scales.subarray(rows[i]! * G, (rows[i]! + 1) * G), i * G);
    }
    const matrix: QuantMatrix = { ...q, rows: n, weights, scales };
    return new QuantLinear(matrix);
  }
  if (m instanceof GgmlBlockLinear) {
    const t = m.tensor, R = t.rowBytes;
    const bytes = new Uint8Array(n * R);
    for (let i = 0; i < n; i++) bytes.set(t.bytes.subarray(rows[i]! * R, (rows[i]! + 1) * R), i * R);
    return new GgmlBlockLinear(t.type, bytes, n, t.cols, name);
  }
  throw new GraphUnsupportedError(`${name}: a ${m.kind} matrix cannot be split into its rows for the GPU`);
}
