/**
 * GGML's block formats Q4_1, Q5_0, Q5_1 (32 elements a block) and the K-quants Q4_K, Q5_K, Q6_K
 * (256-element super-blocks), kept in the file's own layout and dequantized bit for bit as
 * ggml-quants.c's dequantize_row_* do. Layouts and arithmetic: FORMATS.md, "GGML block formats".
 *
 * Exactness: every product GGML forms here (f16 scale x 6/8-bit sub-scale, then x a 4..6-bit q) is
 * exact in f32 (at most 11 + 7 + 5 = 23 significant bits), so only the final add/subtract rounds. JS
 * computes it in f64 and the Float32Array store rounds once; rounding an f64 sum of two f32 values
 * to f32 equals f32 arithmetic (53 >= 2*24 + 2), so the stored value is GGML's. The Math.fround
 * calls mark where C holds an f32 (they change nothing for valid input).
 */
import { GgufLayoutError, NonFiniteValueError, UnsupportedFormatError } from "./errors.ts";
import { f16ToF32Table } from "./half.ts";
import { checkDimension } from "./validate.ts";

export type GgmlBlockType = "Q4_1" | "Q5_0" | "Q5_1" | "Q4_K" | "Q5_K" | "Q6_K";
export const GGML_BLOCK_TYPES: readonly GgmlBlockType[] = ["Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"];

export interface GgmlBlockLayout {
  /** ggml.h's enum ggml_type id, as GGUF stores it. */
  ggmlType: number;
  /** Consecutive elements of a row one block holds. */
  blockElements: 32 | 256;
  blockBytes: number;
  /** Byte offsets of the block's f16 scales (d, and m or dmin where the format has one). */
  halfOffsets: readonly number[];
}

/** ggml-common.h's block structs (sizes include no padding: all fields are bytes or halves). */
export const GGML_BLOCK_LAYOUTS: Readonly<Record<GgmlBlockType, GgmlBlockLayout>> = {
  Q4_1: { ggmlType: 3, blockElements: 32, blockBytes: 20, halfOffsets: [0, 2] }, // f16 d, f16 m, u8 qs[16]
  Q5_0: { ggmlType: 6, blockElements: 32, blockBytes: 22, halfOffsets: [0] }, // f16 d, u8 qh[4], u8 qs[16]
  Q5_1: { ggmlType: 7, blockElements: 32, blockBytes: 24, halfOffsets: [0, 2] }, // f16 d, f16 m, u8 qh[4], u8 qs[16]
  Q4_K: { ggmlType: 12, blockElements: 256, blockBytes: 144, halfOffsets: [0, 2] }, // f16 d, f16 dmin, u8 scales[12], u8 qs[128]
  Q5_K: { ggmlType: 13, blockElements: 256, blockBytes: 176, halfOffsets: [0, 2] }, // f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
  Q6_K: { ggmlType: 14, blockElements: 256, blockBytes: 210, halfOffsets: [208] }, // u8 ql[128], u8 qh[64], i8 scales[16], f16 d
};

export function isGgmlBlockType(type: string): type is GgmlBlockType {
  return Object.hasOwn(GGML_BLOCK_LAYOUTS, type);
}

/** A [rows, cols] tensor in a GGML block layout, checked: `bytes` holds exactly rows * cols/blockElements blocks. */
export interface GgmlBlockTensor {
  readonly type: GgmlBlockType;
  readonly rows: number;
  readonly cols: number;
  readonly bytes: Uint8Array;
  /** Bytes of one row (cols / blockElements blocks). */
  readonly rowBytes: number;
}

