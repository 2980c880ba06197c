/**
 * GGML's tensor encodings, bit for bit as its reference quantizers compute them
 * (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`, `quantize_row_q5_0_ref`,
 * `quantize_row_q5_1_ref` in ggml-quants.c): every step rounded to f32 as C's float arithmetic does,
 * the block scales stored as IEEE half (round to nearest even). The K-quants are in ggml-quantize-k.ts.
 */
import { f32ToF16Bits } from "../quant/half.ts";
import { encodeQ4_K, encodeQ5_K, encodeQ6_K, type KQuantOptions } from "./ggml-quantize-k.ts";
import type { GgmlTypeName } from "./gguf-writer.ts";

export const QK = 32;
export const Q8_0_BLOCK_BYTES = 2 + QK;
export const Q4_0_BLOCK_BYTES = 2 + QK / 2;
export const Q4_1_BLOCK_BYTES = 4 + QK / 2;
export const Q5_0_BLOCK_BYTES = 6 + QK / 2;
export const Q5_1_BLOCK_BYTES = 8 + QK / 2;

const fround = Math.fround;

function checkBlocks(src: Float32Array, dst: Uint8Array, dstOffset: number, blockBytes: number): number {
  if (src.length % QK !== 0) throw new RangeError(`GGML blocks hold ${QK} values; got ${src.length}`);
  const blocks = src.length / QK;
  if (dstOffset + blocks * blockBytes > dst.length) throw new RangeError(`GGML: ${blocks * blockBytes} bytes do not fit at ${dstOffset} in ${dst.length}`);
  return blocks;
}

/**
 * Q8_0: per block of 32, d = amax / 127 and q = roundf(x / d) (as x * (1/d), halves away from zero).
 * Returns the bytes written (34 per block).
 */
export function encodeQ8_0(src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  const blocks = checkBlocks(src, dst, dstOffset, Q8_0_BLOCK_BYTES);
  let o = dstOffset;
  for (let b = 0; b < blocks; b++) {
    const base = b * QK;
    let amax = 0;
    for (let j = 0; j < QK; j++) {
      const a = Math.abs(src[base + j]!);
      if (a > amax) amax = a;
    }
    const d = fround(amax / 127);
    const id = d !== 0 ? fround(1 / d) : 0;
    const h = f32ToF16Bits(d);
    dst[o] = h & 0xff;
    dst[o + 1] = h >>> 8;
    o += 2;
    for (let j = 0; j < QK; j++) {
      const x = fround(src[base + j]! * id);
      // roundf, halves away from zero. |x| <= 127 and x is an f32, so x + 128.5 is exact in double
      // and truncating it gives floor(x + 0.5); only negative halves then need one less. Testing
      // x's sign first would be a branch mispredicted half the time.
      const r = ((x + 128.5) | 0) - 128;
      dst[o + j] = r - x === 0.5 && x < 0 ? r - 1 : r;
    }
    o += QK;
  }
  return o - dstOffset;
}

/**
 * Q4_0: per block of 32, max = the value of largest magnitude (the first, with its sign),
 * d = max / -8, q = min(15, trunc(x * (1/d) + 8.5)); value j and value j + 16 share byte j
 * (low nibble, high nibble). Returns the bytes written (18 per block).
 */
export function encodeQ4_0(src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  const blocks = checkBlocks(src, dst, dstOffset, Q4_0_BLOCK_BYTES);
  const half = QK / 2;
  let o = dstOffset;
  for (let b = 0; b < blocks; b++) {
    const base = b * QK;
    let amax = 0;
    let max = 0;
    for (let j = 0; j < QK; j++) {
      const v = src[base + j]!;
      const a = Math.abs(v);
      if (amax < a) {
        amax = a;
        max = v;
      }
    }
    const d = fround(max / -8);
    const id = d !== 0 ? fround(1 / d) : 0;
    const h = f32ToF16Bits(d);
    dst[o] = h & 0xff;
    dst[o + 1] = h >>> 8;
    o += 2;
    for (let j = 0; j < half; j++) {
      // C's (int8_t) truncation; x*id + 8.5 is in [0, 16.5] here.
      const lo = fround(fround(src[base + j]! * id) + 8.5) | 0;
      const hi = fround(fround(src[base + half + j]! * id) + 8.5) | 0;
      dst[o + j] = (lo > 15 ? 15 : lo) | ((hi > 15 ? 15 : hi) << 4);
    }
    o += half;
  }
  return o - dstOffset;
}

