/** Lossless conversion of GGUF Q4_0 / Q8_0 tensors into QuantMatrix (groupSize 32, f16 scales). */
import { GgufLayoutError, UnsupportedFormatError } from "./errors.ts";
import { createQuantMatrix, setScaleBits } from "./layout.ts";
import { packRow } from "./pack.ts";
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
 * Shared walk over blocks: `decodeBlock(offset, q, c0)` writes the 32 q values of the block at byte `offset`
 * into q[c0..c0+32); the block's leading f16 d is copied bit-exact as the group scale.
 */
function convert(
  name: string,
  format: QuantFormat,
  bytes: Uint8Array,
  rows: number,
  cols: number,
  blockBytes: number,
  decodeBlock: (offset: number, q: Int8Array, c0: number) => void,
): QuantMatrix {
  checkGgufShape(name, bytes, rows, cols, blockBytes);
  const m = createQuantMatrix(format, rows, cols, 32, "f16");
  const blocksPerRow = cols / BLOCK;
  const rowQ = new Int8Array(m.rowWords * (format === "q4" ? 8 : 4)); // cols % 32 == 0: no padding columns
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < blocksPerRow; b++) {
      const offset = (r * blocksPerRow + b) * blockBytes;
      setScaleBits(m, r * blocksPerRow + b, bytes[offset] | (bytes[offset + 1] << 8));
      decodeBlock(offset + 2, rowQ, b * BLOCK);
    }
    packRow(format, rowQ, m.weights, r * m.rowWords, m.rowWords);
  }
  validateQuantMatrix(m); // rejects NaN/Inf d, naming row and block
  return m;
}

/** GGUF Q4_0: 18-byte blocks {f16 d; u8 qs[16]}; element j = (qs[j] & 15) - 8, element j+16 = (qs[j] >> 4) - 8. */
export function fromGgufQ4_0(bytes: Uint8Array, rows: number, cols: number): QuantMatrix {
  return convert("fromGgufQ4_0", "q4", bytes, rows, cols, Q4_0_BLOCK_BYTES, (offset, q, c0) => {
    for (let j = 0; j < 16; j++) {
      const byte = bytes[offset + j];
      q[c0 + j] = (byte & 15) - 8;
      q[c0 + j + 16] = (byte >> 4) - 8;
    }
  });
}

/** GGUF Q8_0: 34-byte blocks {f16 d; i8 qs[32]}; -128 is kept as is. */
export function fromGgufQ8_0(bytes: Uint8Array, rows: number, cols: number): QuantMatrix {
  return convert("fromGgufQ8_0", "q8", bytes, rows, cols, Q8_0_BLOCK_BYTES, (offset, q, c0) => {
    for (let j = 0; j < 32; j++) q[c0 + j] = (bytes[offset + j] << 24) >> 24;
  });
}
