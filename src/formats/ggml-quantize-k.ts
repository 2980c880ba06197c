/**
 * GGML's K-quant encodings Q4_K, Q5_K, Q6_K from f32 rows (256-element super-blocks), following the
 * reference quantizers llama-quantize runs when it has no importance matrix (ggml-quants.c:
 * quantize_row_q4_K_ref / q5_K_ref over make_qkx2_quants, quantize_row_q6_K_ref over make_qx_quants):
 * the same candidate scales searched per sub-block, the same 6-bit (Q4_K/Q5_K) or 8-bit (Q6_K)
 * sub-block scales under an f16 super-block scale, and the same final requantization against the
 * scales as stored. Layouts: src/quant/FORMATS.md, "GGML block formats"; the bytes decode with
 * dequantizeGgmlRow (src/quant/ggml-blocks.ts).
 *
 * Not bit for bit (a file defines its own weights, so readers need only the layout): sums are f64,
 * and each candidate's weighted squared error comes from its sums (s²Σwl² + 2smΣwl - 2sΣwlx + m²Σw
 * - 2mΣwx + Σwx²) instead of a second pass over the values, which halves the search's work; near
 * ties between candidates can go the other way. The error is GGML's (test/make-model-kquant.test.ts
 * holds it to llama-quantize's on the same values).
 */
import { f16ToF32Table, f32ToF16Bits } from "../quant/half.ts";

export const QK_K = 256;
export const Q4_K_BLOCK_BYTES = 144; // f16 d, f16 dmin, u8 scales[12], u8 qs[128]
export const Q5_K_BLOCK_BYTES = 176; // f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
export const Q6_K_BLOCK_BYTES = 210; // u8 ql[128], u8 qh[64], i8 scales[16], f16 d

/**
 * `search: false` keeps each sub-block's plain candidate (its range for Q4_K/Q5_K, its largest
 * magnitude for Q6_K) and skips GGML's search over the others: the encoders 7-11x faster, 10-20% more
 * error (test/make-model-kquant.test.ts), the same layout. For benchmark files of random weights,
 * whose builds the search dominates; the default is the search.
 */
export interface KQuantOptions {
  search?: boolean;
}

/** GGML's GROUP_MAX_EPS: a group whose largest magnitude is below it is all zero. */
const GROUP_MAX_EPS = 1e-15;

/**
 * nearest_int: round to nearest, ties to even (C's float + 1.5*2^23 trick; here 1.5*2^52 for an f64).
 * Returns an integer-valued number; |v| stays far below 2^51 for every caller.
 */
const ROUNDER = 6755399441055744;
const nearestInt = (v: number): number => v + ROUNDER - ROUNDER;

function checkSuperBlocks(src: Float32Array, dst: Uint8Array, dstOffset: number, blockBytes: number, type: string): number {
  if (src.length % QK_K !== 0) throw new RangeError(`${type} blocks hold ${QK_K} values; got ${src.length}`);
  const blocks = src.length / QK_K;
  if (dstOffset + blocks * blockBytes > dst.length) throw new RangeError(`${type}: ${blocks * blockBytes} bytes do not fit at ${dstOffset} in ${dst.length}`);
  return blocks;
}

function putHalf(dst: Uint8Array, o: number, h: number): void {
  dst[o] = h & 0xff;
  dst[o + 1] = h >>> 8;
}

// Scratch of one super-block (encoders run one at a time per thread).
const values = new Float64Array(32);
const weights = new Float64Array(32);
const subScales = new Float64Array(16);
const subMins = new Float64Array(8);
const L = new Uint8Array(QK_K);
const scaleBytes = new Uint8Array(12);

/**
 * make_qkx2_quants for the 32 values in `values` with `weights`: the affine fit x ≈ scale*l - min,
 * l in 0..nmax, of least weighted squared error among GGML's candidates (the plain range, then
 * iscale = (nmax + rmin + rdelta*is) / range for is = 0..nstep, each refit by weighted least squares
 * with min <= 0). As in GGML a better fit moves `min` (and the range) for the candidates after it.
 * Writes subScales[j] and subMins[j] (the min as subtracted, >= 0).
 */
