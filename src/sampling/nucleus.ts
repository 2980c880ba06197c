/**
 * Top-p over the whole vocabulary (top-k off) without sorting it. A histogram of each token's distance below
 * the largest logit, in buckets of 1/32 nat, holds each bucket's probability mass; summing buckets best-first
 * finds the one bucket where the running mass reaches p, and only that bucket's tokens are sorted. Exact: the
 * result is the same prefix a full sort would give, up to the rounding of the running sum.
 */
import { sortBestFirst } from "./select.ts";

const BUCKETS_PER_NAT = 32;
const BUCKET_COUNT = 64 * BUCKETS_PER_NAT; // past 64 nats (weight < 1.7e-28) everything shares the last bucket

/** The last token kept: token i is kept iff logit_i > value, or logit_i === value and i <= id. */
export interface Cut {
  value: number;
  id: number;
}

/** Scratch reused across calls: no allocation per call. */
export class NucleusScratch {
  readonly mass = new Float64Array(BUCKET_COUNT);
  readonly ids: Int32Array;
  readonly values: Float64Array;
  constructor(vocab: number) {
    this.ids = new Int32Array(vocab);
    this.values = new Float64Array(vocab);
  }
}

function bucketOf(gap: number): number {
  return gap < BUCKET_COUNT / BUCKETS_PER_NAT ? (gap * BUCKETS_PER_NAT) | 0 : BUCKET_COUNT - 1;
}

/**
 * The smallest best-first prefix of `logits` whose probability, softmax(scale * logits), reaches topP
 * (llama.cpp's rule: keep tokens until the running sum is >= p, the token that crosses included).
 * `max` is the largest logit (finite); -Infinity and NaN logits are not candidates.
 */
export function nucleusCut(logits: Float32Array, max: number, scale: number, topP: number, scratch: NucleusScratch, cut: Cut): Cut {
  const { mass, ids, values } = scratch;
  mass.fill(0);
  let total = 0;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (!(v > -Infinity)) continue;
    const gap = (max - v) * scale;
    const weight = Math.exp(-gap);
    total += weight;
    mass[bucketOf(gap)] += weight;
  }
  let above = 0; // mass of the buckets before the one the cut falls in
  let cutBucket = -1;
  for (let b = 0; b < BUCKET_COUNT; b++) {
    if (mass[b] === 0 && b !== BUCKET_COUNT - 1) continue;
    cutBucket = b;
    if ((above + mass[b]) / total >= topP) break;
    above += mass[b];
  }
  let n = 0;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (!(v > -Infinity)) continue;
    if (bucketOf((max - v) * scale) !== cutBucket) continue;
    ids[n] = i;
    values[n++] = v;
  }
  if (n === 0) {
    // Rounding left the running sum short of p in every bucket: keep everything.
    cut.value = -Infinity;
    cut.id = -1;
    return cut;
  }
  sortBestFirst(ids, values, n);
  let running = above;
  for (let j = 0; j < n; j++) {
    running += Math.exp(-(max - values[j]) * scale);
    if (running / total >= topP || j === n - 1) {
      cut.value = values[j];
      cut.id = ids[j];
      break;
    }
  }
  return cut;
}
