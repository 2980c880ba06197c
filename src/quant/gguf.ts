/** Lossless conversion of GGUF Q4_0 / Q8_0 tensors into QuantMatrix (groupSize 32, f16 scales). */
import { GgufLayoutError, NonFiniteValueError, UnsupportedFormatError } from "./errors.ts";
import { f16ToF32Table } from "./half.ts";
import { createQuantMatrix } from "./layout.ts";
import type { QuantFormat, QuantMatrix } from "./types.ts";
import { checkDimension, validateQuantMatrix } from "./validate.ts";

const BLOCK = 32;
const Q4_0_BLOCK_BYTES = 18;
const Q8_0_BLOCK_BYTES = 34;

function checkGgufShape(name: string, bytes: Uint8Array, rows: number, cols: number, blockBytes: number): void {
  if (!(bytes instanceof Uint8Array)) throw new UnsupportedFormatError(`${name}: bytes must be a Uint8Array`);
  checkDimension("rows", rows);
  checkDimension("cols", cols);
  if (cols % BLOCK !== 0) {
    throw new GgufLayoutError(`${name}: cols must be a multiple of ${BLOCK} (GGUF block size), got ${cols}`);
  }
  const expected = rows * (cols / BLOCK) * blockBytes;
  if (bytes.length !== expected) {
    throw new GgufLayoutError(
      `${name}: a [${rows}, ${cols}] tensor is ${rows}*${cols / BLOCK} blocks of ${blockBytes} bytes = ${expected} bytes, got ${bytes.length}`,
    );
  }
}

/**
 * The matrix for a converted tensor: every weight word and scale is written by the conversion
 * (cols % 32 == 0 leaves no padding), so the q4 zero pattern is not pre-filled.
 */
function blankMatrix(format: QuantFormat, rows: number, cols: number): QuantMatrix {
  const m = createQuantMatrix(format, 1, cols, 32, "f16");
  return { ...m, rows, weights: new Uint32Array(rows * m.rowWords), scales: new Uint32Array(Math.ceil((rows * m.groupsPerRow) / 2)) };
}

/** Each block's leading f16 d, bit-exact, as the group scales (two per word, block k in half k & 1). */
function copyScales(bytes: Uint8Array, blocks: number, blockBytes: number, scales: Uint32Array): void {
  for (let k = 0, o = 0; k + 1 < blocks; k += 2, o += 2 * blockBytes) {
    scales[k >>> 1] = (bytes[o]! | (bytes[o + 1]! << 8) | (bytes[o + blockBytes]! << 16) | (bytes[o + blockBytes + 1]! << 24)) >>> 0;
  }
  if (blocks & 1) {
    const o = (blocks - 1) * blockBytes;
    scales[blocks >>> 1] = bytes[o]! | (bytes[o + 1]! << 8);
  }
}

const u32At = (b: Uint8Array, o: number) => (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;

/**
 * GGUF Q4_0: 18-byte blocks {f16 d; u8 qs[16]}; element j = (qs[j] & 15) - 8, element j+16 = (qs[j] >> 4) - 8.
 * The stored nibble is q + 8 in both layouts, so a block's four q4 words (FORMATS.md: word w holds
 * columns 8w..8w+7, byte k's low nibble column 8w+k and its high nibble column 8w+4+k) are nibble
 * shuffles of its qs words: no element is decoded.
 */
export function fromGgufQ4_0(bytes: Uint8Array, rows: number, cols: number): QuantMatrix {
  checkGgufShape("fromGgufQ4_0", bytes, rows, cols, Q4_0_BLOCK_BYTES);
  const m = blankMatrix("q4", rows, cols);
  const blocks = rows * (cols / BLOCK), w = m.weights;
  copyScales(bytes, blocks, Q4_0_BLOCK_BYTES, m.scales);
  const LOW = 0x0f0f0f0f, HIGH = 0xf0f0f0f0 | 0;
  // Blocks are 18 bytes: from an even address every field is 2-aligned, and 16-bit loads halve the reads.
  const h = (bytes.byteOffset & 1) === 0 ? new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 1) : undefined;
  for (let k = 0, o = 2, out = 0; k < blocks; k++, o += Q4_0_BLOCK_BYTES, out += 4) {
    let a: number, b: number, c: number, d: number;
    if (h) {
      const i = o >>> 1;
      a = h[i]! | (h[i + 1]! << 16); b = h[i + 2]! | (h[i + 3]! << 16); c = h[i + 4]! | (h[i + 5]! << 16); d = h[i + 6]! | (h[i + 7]! << 16);
    } else {
      a = u32At(bytes, o); b = u32At(bytes, o + 4); c = u32At(bytes, o + 8); d = u32At(bytes, o + 12);
    }
    // columns 0..15: the low nibbles of qs[0..15]; columns 16..31: their high nibbles
    w[out] = ((a & LOW) | ((b & LOW) << 4)) >>> 0;
    w[out + 1] = ((c & LOW) | ((d & LOW) << 4)) >>> 0;
    w[out + 2] = (((a >>> 4) & LOW) | (b & HIGH)) >>> 0;
    w[out + 3] = (((c >>> 4) & LOW) | (d & HIGH)) >>> 0;
  }
  validateQuantMatrix(m); // rejects NaN/Inf d, naming row and block
  return m;
}