const putHalf = (dst: Uint8Array, o: number, value: number) => {
  const h = f32ToF16Bits(value);
  dst[o] = h & 0xff;
  dst[o + 1] = h >>> 8;
};

/** Smallest and largest value of block b (min starts at FLT_MAX, max at -FLT_MAX, as in C). */
function blockRange(src: Float32Array, base: number): [min: number, max: number] {
  let min = Infinity;
  let max = -Infinity;
  for (let j = 0; j < QK; j++) {
    const v = src[base + j]!;
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return [min, max];
}

/**
 * Q4_1: per block of 32, d = (max - min) / 15 and m = min, q = min(15, trunc((x - min) * (1/d) + 0.5));
 * value j and j + 16 share byte j. Returns the bytes written (20 per block).
 */
export function encodeQ4_1(src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  const blocks = checkBlocks(src, dst, dstOffset, Q4_1_BLOCK_BYTES);
  const half = QK / 2;
  let o = dstOffset;
  for (let b = 0; b < blocks; b++) {
    const base = b * QK;
    const [min, max] = blockRange(src, base);
    const d = fround((max - min) / 15);
    const id = d !== 0 ? fround(1 / d) : 0;
    putHalf(dst, o, d);
    putHalf(dst, o + 2, min);
    o += 4;
    for (let j = 0; j < half; j++) {
      const lo = fround(fround(fround(src[base + j]! - min) * id) + 0.5) | 0;
      const hi = fround(fround(fround(src[base + half + j]! - min) * id) + 0.5) | 0;
      dst[o + j] = (lo > 15 ? 15 : lo) | ((hi > 15 ? 15 : hi) << 4);
    }
    o += half;
  }
  return o - dstOffset;
}

/**
 * The 5-bit blocks' quants: low nibbles as Q4_0 packs them, bit 4 of value j in bit j of the
 * little-endian u32 qh (at qhOffset), followed by the 16 nibble bytes.
 */
function putQ5(dst: Uint8Array, qhOffset: number, q: Uint8Array): void {
  let qh = 0;
  for (let j = 0; j < QK / 2; j++) {
    const a = q[j]!, b = q[j + QK / 2]!;
    dst[qhOffset + 4 + j] = (a & 0xf) | ((b & 0xf) << 4);
    qh |= ((a >> 4) << j) | ((b >> 4) << (j + QK / 2));
  }
  dst[qhOffset] = qh & 0xff;
  dst[qhOffset + 1] = (qh >>> 8) & 0xff;
  dst[qhOffset + 2] = (qh >>> 16) & 0xff;
  dst[qhOffset + 3] = qh >>> 24;
}

const q5Scratch = new Uint8Array(QK);

/**
 * Q5_0: as Q4_0 with 5 bits: the value of largest magnitude (the first, with its sign) gives
 * d = max / -16, q = min(31, trunc(x * (1/d) + 16.5)). Returns the bytes written (22 per block).
 */
export function encodeQ5_0(src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  const blocks = checkBlocks(src, dst, dstOffset, Q5_0_BLOCK_BYTES);
  let o = dstOffset;
  for (let b = 0; b < blocks; b++) {
    const base = b * QK;
    let amax = 0;
    let max = 0;
    for (let j = 0; j < QK; j++) {
      const v = src[base + j]!;
      const a = Math.abs(v);
      if (amax < a) {
        amax = a;
        max = v;
      }
    }
    const d = fround(max / -16);
    const id = d !== 0 ? fround(1 / d) : 0;
    putHalf(dst, o, d);
    for (let j = 0; j < QK; j++) {
      // C's (int8_t) truncation; x*id + 16.5 is in [0, 32.5] here.
      const q = fround(fround(src[base + j]! * id) + 16.5) | 0;
      q5Scratch[j] = q > 31 ? 31 : q;
    }
    putQ5(dst, o + 2, q5Scratch);
    o += Q5_0_BLOCK_BYTES;
  }
  return o - dstOffset;
}

/**
 * Q5_1: as Q4_1 with 5 bits: d = (max - min) / 31, m = min, q = trunc((x - min) * (1/d) + 0.5)
 * (at most 31: GGML does not clamp). Returns the bytes written (24 per block).
 */
export function encodeQ5_1(src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  const blocks = checkBlocks(src, dst, dstOffset, Q5_1_BLOCK_BYTES);
  let o = dstOffset;
  for (let b = 0; b < blocks; b++) {
    const base = b * QK;
    const [min, max] = blockRange(src, base);
    const d = fround((max - min) / 31);
    const id = d !== 0 ? fround(1 / d) : 0;
    putHalf(dst, o, d);
    putHalf(dst, o + 2, min);
    for (let j = 0; j < QK; j++) q5Scratch[j] = fround(fround(fround(src[base + j]! - min) * id) + 0.5) | 0;
    putQ5(dst, o + 4, q5Scratch);
    o += Q5_1_BLOCK_BYTES;
  }
  return o - dstOffset;
}

type Float16ArrayCtor = new (buffer: ArrayBufferLike, byteOffset: number, length: number) => { set(values: ArrayLike<number>): void };
const Float16ArrayImpl = (globalThis as { Float16Array?: Float16ArrayCtor }).Float16Array;

/** IEEE half, round to nearest even, little-endian. Returns the bytes written (2 per value). */
export function encodeF16(src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  const bytes = src.length * 2;
  if (dstOffset + bytes > dst.length) throw new RangeError(`F16: ${bytes} bytes do not fit at ${dstOffset} in ${dst.length}`);
  // The runtime's Float16Array rounds the same way and is many times faster; it needs 2-byte alignment.
  if (Float16ArrayImpl && (dst.byteOffset + dstOffset) % 2 === 0) {
    new Float16ArrayImpl(dst.buffer, dst.byteOffset + dstOffset, src.length).set(src);
    return bytes;
  }
  for (let i = 0; i < src.length; i++) {
    const h = f32ToF16Bits(src[i]!);
    dst[dstOffset + 2 * i] = h & 0xff;
    dst[dstOffset + 2 * i + 1] = h >>> 8;
  }
  return bytes;
}

/** Plain little-endian f32 (the host's order: every host vkmoe runs on is little-endian). Returns the bytes written. */
export function encodeF32(src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  const bytes = src.length * 4;
  if (dstOffset + bytes > dst.length) throw new RangeError(`F32: ${bytes} bytes do not fit at ${dstOffset} in ${dst.length}`);
  dst.set(new Uint8Array(src.buffer, src.byteOffset, bytes), dstOffset);
  return bytes;
}

/** Encodes `src` (whole rows of the tensor, row-major) as `type` (`kQuant`: the K-quants' options). Returns the bytes written. */
export function encodeAs(type: GgmlTypeName, src: Float32Array, dst: Uint8Array, dstOffset = 0, kQuant: KQuantOptions = {}): number {
  switch (type) {
    case "Q8_0": return encodeQ8_0(src, dst, dstOffset);
    case "Q4_0": return encodeQ4_0(src, dst, dstOffset);
    case "Q4_1": return encodeQ4_1(src, dst, dstOffset);
    case "Q5_0": return encodeQ5_0(src, dst, dstOffset);
    case "Q5_1": return encodeQ5_1(src, dst, dstOffset);
    case "Q4_K": return encodeQ4_K(src, dst, dstOffset, kQuant);
    case "Q5_K": return encodeQ5_K(src, dst, dstOffset, kQuant);
    case "Q6_K": return encodeQ6_K(src, dst, dstOffset, kQuant);
    case "F16": return encodeF16(src, dst, dstOffset);
    case "F32": return encodeF32(src, dst, dstOffset);
    default: throw new RangeError(`no ${type} encoder`);
  }
}
