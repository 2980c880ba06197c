/** The decoder's elementwise and attention ops on the CPU path, over f32 rows; sums in f64. */
import { bf16BitsToF32, f32ToBf16Bits } from "../quant/half.ts";

/** out[s] = x[s] / rms(x[s]) · w, for S rows of n. out may be x. */
export function rmsNorm(x: Float32Array, w: Float32Array, n: number, S: number, eps: number, out: Float32Array): void {
  for (let s = 0; s < S; s++) {
    const o = s * n;
    let sum = 0;
    for (let i = 0; i < n; i++) sum += x[o + i]! * x[o + i]!;
    // As transformers: the normalised value is rounded to f32 before the weight multiplies it.
    const inv = 1 / Math.sqrt(sum / n + eps);
    for (let i = 0; i < n; i++) out[o + i] = w[i]! * Math.fround(x[o + i]! * inv);
  }
}

/**
 * Inverse frequencies of rotate-half RoPE: theta^(-2i/d), i < d/2, in f32; "bf16" rounds them to
 * bfloat16 as transformers does for a bf16 checkpoint (its inv_freq buffer takes the model's dtype).
 */
export function ropeInverseFrequencies(headDim: number, theta: number, dtype: "f32" | "bf16" = "f32"): Float32Array {
  const inv = new Float32Array(headDim / 2);
  for (let i = 0; i < headDim / 2; i++) inv[i] = 1 / Math.pow(theta, Math.fround((2 * i) / headDim));
  if (dtype === "bf16") for (let i = 0; i < inv.length; i++) inv[i] = bf16BitsToF32(f32ToBf16Bits(inv[i]!));
  return inv;
}

/** Rotates `heads` heads of one token in place at position pos: x1' = x1 cos − x2 sin, x2' = x2 cos + x1 sin. */
export function applyRope(x: Float32Array, offset: number, heads: number, headDim: number, pos: number, inv: Float32Array): void {
  const half = headDim / 2;
  for (let i = 0; i < half; i++) {
    const angle = Math.fround(pos * inv[i]!);
    const c = Math.fround(Math.cos(angle)), s = Math.fround(Math.sin(angle));
    for (let h = 0; h < heads; h++) {
      const b = offset + h * headDim;
      const x1 = x[b + i]!, x2 = x[b + i + half]!;
      x[b + i] = x1 * c - x2 * s;
      x[b + i + half] = x2 * c + x1 * s;
    }
  }
}

/** Softmax in place over x[0..n). */
export function softmax(x: Float32Array | Float64Array, n: number): void {
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (x[i]! > max) max = x[i]!;
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const e = Math.exp(x[i]! - max);
    x[i] = e;
    sum += e;
  }
  for (let i = 0; i < n; i++) x[i] = x[i]! / sum;
}

export const silu = (g: number) => g / (1 + Math.exp(-g));

/**
 * The router of one token: softmax over E logits, the top k (highest first, ties to the lower id),
 * renormalised over the k when `normalize`. Writes k ids and weights at `at`.
 */
export function routeTopK(logits: Float32Array, E: number, k: number, normalize: boolean, probs: Float64Array, ids: Int32Array, weights: Float32Array, at: number): void {
  for (let e = 0; e < E; e++) probs[e] = logits[e]!;
  softmax(probs, E);
  let total = 0;
  for (let j = 0; j < k; j++) {
    let best = -1;
    for (let e = 0; e < E; e++) if (probs[e]! >= 0 && (best < 0 || probs[e]! > probs[best]!)) best = e;
    ids[at + j] = best;
    weights[at + j] = probs[best]!;
    total += probs[best]!;
    probs[best] = -1;
  }
  if (normalize) for (let j = 0; j < k; j++) weights[at + j] = weights[at + j]! / total;
}

/**
 * Causal attention of one layer over an f32 KV cache, as the decoder's CPU path computes it: token
 * t (of S, at position p0 + t) attends to positions 0..p0+t; query head h reads KV head
 * floor(h / (heads / kvHeads)) (GQA); scores scaled by 1/sqrt(headDim), softmax, weighted sum of
 * values, every sum in f64 (the weighted value sum too, rounded to f32 once at the end).
 * q: [S][heads][headDim]; keys, values: [positions][kvHeads][headDim] from position 0;
 * out: [S][heads][headDim]. `scores` is scratch of at least p0 + S entries.
 */
export function attendCpu(
  q: Float32Array, keys: Float32Array, values: Float32Array, S: number, p0: number,
  heads: number, kvHeads: number, headDim: number, out: Float32Array,
  scores: Float64Array = new Float64Array(p0 + S), acc: Float64Array = new Float64Array(headDim),
): void {
  const hd = headDim, row = kvHeads * hd, group = heads / kvHeads;
  const scale = 1 / Math.sqrt(hd);
  for (let t = 0; t < S; t++) {
    const n = p0 + t + 1; // causal: positions 0..p0+t
    for (let hh = 0; hh < heads; hh++) {
      const qo = (t * heads + hh) * hd, ko = Math.floor(hh / group) * hd;
      let max = -Infinity;
      for (let p = 0; p < n; p++) {
        let dot = 0;
        const kb = p * row + ko;
        for (let i = 0; i < hd; i++) dot += q[qo + i]! * keys[kb + i]!;
        scores[p] = dot * scale;
        if (scores[p]! > max) max = scores[p]!;
      }
      let sum = 0;
      for (let p = 0; p < n; p++) {
        scores[p] = Math.exp(scores[p]! - max);
        sum += scores[p]!;
      }
      acc.fill(0, 0, hd);
      for (let p = 0; p < n; p++) {
        const wgt = scores[p]! / sum;
        const vb = p * row + ko;
        for (let i = 0; i < hd; i++) acc[i] = acc[i]! + wgt * values[vb + i]!;
      }
      for (let i = 0; i < hd; i++) out[qo + i] = acc[i]!;
    }
  }
}
