/** Packing signed q values of one row into u32 words and back, in the q4/q8 column order of FORMATS.md. */
import type { QuantFormat } from "./types.ts";

/**
 * Packs q[0..rowWords*colsPerWord) into words[offset..offset+rowWords). q4 values must be in -8..7,
 * q8 values in -128..127. Callers zero-fill q beyond cols so padding is q = 0.
 */
export function packRow(format: QuantFormat, q: Int8Array, words: Uint32Array, offset: number, rowWords: number): void {
  if (format === "q8") {
    for (let w = 0; w < rowWords; w++) {
      const c = w * 4;
      words[offset + w] = ((q[c] & 0xff) | ((q[c + 1] & 0xff) << 8) | ((q[c + 2] & 0xff) << 16) | (q[c + 3] << 24)) >>> 0;
    }
    return;
  }
  for (let w = 0; w < rowWords; w++) {
    const c = w * 8;
    // Columns 0-3: low nibbles of bytes 0-3; columns 4-7: high nibbles of bytes 0-3.
    const low = (q[c] + 8) | ((q[c + 1] + 8) << 8) | ((q[c + 2] + 8) << 16) | ((q[c + 3] + 8) << 24);
    const high = (q[c + 4] + 8) | ((q[c + 5] + 8) << 8) | ((q[c + 6] + 8) << 16) | ((q[c + 7] + 8) << 24);
    words[offset + w] = (low | (high << 4)) >>> 0;
  }
}

/** Inverse of packRow: writes rowWords*colsPerWord signed q values into q. */
export function unpackRow(format: QuantFormat, words: Uint32Array, offset: number, rowWords: number, q: Int8Array): void {
  if (format === "q8") {
    for (let w = 0; w < rowWords; w++) {
      const v = words[offset + w];
      const c = w * 4;
      q[c] = (v << 24) >> 24;
      q[c + 1] = (v << 16) >> 24;
      q[c + 2] = (v << 8) >> 24;
      q[c + 3] = v >> 24;
    }
    return;
  }
  for (let w = 0; w < rowWords; w++) {
    const v = words[offset + w];
    const c = w * 8;
    q[c] = (v & 0xf) - 8;
    q[c + 1] = ((v >>> 8) & 0xf) - 8;
    q[c + 2] = ((v >>> 16) & 0xf) - 8;
    q[c + 3] = ((v >>> 24) & 0xf) - 8;
    q[c + 4] = ((v >>> 4) & 0xf) - 8;
    q[c + 5] = ((v >>> 12) & 0xf) - 8;
    q[c + 6] = ((v >>> 20) & 0xf) - 8;
    q[c + 7] = (v >>> 28) - 8;
  }
}
