/**
 * CPU GEMV kernels for q4 weights. Nibbles are used unsigned (u = q + 8) and the offset is removed once per
 * group with the group's activation sum: sum (u - 8) x = sum u x - 8 sum x.
 */
import type { GemvJob } from "./gemv-job.ts";

/** Rows processed per pass of the lookup kernel: keeps the touched weight lines (rows * 64 B) inside L2. */
const LOOKUP_ROW_CHUNK = 4096;
/** Entries of one token's table for a 32-column block: 16 byte positions x 256 byte values. */
export const LOOKUP_TABLE_SIZE = 4096;

/** One token, multiply path (small matrices, where building lookup tables would not pay off). */
export function q4SingleToken(job: GemvJob): void {
  const { weights: W, rows, rowWords, groupsPerRow, wordsPerGroup, f16Scales, scalesF32, scalesF16, halfTable, halfIndexFlip, x, groupSums, y } = job;
  for (let o = 0; o < rows; o++) {
    const base = o * rowWords;
    const k0 = o * groupsPerRow;
    let sum = 0;
    for (let g = 0; g < groupsPerRow; g++) {
      const w0 = g * wordsPerGroup;
      const w1 = Math.min(w0 + wordsPerGroup, rowWords);
      let a0 = 0;
      let a1 = 0;
      for (let w = w0; w < w1; w++) {
        const v = W[base + w];
        const c = w << 3;
        a0 += (v & 15) * x[c] + ((v >>> 8) & 15) * x[c + 1] + ((v >>> 16) & 15) * x[c + 2] + ((v >>> 24) & 15) * x[c + 3];
        a1 += ((v >>> 4) & 15) * x[c + 4] + ((v >>> 12) & 15) * x[c + 5] + ((v >>> 20) & 15) * x[c + 6] + (v >>> 28) * x[c + 7];
      }
      const k = k0 + g;
      sum += (f16Scales ? halfTable[scalesF16[k ^ halfIndexFlip]] : scalesF32[k]) * (a0 + a1 - 8 * groupSums[g]);
    }
    y[o] = sum;
  }
}

/** S tokens, multiply path: each word is decoded once into eight locals, then used for every token. */
export function q4MultiToken(job: GemvJob, partial: Float64Array, total: Float64Array): void {
  const { weights: W, rows, rowWords, groupsPerRow, wordsPerGroup, f16Scales, scalesF32, scalesF16, halfTable, halfIndexFlip, S, x, xStride, groupSums, y } = job;
  for (let o = 0; o < rows; o++) {
    const base = o * rowWords;
    const k0 = o * groupsPerRow;
    for (let s = 0; s < S; s++) total[s] = 0;
    for (let g = 0; g < groupsPerRow; g++) {
      const w0 = g * wordsPerGroup;
      const w1 = Math.min(w0 + wordsPerGroup, rowWords);
      for (let s = 0; s < S; s++) partial[s] = 0;
      for (let w = w0; w < w1; w++) {
        const v = W[base + w];
        const u0 = v & 15;
        const u1 = (v >>> 8) & 15;
        const u2 = (v >>> 16) & 15;
        const u3 = (v >>> 24) & 15;
        const u4 = (v >>> 4) & 15;
        const u5 = (v >>> 12) & 15;
        const u6 = (v >>> 20) & 15;
        const u7 = v >>> 28;
        let c = w << 3;
        for (let s = 0; s < S; s++, c += xStride) {
          partial[s] +=
            u0 * x[c] + u1 * x[c + 1] + u2 * x[c + 2] + u3 * x[c + 3] +
            u4 * x[c + 4] + u5 * x[c + 5] + u6 * x[c + 6] + u7 * x[c + 7];
        }
      }
      const k = k0 + g;
      const d = f16Scales ? halfTable[scalesF16[k ^ halfIndexFlip]] : scalesF32[k];
      for (let s = 0; s < S; s++) total[s] += d * (partial[s] - 8 * groupSums[s * groupsPerRow + g]);
    }
    for (let s = 0; s < S; s++) y[s * rows + o] = total[s];
  }
}

/**
 * Fills table[0..4096) for the 32 columns starting at c0 of one token: entry (p << 8) + b is the dot of byte
 * value b at byte position p (word p >> 2, byte p & 3) with its two columns: (lo - 8) * x[lo col] + (hi - 8) * x[hi col].
 */
function buildByteTable(table: Float32Array, tableBase: number, x: Float64Array, c0: number): void {
  for (let p = 0; p < 16; p++) {
    const c = c0 + ((p >>> 2) << 3) + (p & 3);
    const xLow = x[c];
    const xHigh = x[c + 4];
    const rowBase = tableBase + (p << 8);
    for (let hi = 0; hi < 16; hi++) {
      const highPart = (hi - 8) * xHigh - 8 * xLow;
      const at = rowBase + (hi << 4);
      for (let lo = 0; lo < 16; lo++) table[at + lo] = highPart + lo * xLow;
    }
  }
}