function fitScaleMin(nmax: number, rmin: number, rdelta: number, nstep: number, j: number): void {
  // nstep -1: the plain candidate alone (KQuantOptions.search false)
  const x = values, w = weights;
  let min = x[0]!;
  let max = min;
  let sumW = 0, sumX = 0, sumX2 = 0;
  for (let i = 0; i < 32; i++) {
    const v = x[i]!;
    if (v < min) min = v;
    if (v > max) max = v;
    const wi = w[i]!;
    sumW += wi;
    sumX += wi * v;
    sumX2 += wi * v * v;
  }
  if (min > 0) min = 0;
  if (max === min) {
    subScales[j] = 0;
    subMins[j] = -min;
    return;
  }
  let scale = 0;
  let best = Infinity;
  // is = -1: the plain candidate, l = round((x - min) * nmax / range), scale = range / nmax.
  // (A plain loop per candidate: Bun ran unrolled and tabulated variants slower.)
  for (let is = -1; is <= nstep; is++) {
    const iscale = (is < 0 ? nmax : rmin + rdelta * is + nmax) / (max - min);
    let sumL = 0, sumL2 = 0, sumXL = 0;
    for (let i = 0; i < 32; i++) {
      const v = x[i]!;
      let l = iscale * (v - min) + ROUNDER - ROUNDER; // nearestInt, inlined
      l = l < 0 ? 0 : l > nmax ? nmax : l;
      const wl = w[i]! * l;
      sumL += wl;
      sumL2 += wl * l;
      sumXL += wl * v;
    }
    let s: number, m: number;
    if (is < 0) {
      s = 1 / iscale;
      m = min;
    } else {
      const D = sumW * sumL2 - sumL * sumL;
      if (!(D > 0)) continue;
      s = (sumW * sumXL - sumX * sumL) / D;
      m = (sumL2 * sumX - sumL * sumXL) / D;
      if (m > 0) {
        m = 0;
        s = sumXL / sumL2;
      }
    }
    // Σw(s·l + m - x)² from the sums.
    const err = s * s * sumL2 + 2 * s * m * sumL - 2 * s * sumXL + m * m * sumW - 2 * m * sumX + sumX2;
    if (err < best) {
      best = err;
      scale = s;
      min = m; // later candidates start from this fit's min and range, as in GGML
    }
  }
  subScales[j] = scale;
  subMins[j] = -min;
}

/** A sub-block scale or min as 6 bits: round(x * inv), clamped to 0..63 (inv = 63 / the largest). */
function sixBit(x: number, inv: number): number {
  const l = nearestInt(inv * x);
  return l < 0 ? 0 : l > 63 ? 63 : l;
}

/**
 * Q4_K (nmax 15, high false) and Q5_K (nmax 31, high true): quantize_row_q4_K_ref / q5_K_ref.
 * Per sub-block of 32, weights av_x + |x| (av_x the sub-block's RMS) and make_qkx2_quants; the 8
 * scales and 8 mins to 6 bits against the largest (d = max/63, dmin = maxMin/63 as f16), then every
 * value again, l = round((x + dmin*m) / (d*sc)), against the stored scales.
 */
