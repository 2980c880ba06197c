/**
 * CPU emulation of the GPU integer-dot path: activations quantized to int8 per group with power-of-two
 * scales (exact in f32 on any GPU), integer dot products per group, one float multiply-add per group.
 */
import { ShapeMismatchError, UnsupportedFormatError } from "./errors.ts";
import { f32Bits } from "./half.ts";
import { colsPerWord, decodeScales, groupsPerRowFor } from "./layout.ts";
import { unpackRow } from "./pack.ts";
import type { GroupSize, QuantMatrix } from "./types.ts";
import { checkDimension, checkFiniteActivations, checkGroupSize, checkTokenCount, validateQuantMatrix } from "./validate.ts";

export interface QuantizedActivations {
  S: number;
  cols: number;
  groupSize: GroupSize;
  groupsPerRow: number;
  /** Row stride of q: ceil(cols / 16) * 16. */
  paddedCols: number;
  /** [S][paddedCols] int8, zero beyond cols. */
  q: Int8Array;
  /** [S][groupsPerRow] power-of-two scales 2^(e-7) (as f32: below 2^-149 it is 0), or 0 for a zero group. */
  scale: Float32Array;
  /** [S][groupsPerRow] sum of q over the group (lets a q4 kernel use unsigned nibbles: sum((u-8) qx) = sum(u qx) - 8 sum). */
  sum: Int32Array;
}

/** e with v = m * 2^e, m in [0.5, 1), for a positive finite f32 v (C frexp), subnormals included. */
export function frexpExponent(v: number): number {
  const bits = f32Bits(v);
  const biased = (bits >>> 23) & 0xff;
  if (biased !== 0) return biased - 126;
  const mantissa = bits & 0x7fffff; // subnormal: v = mantissa * 2^-149
  return 32 - Math.clz32(mantissa) - 149;
}

/** Round half to even. */
function roundHalfEven(v: number): number {
  const floor = Math.floor(v);
  const diff = v - floor;
  if (diff > 0.5) return floor + 1;
  if (diff < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

/**
 * Per token s and group g: amax = max |x|; if amax == 0 the group is zero (scale 0, q 0). Otherwise
 * amax = m * 2^e with m in [0.5, 1) (frexp), scale = 2^(e-7), q = clamp(roundHalfEven(x * 2^(7-e)), -127, 127).
 */
export function quantizeActivations(x: Float32Array, S: number, cols: number, groupSize: number): QuantizedActivations {
  checkTokenCount(S);
  checkDimension("cols", cols);
  checkGroupSize(groupSize);
  if (!(x instanceof Float32Array)) throw new UnsupportedFormatError("x must be a Float32Array");
  if (x.length !== S * cols) throw new ShapeMismatchError(`x length must be S*cols = ${S}*${cols} = ${S * cols}, got ${x.length}`);
  checkFiniteActivations(x, S, cols);

  const groupsPerRow = groupsPerRowFor(cols, groupSize);
  const paddedCols = Math.ceil(cols / 16) * 16;
  const q = new Int8Array(S * paddedCols);
  const scale = new Float32Array(S * groupsPerRow);
  const sum = new Int32Array(S * groupsPerRow);
  for (let s = 0; s < S; s++) {
    for (let g = 0; g < groupsPerRow; g++) {
      const start = s * cols + g * groupSize;
      const end = s * cols + Math.min((g + 1) * groupSize, cols);
      const out = s * paddedCols - s * cols; // q index of x index i
      const r = quantizeGroup(x, start, end, q, out + start);
      scale[s * groupsPerRow + g] = r.scale;
      sum[s * groupsPerRow + g] = r.sum;
    }
  }
  return { S, cols, groupSize, groupsPerRow, paddedCols, q, scale, sum };
}

/**
 * One group x[start..end) by quantizeActivations' rule (quantize_act's, any group size: the GGML
 * integer-dot kernels use 16): its q into q[at..], its scale 2^(e-7) (0 for a zero group, q then
 * left as it is) and the sum of its q.
 */
export function quantizeGroup(x: ArrayLike<number>, start: number, end: number, q: Int8Array, at: number): { scale: number; sum: number } {
  let amax = 0;
  for (let i = start; i < end; i++) amax = Math.max(amax, Math.abs(x[i]!));
  if (amax === 0) return { scale: 0, sum: 0 };
  const e = frexpExponent(amax);
  const up = 2 ** (7 - e);
  let sum = 0;
  for (let i = start; i < end; i++) {
    const qi = Math.min(127, Math.max(-127, roundHalfEven(x[i]! * up)));
    q[at + i - start] = qi;
    sum += qi;
  }
  return { scale: Math.fround(2 ** (e - 7)), sum };
}

/** x (any length, a multiple of groupSize) as the integer dots see it: each group's q * scale (quantizeGroup's). */
export function dequantizedActivations(x: ArrayLike<number>, groupSize: number): Float64Array {
  const out = new Float64Array(x.length), q = new Int8Array(groupSize);
  for (let g = 0; g < x.length; g += groupSize) {
    const { scale } = quantizeGroup(x, g, g + groupSize, q, 0);
    for (let i = 0; i < groupSize; i++) out[g + i] = scale === 0 ? 0 : q[i]! * scale;
  }
  return out;
}

/** y[s*rows + o] = sum_g scale_x(s,g) * scale_w(o,g) * sum_{i in g} qx * qw, integer sums exact, in f64. */
export function gemvIntDotEmulated(m: QuantMatrix, act: QuantizedActivations, S: number): Float64Array {
  validateQuantMatrix(m);
  checkTokenCount(S);
  if (act.S !== S || act.cols !== m.cols || act.groupSize !== m.groupSize) {
    throw new ShapeMismatchError(
      `activations (S=${act.S}, cols=${act.cols}, groupSize=${act.groupSize}) do not match the matrix ` +
        `(S=${S}, cols=${m.cols}, groupSize=${m.groupSize})`,
    );
  }
  const { rows, cols, groupSize, groupsPerRow } = m;
  const weightScales = decodeScales(m);
  const rowQ = new Int8Array(m.rowWords * colsPerWord(m.format));
  const y = new Float64Array(S * rows);
  for (let o = 0; o < rows; o++) {
    unpackRow(m.format, m.weights, o * m.rowWords, m.rowWords, rowQ);
    for (let s = 0; s < S; s++) {
      const qx = s * act.paddedCols;
      let acc = 0;
      for (let g = 0; g < groupsPerRow; g++) {
        const end = Math.min((g + 1) * groupSize, cols);
        let dot = 0;
        for (let c = g * groupSize; c < end; c++) dot += act.q[qx + c] * rowQ[c];
        acc += act.scale[s * groupsPerRow + g] * weightScales[o * groupsPerRow + g] * dot;
      }
      y[s * rows + o] = acc;
    }
  }
  return y;
}