/** q4Lookup for a single token: the same walk with the token loop and its offsets gone. */
export function q4LookupSingleToken(job: GemvJob, table: Float32Array, total: Float64Array): void {
  const { weights: W, rows, rowWords, groupsPerRow, wordsPerGroup, f16Scales, scalesF32, scalesF16, halfTable, halfIndexFlip, x, y } = job;
  const blocks = rowWords >>> 2;
  const groupShift = Math.log2(wordsPerGroup >>> 2);
  total.fill(0, 0, rows);
  for (let r0 = 0; r0 < rows; r0 += LOOKUP_ROW_CHUNK) {
    const r1 = Math.min(rows, r0 + LOOKUP_ROW_CHUNK);
    for (let block = 0; block < blocks; block++) {
      const w0 = block << 2;
      buildByteTable(table, 0, x, w0 << 3);
      const g = block >>> groupShift;
      let b = r0 * rowWords + w0;
      let k = r0 * groupsPerRow + g;
      for (let o = r0; o < r1; o++, b += rowWords, k += groupsPerRow) {
        const v0 = W[b];
        const v1 = W[b + 1];
        const v2 = W[b + 2];
        const v3 = W[b + 3];
        const a0 = table[v0 & 255] + table[256 + ((v0 >>> 8) & 255)] + (table[512 + ((v0 >>> 16) & 255)] + table[768 + (v0 >>> 24)]);
        const a1 = table[1024 + (v1 & 255)] + table[1280 + ((v1 >>> 8) & 255)] + (table[1536 + ((v1 >>> 16) & 255)] + table[1792 + (v1 >>> 24)]);
        const a2 = table[2048 + (v2 & 255)] + table[2304 + ((v2 >>> 8) & 255)] + (table[2560 + ((v2 >>> 16) & 255)] + table[2816 + (v2 >>> 24)]);
        const a3 = table[3072 + (v3 & 255)] + table[3328 + ((v3 >>> 8) & 255)] + (table[3584 + ((v3 >>> 16) & 255)] + table[3840 + (v3 >>> 24)]);
        const d = f16Scales ? halfTable[scalesF16[k ^ halfIndexFlip]] : scalesF32[k];
        total[o] += d * (a0 + a1 + (a2 + a3));
      }
    }
  }
  for (let o = 0; o < rows; o++) y[o] = total[o];
}

/**
 * Lookup path for large matrices: per block of 32 columns (4 words) build one 256-entry table per byte
 * position and token, then every row costs 16 lookups per token instead of 32 multiply-adds.
 * Walks blocks column-major inside chunks of rows; the 4 words of a row block are read once for all tokens.
 */
export function q4Lookup(job: GemvJob, tables: Float32Array, total: Float64Array): void {
  const { weights: W, rows, rowWords, groupsPerRow, wordsPerGroup, f16Scales, scalesF32, scalesF16, halfTable, halfIndexFlip, S, x, xStride, y } = job;
  const blocks = rowWords >>> 2;
  const groupShift = Math.log2(wordsPerGroup >>> 2); // blocks per group is 1, 2 or 4
  total.fill(0, 0, S * rows);
  for (let r0 = 0; r0 < rows; r0 += LOOKUP_ROW_CHUNK) {
    const r1 = Math.min(rows, r0 + LOOKUP_ROW_CHUNK);
    for (let block = 0; block < blocks; block++) {
      const w0 = block << 2;
      for (let s = 0; s < S; s++) buildByteTable(tables, s * LOOKUP_TABLE_SIZE, x, s * xStride + (w0 << 3));
      const g = block >>> groupShift;
      let b = r0 * rowWords + w0;
      let k = r0 * groupsPerRow + g;
      for (let o = r0; o < r1; o++, b += rowWords, k += groupsPerRow) {
        const v0 = W[b];
        const v1 = W[b + 1];
        const v2 = W[b + 2];
        const v3 = W[b + 3];
        const d = f16Scales ? halfTable[scalesF16[k ^ halfIndexFlip]] : scalesF32[k];
        for (let s = 0, t = 0; s < S; s++, t += LOOKUP_TABLE_SIZE) {
          const a0 = tables[t + (v0 & 255)] + tables[t + 256 + ((v0 >>> 8) & 255)] +
            (tables[t + 512 + ((v0 >>> 16) & 255)] + tables[t + 768 + (v0 >>> 24)]);
          const a1 = tables[t + 1024 + (v1 & 255)] + tables[t + 1280 + ((v1 >>> 8) & 255)] +
            (tables[t + 1536 + ((v1 >>> 16) & 255)] + tables[t + 1792 + (v1 >>> 24)]);
          const a2 = tables[t + 2048 + (v2 & 255)] + tables[t + 2304 + ((v2 >>> 8) & 255)] +
            (tables[t + 2560 + ((v2 >>> 16) & 255)] + tables[t + 2816 + (v2 >>> 24)]);
          const a3 = tables[t + 3072 + (v3 & 255)] + tables[t + 3328 + ((v3 >>> 8) & 255)] +
            (tables[t + 3584 + ((v3 >>> 16) & 255)] + tables[t + 3840 + (v3 >>> 24)]);
          total[s * rows + o] += d * (a0 + a1 + (a2 + a3));
        }
      }
    }
  }
  for (let i = 0; i < S * rows; i++) y[i] = total[i];
}
