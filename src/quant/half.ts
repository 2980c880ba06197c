/** Exact conversions between f32 and the 16-bit float encodings (IEEE binary16 and bfloat16). */

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** Bits of `value` rounded to f32 (round to nearest even, like Math.fround). */
export function f32Bits(value: number): number {
  f32Scratch[0] = value;
  return u32Scratch[0];
}

/** The f32 whose bits are `bits`. */
export function f32FromBits(bits: number): number {
  u32Scratch[0] = bits;
  return f32Scratch[0];
}

/** Value of the IEEE half with bits `h` (exact: every half is an f32). */
export function f16BitsToF32(h: number): number {
  const negative = (h & 0x8000) !== 0;
  const exponent = (h >>> 10) & 0x1f;
  const mantissa = h & 0x3ff;
  let magnitude: number;
  if (exponent === 0) magnitude = mantissa * 2 ** -24;
  else if (exponent === 31) magnitude = mantissa === 0 ? Infinity : NaN;
  else magnitude = (1024 + mantissa) * 2 ** (exponent - 25);
  return negative ? -magnitude : magnitude;
}

/**
 * Half bits of `value` taken as f32 (first rounded with Math.fround semantics), then rounded to the
 * nearest half, ties to even. Handles subnormals, overflow to infinity, signed zero, and NaN (stays NaN).
 */
export function f32ToF16Bits(value: number): number {
  const x = f32Bits(value);
  const sign = (x >>> 16) & 0x8000;
  const biased = (x >>> 23) & 0xff;
  const mantissa = x & 0x7fffff;
  if (biased === 0xff) return sign | 0x7c00 | (mantissa === 0 ? 0 : 0x200 | (mantissa >>> 13));
  const e = biased - 127;
  if (e >= -14) {
    // Normal half candidate: round 23 mantissa bits to 10; a carry correctly bumps the exponent.
    let bits = ((e + 15) << 10) + (mantissa >>> 13);
    const rest = mantissa & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (bits & 1) === 1)) bits++;
    return bits >= 0x7c00 ? sign | 0x7c00 : sign | bits;
  }
  if (e < -25 || biased === 0) return sign; // below half of the smallest subnormal (2^-25): zero
  // Half subnormal: count units of 2^-24, ties to even; rounding up to 0x400 yields the smallest normal.
  const full = mantissa | 0x800000;
  const shift = -e - 1; // 14..24
  let units = full >>> shift;
  const rest = full & ((1 << shift) - 1);
  const halfway = 1 << (shift - 1);
  if (rest > halfway || (rest === halfway && (units & 1) === 1)) units++;
  return sign | units;
}

/** Value of the bfloat16 with bits `b` (its bits are the top half of an f32). */
export function bf16BitsToF32(b: number): number {
  return f32FromBits((b & 0xffff) << 16);
}

/** Bits of `value` (taken as f32) rounded to bfloat16, ties to even; NaN stays NaN. */
export function f32ToBf16Bits(value: number): number {
  const x = f32Bits(value);
  if ((x & 0x7f800000) === 0x7f800000 && (x & 0x7fffff) !== 0) return ((x >>> 16) | 0x40) & 0xffff;
  const rounded = x + 0x7fff + ((x >>> 16) & 1);
  return (rounded >>> 16) & 0xffff;
}

let f16Table: Float32Array | undefined;

/** All 65536 half values as f32, built once; used to decode f16 scales in hot loops. */
export function f16ToF32Table(): Float32Array {
  if (f16Table === undefined) {
    f16Table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) f16Table[h] = f16BitsToF32(h);
  }
  return f16Table;
}

/** Decode a whole Uint16Array of half bits. */
export function f16ArrayToF32(src: Uint16Array): Float32Array {
  const table = f16ToF32Table();
  const out = new Float32Array(src.length);
  for (let i = 0; i < src.length; i++) out[i] = table[src[i]];
  return out;
}

/** Decode a whole Uint16Array of bfloat16 bits. */
export function bf16ArrayToF32(src: Uint16Array): Float32Array {
  const out = new Float32Array(src.length);
  const bits = new Uint32Array(out.buffer);
  for (let i = 0; i < src.length; i++) bits[i] = src[i] << 16;
  return out;
}
