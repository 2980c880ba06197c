/** CPU GEMV kernels for q8 weights: signed bytes decoded straight from the words with shift pairs. */
import type { GemvJob } from "./gemv-job.ts";

/** One token: y[o] = sum_g scale(o,g) * sum_{c in g} q(o,c) * x[c]. */
export function q8SingleToken(job: GemvJob): void {
  const { weights: W, rows, rowWords, groupsPerRow, wordsPerGroup, f16Scales, scalesF32, scalesF16, halfTable, halfIndexFlip, x, y } = job;
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
        const c = w << 2;
        a0 += ((v << 24) >> 24) * x[c] + ((v << 16) >> 24) * x[c + 1];
        a1 += ((v << 8) >> 24) * x[c + 2] + (v >> 24) * x[c + 3];
      }
      const k = k0 + g;
      sum += (f16Scales ? halfTable[scalesF16[k ^ halfIndexFlip]] : scalesF32[k]) * (a0 + a1);
    }
    y[o] = sum;
  }
}

/** S tokens: each word is decoded once into four locals, then used for every token. */
export function q8MultiToken(job: GemvJob, partial: Float64Array, total: Float64Array): void {
  const { weights: W, rows, rowWords, groupsPerRow, wordsPerGroup, f16Scales, scalesF32, scalesF16, halfTable, halfIndexFlip, S, x, xStride, y } = job;
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
        const q0 = (v << 24) >> 24;
        const q1 = (v << 16) >> 24;
        const q2 = (v << 8) >> 24;
        const q3 = v >> 24;
        let c = w << 2;
        for (let s = 0; s < S; s++, c += xStride) {
          partial[s] += q0 * x[c] + q1 * x[c + 1] + q2 * x[c + 2] + q3 * x[c + 3];
        }
      }
      const k = k0 + g;
      const d = f16Scales ? halfTable[scalesF16[k ^ halfIndexFlip]] : scalesF32[k];
      for (let s = 0; s < S; s++) total[s] += d * partial[s];
    }
    for (let s = 0; s < S; s++) y[s * rows + o] = total[s];
  }
}
