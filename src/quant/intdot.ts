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
      let amax = 0;
      for (let i = start; i < end; i++) amax = Math.max(amax, Math.abs(x[i]));
      if (amax === 0) continue; // zero-initialized: scale 0, q 0, sum 0
      const e = frexpExponent(amax);
      const up = 2 ** (7 - e);
      let groupSum = 0;
      const out = s * paddedCols - s * cols; // q index of x index i
      for (let i = start; i < end; i++) {
        const qi = Math.min(127, Math.max(-127, roundHalfEven(x[i] * up)));
        q[out + i] = qi;
        groupSum += qi;
      }
      scale[s * groupsPerRow + g] = 2 ** (e - 7);
      sum[s * groupsPerRow + g] = groupSum;
    }
  }
  return { S, cols, groupSize, groupsPerRow, paddedCols, q, scale, sum };
}

/** 2^52 + 2^51: (v + ROUND_MAGIC) - ROUND_MAGIC rounds v half to even in f64, for |v| < 2^51. */
const ROUND_MAGIC = 6755399441055744;
/** POW2[k + 160] = 2^k for |k| <= 160 (a table: Math.pow per group was a third of the time). */
const POW2 = Float64Array.from({ length: 321 }, (_, i) => 2 ** (i - 160));
const f32Word = new Float32Array(1);
const u32Word = new Uint32Array(f32Word.buffer);

/**
 * quantizeActivations written straight into a kernel's layout, allocating nothing (the MoE layer
 * quantizes x on the host for calls of few tokens): xq[s*xqRowWords + w] packs columns 4w..4w+3
 * (byte j = column 4w+j, two's complement; words past the row's columns 0), scale and sum per
 * [s*groupsPerRow + g]. Bit-identical to quantizeActivations and to quantize_act.comp. x must be
 * finite and hold S*cols values; xqRowWords >= ceil(cols/4). Returns nothing: the outputs are the
 * arrays given.
 */
export function quantizeActivationsInto(x: Float32Array, S: number, cols: number, groupSize: number, xq: Uint32Array, xqRowWords: number, scale: Float32Array, sum: Int32Array): void {
  const groupsPerRow = Math.ceil(cols / groupSize);
  const M = ROUND_MAGIC;
  for (let s = 0; s < S; s++) {
    const row = s * cols, qRow = s * xqRowWords;
    xq.fill(0, qRow + (cols >>> 2), qRow + xqRowWords); // padding; a partial last word is rewritten below
    for (let g = 0; g < groupsPerRow; g++) {
      const start = row + g * groupSize;
      const end = row + Math.min((g + 1) * groupSize, cols);
      const end4 = start + ((end - start) & ~3); // groups start on a word: groupSize is a multiple of 4
      let amax = 0;
      for (let i = start; i < end; i++) {
        const a = Math.abs(x[i]!);
        if (a > amax) amax = a;
      }
      let w = qRow + ((start - row) >>> 2);
      if (amax === 0) {
        for (let i = start; i < end; i += 4) xq[w++] = 0;
        scale[s * groupsPerRow + g] = 0;
        sum[s * groupsPerRow + g] = 0;
        continue;
      }
      f32Word[0] = amax;
      const biased = (u32Word[0]! >>> 23) & 0xff;
      const e = biased !== 0 ? biased - 126 : 32 - Math.clz32(u32Word[0]! & 0x7fffff) - 149;
      const up = POW2[167 - e]!; // 2^(7-e): x * up is exact in f64 (x is f32, up a power of two), |x * up| < 128
      let groupSum = 0;
      let i = start;
      if (amax * up < 127.5) {
        // round half to even; nothing reaches ±127.5, so no clamp
        for (; i < end4; i += 4) {
          const q0 = (x[i]! * up + M) - M, q1 = (x[i + 1]! * up + M) - M, q2 = (x[i + 2]! * up + M) - M, q3 = (x[i + 3]! * up + M) - M;
          groupSum += (q0 + q1) + (q2 + q3);
          xq[w++] = (q0 & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) | (q3 << 24);
        }
      } else {
        for (; i < end4; i += 4) {
          const q0 = Math.max(-127, Math.min(127, (x[i]! * up + M) - M));
          const q1 = Math.max(-127, Math.min(127, (x[i + 1]! * up + M) - M));
          const q2 = Math.max(-127, Math.min(127, (x[i + 2]! * up + M) - M));
          const q3 = Math.max(-127, Math.min(127, (x[i + 3]! * up + M) - M));
          groupSum += (q0 + q1) + (q2 + q3);
          xq[w++] = (q0 & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) | (q3 << 24);
        }
      }
      if (i < end) { // the row's last, partial word
        let word = 0;
        for (let b = 0; i < end; i++, b++) {
          const q = Math.max(-127, Math.min(127, (x[i]! * up + M) - M));
          groupSum += q;
          word |= (q & 0xff) << (8 * b);
        }
        xq[w] = word;
      }
      scale[s * groupsPerRow + g] = POW2[153 + e]!; // 2^(e-7), 0 in f32 below 2^-149
      sum[s * groupsPerRow + g] = groupSum;
    }
  }
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