/** GGUF Q8_0: 34-byte blocks {f16 d; i8 qs[32]}; -128 is kept as is. The q8 words are the qs bytes in order. */
export function fromGgufQ8_0(bytes: Uint8Array, rows: number, cols: number): QuantMatrix {
  checkGgufShape("fromGgufQ8_0", bytes, rows, cols, Q8_0_BLOCK_BYTES);
  const m = blankMatrix("q8", rows, cols);
  const blocks = rows * (cols / BLOCK), w = m.weights;
  copyScales(bytes, blocks, Q8_0_BLOCK_BYTES, m.scales);
  const h = (bytes.byteOffset & 1) === 0 ? new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 1) : undefined;
  for (let k = 0, o = 2, out = 0; k < blocks; k++, o += Q8_0_BLOCK_BYTES, out += 8) {
    if (h) for (let j = 0, i = o >>> 1; j < 8; j++, i += 2) w[out + j] = (h[i]! | (h[i + 1]! << 16)) >>> 0;
    else for (let j = 0; j < 8; j++) w[out + j] = u32At(bytes, o + 4 * j);
  }
  validateQuantMatrix(m); // rejects NaN/Inf d, naming row and block
  return m;
}

/**
 * Row `row` of a [rows, cols] GGUF Q4_0 / Q8_0 tensor as f32 into out[0..cols), straight from its
 * blocks (a prompt's embedding rows: no QuantMatrix is made per row). Each value is q x d with d the
 * block's f16 scale: exact in f32, so it equals dequantize(fromGgufQ*_0(...)) bit for bit. A NaN or
 * infinite d is rejected, naming the row and block.
 */
export function dequantizeGgufRow(type: "Q4_0" | "Q8_0", bytes: Uint8Array, rows: number, cols: number, row: number, out: Float32Array): void {
  const blockBytes = type === "Q4_0" ? Q4_0_BLOCK_BYTES : Q8_0_BLOCK_BYTES;
  if (cols % BLOCK !== 0) throw new GgufLayoutError(`dequantizeGgufRow: cols must be a multiple of ${BLOCK}, got ${cols}`);
  if (!Number.isInteger(row) || row < 0 || row >= rows) throw new GgufLayoutError(`row ${row} is outside 0..${rows - 1}`);
  const blocks = cols / BLOCK, base = row * blocks * blockBytes;
  if (bytes.length < (row + 1) * blocks * blockBytes) throw new GgufLayoutError(`dequantizeGgufRow: row ${row} ends past the tensor's ${bytes.length} bytes`);
  if (out.length < cols) throw new GgufLayoutError(`out holds ${out.length} values, a row has ${cols}`);
  const half = f16ToF32Table();
  for (let b = 0, o = base, c = 0; b < blocks; b++, o += blockBytes, c += BLOCK) {
    const d = half[bytes[o]! | (bytes[o + 1]! << 8)]!;
    if (!Number.isFinite(d)) throw new NonFiniteValueError(`row ${row}, block ${b}: scale d is ${d}`);
    if (type === "Q4_0") {
      for (let j = 0; j < 16; j++) {
        const q = bytes[o + 2 + j]!;
        out[c + j] = ((q & 15) - 8) * d;
        out[c + 16 + j] = ((q >>> 4) - 8) * d;
      }
    } else for (let j = 0; j < BLOCK; j++) out[c + j] = ((bytes[o + 2 + j]! << 24) >> 24) * d;
  }
}