/** Checks shape and byte length (GgufLayoutError, naming `name`) and returns the tensor. The bytes are not copied. */
export function ggmlBlockTensor(type: string, bytes: Uint8Array, rows: number, cols: number, name = "GGML tensor"): GgmlBlockTensor {
  if (!isGgmlBlockType(type)) {
    throw new UnsupportedFormatError(`${name}: unsupported GGML block type "${type}"; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
  }
  if (!(bytes instanceof Uint8Array)) throw new UnsupportedFormatError(`${name}: bytes must be a Uint8Array`);
  checkDimension("rows", rows);
  checkDimension("cols", cols);
  const { blockElements, blockBytes } = GGML_BLOCK_LAYOUTS[type];
  if (cols % blockElements !== 0) {
    throw new GgufLayoutError(`${name}: ${type} rows hold whole ${blockElements}-element blocks; cols must be a multiple of ${blockElements}, got ${cols}`);
  }
  const blocksPerRow = cols / blockElements;
  const expected = rows * blocksPerRow * blockBytes;
  if (bytes.length !== expected) {
    throw new GgufLayoutError(
      `${name}: a [${rows}, ${cols}] ${type} tensor is ${rows}*${blocksPerRow} blocks of ${blockBytes} bytes = ${expected} bytes, got ${bytes.length}`,
    );
  }
  return { type, rows, cols, bytes, rowBytes: blocksPerRow * blockBytes };
}

/**
 * Throws NonFiniteValueError naming row and block of the first f16 scale that is NaN or infinite (a corrupt
 * file: GGML itself would just produce NaN/Inf weights). Reads one or two halves per block.
 */
export function checkGgmlScalesFinite(t: GgmlBlockTensor, name = "GGML tensor"): void {
  const { blockBytes, halfOffsets } = GGML_BLOCK_LAYOUTS[t.type];
  const blocks = t.bytes.length / blockBytes;
  const blocksPerRow = t.rowBytes / blockBytes;
  for (let k = 0; k < blocks; k++) {
    for (const h of halfOffsets) {
      const p = k * blockBytes + h;
      if ((t.bytes[p + 1]! & 0x7c) === 0x7c) {
        throw new NonFiniteValueError(`${name}: row ${Math.floor(k / blocksPerRow)}, block ${k % blocksPerRow}: the f16 scale at byte ${h} of the ${t.type} block is NaN or infinite`);
      }
    }
  }
}

/** Writes one block's elements (32 or 256) as f32 to out[o..]; the block starts at bytes[p]. */
export type BlockDecoder = (bytes: Uint8Array, p: number, out: Float32Array, o: number) => void;

const fround = Math.fround;
const half = (b: Uint8Array, p: number, table: Float32Array) => table[b[p]! | (b[p + 1]! << 8)]!;
const u32 = (b: Uint8Array, p: number) => (b[p]! | (b[p + 1]! << 8) | (b[p + 2]! << 16) | (b[p + 3]! << 24)) >>> 0;

/** dequantize_row_q4_1: y = q*d + m, q = nibble (low nibbles are elements 0..15, high 16..31). */
function decodeQ4_1(b: Uint8Array, p: number, out: Float32Array, o: number): void {
  const t = f16ToF32Table();
  const d = half(b, p, t), m = half(b, p + 2, t);
  for (let j = 0; j < 16; j++) {
    const q = b[p + 4 + j]!;
    out[o + j] = (q & 15) * d + m;
    out[o + j + 16] = (q >> 4) * d + m;
  }
}

/** dequantize_row_q5_0: y = (q - 16)*d, q = nibble | bit j (element j) or bit j+16 (element j+16) of qh, as bit 4. */
function decodeQ5_0(b: Uint8Array, p: number, out: Float32Array, o: number): void {
  const d = half(b, p, f16ToF32Table());
  const qh = u32(b, p + 2);
  for (let j = 0; j < 16; j++) {
    const q = b[p + 6 + j]!;
    const h0 = ((qh >>> j) << 4) & 0x10;
    const h1 = (qh >>> (j + 12)) & 0x10;
    out[o + j] = (((q & 15) | h0) - 16) * d;
    out[o + j + 16] = (((q >> 4) | h1) - 16) * d;
  }
}

/** dequantize_row_q5_1: y = q*d + m with the 5-bit q of Q5_0 (no offset). */
function decodeQ5_1(b: Uint8Array, p: number, out: Float32Array, o: number): void {
  const t = f16ToF32Table();
  const d = half(b, p, t), m = half(b, p + 2, t);
  const qh = u32(b, p + 4);
  for (let j = 0; j < 16; j++) {
    const q = b[p + 8 + j]!;
    const h0 = ((qh >>> j) << 4) & 0x10;
    const h1 = (qh >>> (j + 12)) & 0x10;
    out[o + j] = ((q & 15) | h0) * d + m;
    out[o + j + 16] = ((q >> 4) | h1) * d + m;
  }
}

/**
 * get_scale_min_k4: the 6-bit scale (low byte of the result) and min (bits 8..13) of sub-block j
 * from the 12 packed bytes at s: j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split into a
 * nibble of byte j+4 and the top 2 bits of bytes j-4 (scale) and j (min).
 */
function scaleMinK4(b: Uint8Array, s: number, j: number): number {
  if (j < 4) return (b[s + j]! & 63) | ((b[s + j + 4]! & 63) << 8);
  const sc = (b[s + j + 4]! & 0xf) | ((b[s + j - 4]! >> 6) << 4);
  const m = (b[s + j + 4]! >> 4) | ((b[s + j]! >> 6) << 4);
  return sc | (m << 8);
}

/**
 * dequantize_row_q4_K / q5_K: 8 sub-blocks of 32; sub-block i has d_i = d*sc_i and m_i = dmin*m_i (f32),
 * y = d_i*q - m_i. Bytes qs[32k..32k+31] hold sub-block 2k in low nibbles and 2k+1 in high nibbles. For
 * Q5_K bit 2k (low nibble) or 2k+1 (high) of qh[l] adds 16 to element l of that pair.
 */
function decodeK4or5(b: Uint8Array, p: number, out: Float32Array, o: number, hasHigh: boolean): void {
  const t = f16ToF32Table();
  const d = half(b, p, t), dmin = half(b, p + 2, t);
  const scales = p + 4;
  const qh = p + 16;
  let qs = hasHigh ? p + 48 : p + 16;
  for (let pair = 0; pair < 4; pair++) {
    const a = scaleMinK4(b, scales, 2 * pair), c = scaleMinK4(b, scales, 2 * pair + 1);
    const d1 = fround(d * (a & 0xff)), m1 = fround(dmin * (a >> 8));
    const d2 = fround(d * (c & 0xff)), m2 = fround(dmin * (c >> 8));
    const u1 = 1 << (2 * pair), u2 = 2 << (2 * pair);
    const y = o + 64 * pair;
    for (let l = 0; l < 32; l++) {
      const q = b[qs + l]!;
      const h = hasHigh ? b[qh + l]! : 0;
      out[y + l] = d1 * ((q & 0xf) + (h & u1 ? 16 : 0)) - m1;
      out[y + 32 + l] = d2 * ((q >> 4) + (h & u2 ? 16 : 0)) - m2;
    }
    qs += 32;
  }
}

/** decodeK4or5 without the fifth bits: the same values, its inner loop free of Q5_K's test (a prompt's Q4_K embedding rows). */
function decodeQ4_K(b: Uint8Array, p: number, out: Float32Array, o: number): void {
  const t = f16ToF32Table();
  const d = half(b, p, t), dmin = half(b, p + 2, t);
  const scales = p + 4;
  for (let pair = 0, qs = p + 16, y = o; pair < 4; pair++, qs += 32, y += 64) {
    const a = scaleMinK4(b, scales, 2 * pair), c = scaleMinK4(b, scales, 2 * pair + 1);
    const d1 = fround(d * (a & 0xff)), m1 = fround(dmin * (a >> 8));
    const d2 = fround(d * (c & 0xff)), m2 = fround(dmin * (c >> 8));
    for (let l = 0; l < 32; l++) {
      const q = b[qs + l]!;
      out[y + l] = d1 * (q & 0xf) - m1;
      out[y + 32 + l] = d2 * (q >> 4) - m2;
    }
  }
}
const decodeQ5_K: BlockDecoder = (b, p, out, o) => decodeK4or5(b, p, out, o, true);

/**
 * dequantize_row_q6_K: 16 sub-blocks of 16 with int8 scales; y = (d*sc)*q, q = 4 bits of ql | 2 bits of
 * qh, minus 32. Per 128-element half n: element l (+32, +64, +96) takes ql[l] low, ql[l+32] low, ql[l]
 * high, ql[l+32] high nibble, and bits 0-1, 2-3, 4-5, 6-7 of qh[l]; scale index l/16 (+2, +4, +6). The
 * product stays a float one, as in C: an integer sc*q would turn GGML's -0 (d*sc < 0, q = 0) into +0.
 */
function decodeQ6_K(b: Uint8Array, p: number, out: Float32Array, o: number): void {
  const d = half(b, p + 208, f16ToF32Table());
  for (let n = 0; n < 2; n++) {
    const ql = p + 64 * n, qh = p + 128 + 32 * n, sc = p + 192 + 8 * n, y = o + 128 * n;
    for (let l = 0; l < 32; l++) {
      const is = sc + (l >> 4);
      const lo = b[ql + l]!, hi = b[ql + l + 32]!, h = b[qh + l]!;
      out[y + l] = fround(d * ((b[is]! << 24) >> 24)) * (((lo & 0xf) | ((h & 3) << 4)) - 32);
      out[y + l + 32] = fround(d * ((b[is + 2]! << 24) >> 24)) * (((hi & 0xf) | (((h >> 2) & 3) << 4)) - 32);
      out[y + l + 64] = fround(d * ((b[is + 4]! << 24) >> 24)) * (((lo >> 4) | (((h >> 4) & 3) << 4)) - 32);
      out[y + l + 96] = fround(d * ((b[is + 6]! << 24) >> 24)) * (((hi >> 4) | (((h >> 6) & 3) << 4)) - 32);
    }
  }
}

export const BLOCK_DECODERS: Readonly<Record<GgmlBlockType, BlockDecoder>> = {
  Q4_1: decodeQ4_1,
  Q5_0: decodeQ5_0,
  Q5_1: decodeQ5_1,
  Q4_K: decodeQ4_K,
  Q5_K: decodeQ5_K,
  Q6_K: decodeQ6_K,
};

/** Row r of the tensor as f32 into out[0..cols), exactly GGML's dequantized values. */
export function dequantizeGgmlRow(t: GgmlBlockTensor, r: number, out: Float32Array): void {
  if (!Number.isInteger(r) || r < 0 || r >= t.rows) throw new GgufLayoutError(`row ${r} is outside 0..${t.rows - 1}`);
  if (out.length < t.cols) throw new GgufLayoutError(`out holds ${out.length} values, a row has ${t.cols}`);
  const { blockElements, blockBytes } = GGML_BLOCK_LAYOUTS[t.type];
  const decode = BLOCK_DECODERS[t.type];
  const base = r * t.rowBytes;
  for (let b = 0, c = 0; c < t.cols; b++, c += blockElements) decode(t.bytes, base + b * blockBytes, out, c);
}

/** The whole tensor as f32, row-major [rows, cols] (tests and one-off conversions; the GEMV never makes this). */
export function dequantizeGgml(t: GgmlBlockTensor): Float32Array {
  const out = new Float32Array(t.rows * t.cols);
  for (let r = 0; r < t.rows; r++) dequantizeGgmlRow(t, r, out.subarray(r * t.cols, (r + 1) * t.cols));
  return out;
}