function encodeK4or5(src: Float32Array, dst: Uint8Array, dstOffset: number, high: boolean, search: boolean): number {
  const type = high ? "Q5_K" : "Q4_K";
  const blockBytes = high ? Q5_K_BLOCK_BYTES : Q4_K_BLOCK_BYTES;
  const blocks = checkSuperBlocks(src, dst, dstOffset, blockBytes, type);
  const nmax = high ? 31 : 15;
  const [rmin, rdelta, steps] = high ? [-0.5, 0.1, 15] : [-1, 0.1, 20];
  const nstep = search ? steps : -1;
  const f16 = f16ToF32Table();
  let o = dstOffset;
  for (let b = 0; b < blocks; b++) {
    const base = b * QK_K;
    let maxScale = 0;
    let maxMin = 0;
    for (let j = 0; j < 8; j++) {
      const s = base + 32 * j;
      let sumX2 = 0;
      for (let l = 0; l < 32; l++) sumX2 += src[s + l]! * src[s + l]!;
      const avX = Math.sqrt(sumX2 / 32);
      for (let l = 0; l < 32; l++) {
        values[l] = src[s + l]!;
        weights[l] = avX + Math.abs(src[s + l]!);
      }
      fitScaleMin(nmax, rmin, rdelta, nstep, j);
      if (subScales[j]! > maxScale) maxScale = subScales[j]!;
      if (subMins[j]! > maxMin) maxMin = subMins[j]!;
    }
    const invScale = maxScale > 0 ? 63 / maxScale : 0;
    const invMin = maxMin > 0 ? 63 / maxMin : 0;
    scaleBytes.fill(0);
    for (let j = 0; j < 8; j++) {
      const ls = sixBit(subScales[j]!, invScale);
      const lm = sixBit(subMins[j]!, invMin);
      subScales[j] = ls;
      subMins[j] = lm;
      // get_scale_min_k4's packing (FORMATS.md).
      if (j < 4) {
        scaleBytes[j] = ls;
        scaleBytes[j + 4] = lm;
      } else {
        scaleBytes[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
        scaleBytes[j - 4] |= (ls >> 4) << 6;
        scaleBytes[j] |= (lm >> 4) << 6;
      }
    }
    const dh = f32ToF16Bits(Math.fround(maxScale / 63));
    const dminh = f32ToF16Bits(Math.fround(maxMin / 63));
    const d = f16[dh]!, dmin = f16[dminh]!;
    for (let j = 0; j < 8; j++) {
      const dj = Math.fround(d * subScales[j]!);
      const s = base + 32 * j;
      // A zero scale decodes every value to -dmin*m, whatever l is.
      if (dj === 0) {
        L.fill(0, 32 * j, 32 * j + 32);
        continue;
      }
      const dm = Math.fround(dmin * subMins[j]!);
      for (let i = 0; i < 32; i++) {
        const l = nearestInt((src[s + i]! + dm) / dj);
        L[32 * j + i] = l < 0 ? 0 : l > nmax ? nmax : l;
      }
    }
    putHalf(dst, o, dh);
    putHalf(dst, o + 2, dminh);
    dst.set(scaleBytes, o + 4);
    const qh = o + 16;
    const qs = high ? o + 48 : o + 16;
    if (high) dst.fill(0, qh, qh + 32);
    for (let pair = 0; pair < 4; pair++) {
      const m1 = 1 << (2 * pair), m2 = 2 << (2 * pair);
      for (let i = 0; i < 32; i++) {
        let l1 = L[64 * pair + i]!;
        let l2 = L[64 * pair + 32 + i]!;
        if (l1 > 15) {
          l1 -= 16;
          dst[qh + i] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          dst[qh + i] |= m2;
        }
        dst[qs + 32 * pair + i] = l1 | (l2 << 4);
      }
    }
    o += blockBytes;
  }
  return o - dstOffset;
}

/** Q4_K super-blocks of 256 values (144 bytes each). Returns the bytes written. */
export function encodeQ4_K(src: Float32Array, dst: Uint8Array, dstOffset = 0, options: KQuantOptions = {}): number {
  return encodeK4or5(src, dst, dstOffset, false, options.search ?? true);
}

/** Q5_K super-blocks of 256 values (176 bytes each). Returns the bytes written. */
export function encodeQ5_K(src: Float32Array, dst: Uint8Array, dstOffset = 0, options: KQuantOptions = {}): number {
  return encodeK4or5(src, dst, dstOffset, true, options.search ?? true);
}

const xw = new Float64Array(16);
const xxw = new Float64Array(16);

/**
 * make_qx_quants(16, 32, x, L, rmse_type 1, no weights): the symmetric scale of the 16 values at
 * x[o..], l = clamp(round(x * iscale), -32, 31), that best fits x with weights x² among iscale =
 * -(32 + 0.1*is) / max for is = 0, ±1..±9 (max: the value of largest magnitude, with its sign).
 * The scale is the weighted least-squares one for its l. `search` false: is = 0 alone.
 */
function fitSymmetricScale(x: Float32Array, o: number, search: boolean): number {
  let max = 0;
  let amax = 0;
  for (let i = 0; i < 16; i++) {
    const v = x[o + i]!;
    const a = Math.abs(v);
    if (a > amax) {
      amax = a;
      max = v;
    }
    xw[i] = v * v; // the weight
    xxw[i] = v * v * v; // weight * x
  }
  if (amax < GROUP_MAX_EPS) return 0;
  let scale = 0;
  let best = 0;
  for (let is = 0, last = search ? 18 : 0; is <= last; is++) {
    // is = 0 first (GGML's plain candidate), then -9..-1, 1..9.
    const step = is === 0 ? 0 : is <= 9 ? is - 10 : is - 9;
    const iscale = -(32 + 0.1 * step) / max;
    let sumLX = 0, sumL2 = 0;
    for (let i = 0; i < 16; i++) {
      let l = nearestInt(iscale * x[o + i]!);
      l = l < -32 ? -32 : l > 31 ? 31 : l;
      sumLX += xxw[i]! * l;
      sumL2 += xw[i]! * l * l;
    }
    if (is === 0) {
      scale = sumL2 ? sumLX / sumL2 : 0;
      best = scale * sumLX;
    } else if (sumL2 > 0 && sumLX * sumLX > best * sumL2) {
      scale = sumLX / sumL2;
      best = scale * sumLX;
    }
  }
  return scale;
}

/**
 * Q6_K super-blocks of 256 values (210 bytes each): quantize_row_q6_K_ref. Per sub-block of 16,
 * make_qx_quants; the 16 scales to int8 against the one of largest magnitude (d = -max/128 as
 * f16, sc = min(127, round(scale / d))), then every value again, l = clamp(round(x / (d*sc)), -32, 31),
 * stored as l + 32. Returns the bytes written.
 */
export function encodeQ6_K(src: Float32Array, dst: Uint8Array, dstOffset = 0, options: KQuantOptions = {}): number {
  const search = options.search ?? true;
  const blocks = checkSuperBlocks(src, dst, dstOffset, Q6_K_BLOCK_BYTES, "Q6_K");
  const f16 = f16ToF32Table();
  let o = dstOffset;
  for (let b = 0; b < blocks; b++) {
    const base = b * QK_K;
    let maxScale = 0;
    let maxAbsScale = 0;
    for (let ib = 0; ib < 16; ib++) {
      const scale = fitSymmetricScale(src, base + 16 * ib, search);
      subScales[ib] = scale;
      if (Math.abs(scale) > maxAbsScale) {
        maxAbsScale = Math.abs(scale);
        maxScale = scale;
      }
    }
    if (maxAbsScale < GROUP_MAX_EPS) {
      dst.fill(0, o, o + Q6_K_BLOCK_BYTES);
      o += Q6_K_BLOCK_BYTES;
      continue;
    }
    const iscale = -128 / maxScale;
    const dh = f32ToF16Bits(Math.fround(1 / iscale));
    const d = f16[dh]!;
    for (let ib = 0; ib < 16; ib++) {
      const sc = Math.min(127, nearestInt(iscale * subScales[ib]!));
      dst[o + 192 + ib] = sc & 0xff;
      const dj = Math.fround(d * sc);
      const s = base + 16 * ib;
      // A zero scale decodes every value to 0, whatever l is.
      if (dj === 0) {
        L.fill(32, 16 * ib, 16 * ib + 16);
        continue;
      }
      for (let i = 0; i < 16; i++) {
        const l = nearestInt(src[s + i]! / dj);
        L[16 * ib + i] = (l < -32 ? -32 : l > 31 ? 31 : l) + 32;
      }
    }
    for (let n = 0; n < 2; n++) {
      const j = 128 * n;
      const ql = o + 64 * n, qh = o + 128 + 32 * n;
      for (let l = 0; l < 32; l++) {
        const a = L[j + l]!, bq = L[j + l + 32]!, c = L[j + l + 64]!, e = L[j + l + 96]!;
        dst[ql + l] = (a & 0xf) | ((c & 0xf) << 4);
        dst[ql + l + 32] = (bq & 0xf) | ((e & 0xf) << 4);
        dst[qh + l] = (a >> 4) | ((bq >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
      }
    }
    putHalf(dst, o + 208, dh);
    o += Q6_K_BLOCK_BYTES;
  }
  return o - dstOffset;
}
