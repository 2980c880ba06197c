/**
 * CPU GEMV straight over a GGML block tensor (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) in its file layout:
 * y[s, r] = sum_c x[s, c] * W[r, c]. Each block is dequantized once (GGML's exact f32 values) into a
 * small scratch and dotted with all S tokens, so no f32 copy of the matrix is ever made.
 */
import { ShapeMismatchError, UnsupportedFormatError } from "./errors.ts";
import { BLOCK_DECODERS, GGML_BLOCK_LAYOUTS, type GgmlBlockTensor } from "./ggml-blocks.ts";
import { checkDimension, checkFiniteActivations } from "./validate.ts";

/** Checks x [S, cols] and y [S, rows] against the tensor. */
function checkOperands(w: GgmlBlockTensor, x: Float32Array, S: number, y: Float32Array): void {
  checkDimension("token count S", S);
  if (!(x instanceof Float32Array)) throw new UnsupportedFormatError("x must be a Float32Array");
  if (!(y instanceof Float32Array)) throw new UnsupportedFormatError("y must be a Float32Array");
  if (x.length !== S * w.cols) throw new ShapeMismatchError(`x length must be S*cols = ${S}*${w.cols} = ${S * w.cols}, got ${x.length}`);
  if (y.length !== S * w.rows) throw new ShapeMismatchError(`y length must be S*rows = ${S}*${w.rows} = ${S * w.rows}, got ${y.length}`);
  checkFiniteActivations(x, S, w.cols);
}

/** y[s*rows + r] = x[s, :] · W[r, :] with f64 accumulation, for any S >= 1. */
export function gemvGgmlBlocks(w: GgmlBlockTensor, x: Float32Array, S: number, y: Float32Array): void {
  checkOperands(w, x, S, y);
  const { rows, cols, bytes, rowBytes } = w;
  const { blockElements: E, blockBytes } = GGML_BLOCK_LAYOUTS[w.type];
  const decode = BLOCK_DECODERS[w.type];
  const block = new Float32Array(E);
  const acc = new Float64Array(S);
  for (let r = 0; r < rows; r++) {
    acc.fill(0);
    for (let c0 = 0, p = r * rowBytes; c0 < cols; c0 += E, p += blockBytes) {
      decode(bytes, p, block, 0);
      for (let s = 0; s < S; s++) {
        const xo = s * cols + c0;
        // Four partial sums: shorter dependency chains (E is 32 or 256, a multiple of 4).
        let a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (let i = 0; i < E; i += 4) {
          a0 += block[i]! * x[xo + i]!;
          a1 += block[i + 1]! * x[xo + i + 1]!;
          a2 += block[i + 2]! * x[xo + i + 2]!;
          a3 += block[i + 3]! * x[xo + i + 3]!;
        }
        acc[s] = acc[s]! + a0 + a1 + a2 + a3;
      }
    }
    for (let s = 0; s < S; s++) y[s * rows + r] = acc[s]!;
  }
}
