/**
 * GGML's tensor encodings, bit for bit as its reference quantizers compute them
 * (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref` in ggml-quants.c): every step rounded to f32
 * as C's float arithmetic does, the block scale stored as IEEE half (round to nearest even).
 */
import { f32ToF16Bits } from "../quant/half.ts";
import type { GgmlTypeName } from "./gguf-writer.ts";

export const QK = 32;
export const Q8_0_BLOCK_BYTES = 2 + QK;
export const Q4_0_BLOCK_BYTES = 2 + QK / 2;

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

/** Encodes `src` (whole rows of the tensor, row-major) as `type`. Returns the bytes written. */
export function encodeAs(type: GgmlTypeName, src: Float32Array, dst: Uint8Array, dstOffset = 0): number {
  switch (type) {
    case "Q8_0": return encodeQ8_0(src, dst, dstOffset);
    case "Q4_0": return encodeQ4_0(src, dst, dstOffset);
    case "F16": return encodeF16(src, dst, dstOffset);
    case "F32": return encodeF32(src, dst, dstOffset);
    default: throw new RangeError(`no ${type} encoder: the writer takes such blocks as they are (llama-quantize makes them)`);
  }
}
