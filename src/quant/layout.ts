/** Geometry of the q4/q8 layouts and element access (slow, per element: for tests, tools and converters). */
import { f16BitsToF32, f32FromBits } from "./half.ts";
import type { GroupSize, QuantFormat, QuantMatrix, ScaleType } from "./types.ts";

/** Columns held by one u32 weight word. */
export function colsPerWord(format: QuantFormat): 8 | 4 {
  return format === "q4" ? 8 : 4;
}

/** u32 words per row: ceil(cols / colsPerWord) rounded up to a multiple of 4 (16-byte rows). */
export function rowWordsFor(format: QuantFormat, cols: number): number {
  return Math.ceil(cols / (colsPerWord(format) * 4)) * 4;
}

/** Columns per row including zero padding: rowWords * colsPerWord. */
export function paddedColsFor(format: QuantFormat, cols: number): number {
  return rowWordsFor(format, cols) * colsPerWord(format);
}

export function groupsPerRowFor(cols: number, groupSize: GroupSize): number {
  return Math.ceil(cols / groupSize);
}

/** u32 words of scale storage for `count` scales. */
export function scaleWordsFor(scaleType: ScaleType, count: number): number {
  return scaleType === "f32" ? count : Math.ceil(count / 2);
}

/** The u32 pattern of a word whose every column is q = 0 (what padding and a fresh matrix hold). */
export function zeroWord(format: QuantFormat): number {
  return format === "q4" ? 0x88888888 : 0;
}

/** A matrix of the given geometry with every q = 0 and every scale = 0. */
export function createQuantMatrix(
  format: QuantFormat,
  rows: number,
  cols: number,
  groupSize: GroupSize,
  scaleType: ScaleType,
): QuantMatrix {
  const rowWords = rowWordsFor(format, cols);
  const groupsPerRow = groupsPerRowFor(cols, groupSize);
  const weights = new Uint32Array(rows * rowWords);
  if (format === "q4") weights.fill(zeroWord("q4"));
  const scales = new Uint32Array(scaleWordsFor(scaleType, rows * groupsPerRow));
  return { format, rows, cols, groupSize, scaleType, rowWords, groupsPerRow, weights, scales };
}

/** Word index within a row and bit offset of column `col`. */
export function columnBits(format: QuantFormat, col: number): { word: number; shift: number } {
  if (format === "q8") return { word: col >>> 2, shift: (col & 3) * 8 };
  const j = col & 7;
  return { word: col >>> 3, shift: j < 4 ? j * 8 : (j - 4) * 8 + 4 };
}

/** Signed q of (row, col) as stored. */
export function getQ(m: QuantMatrix, row: number, col: number): number {
  const { word, shift } = columnBits(m.format, col);
  const w = m.weights[row * m.rowWords + word];
  if (m.format === "q8") return ((w >>> shift) << 24) >> 24;
  return ((w >>> shift) & 0xf) - 8;
}

/** Store signed q at (row, col); q must already be in range (q4: -8..7, q8: -128..127). */
export function setQ(m: QuantMatrix, row: number, col: number, q: number): void {
  const { word, shift } = columnBits(m.format, col);
  const index = row * m.rowWords + word;
  const mask = m.format === "q8" ? 0xff : 0xf;
  const stored = m.format === "q8" ? q & 0xff : q + 8;
  m.weights[index] = ((m.weights[index] & ~(mask << shift)) | (stored << shift)) >>> 0;
}

/** Raw bits of scale k (f32 bits or f16 bits). */
export function getScaleBits(m: QuantMatrix, k: number): number {
  if (m.scaleType === "f32") return m.scales[k];
  return (m.scales[k >>> 1] >>> ((k & 1) * 16)) & 0xffff;
}

/** Store raw bits of scale k. */
export function setScaleBits(m: QuantMatrix, k: number, bits: number): void {
  if (m.scaleType === "f32") {
    m.scales[k] = bits >>> 0;
    return;
  }
  const shift = (k & 1) * 16;
  const index = k >>> 1;
  m.scales[index] = ((m.scales[index] & ~(0xffff << shift)) | ((bits & 0xffff) << shift)) >>> 0;
}

/** Value of scale k = row * groupsPerRow + group. */
export function getScale(m: QuantMatrix, k: number): number {
  const bits = getScaleBits(m, k);
  return m.scaleType === "f32" ? f32FromBits(bits) : f16BitsToF32(bits);
}

/** All scales as f32 values, index k = row * groupsPerRow + group. */
export function decodeScales(m: QuantMatrix): Float32Array {
  const count = m.rows * m.groupsPerRow;
  if (m.scaleType === "f32") return new Float32Array(m.scales.buffer, m.scales.byteOffset, count).slice();
  const out = new Float32Array(count);
  for (let k = 0; k < count; k++) out[k] = getScale(m, k);
  return out;
}
