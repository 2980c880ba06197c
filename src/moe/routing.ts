/**
 * The routing of one layer call, validated, and the work list the grouped kernels consume:
 * one entry per distinct expert with the (token, slot) pairs routed to it, so each expert's
 * weights are read once per call whatever S is. Built into preallocated typed arrays: no
 * allocation per call.
 */
import { InvalidArgumentError } from "../errors.ts";

export interface Routing {
  /** Tokens in this call, 1..64. */
  S: number;
  /** Experts per token, 1..16. */
  k: number;
  /** Expert ids, S*k, each in [0, E). */
  ids: Int32Array;
  /** Router weights, S*k, finite. */
  weights: Float32Array;
  /** Per-token weight of the shared expert (S), when the layer has one; default 1. */
  sharedWeights?: Float32Array;
}

export const MAX_TOKENS = 64;
/** Tokens a graph's prompt-chunk replay takes at most (VKMOE_PREFILL_CHUNK): the graphs' route and regrouping kernels take that many. */
export const CHUNK_MAX_TOKENS = 512;
export const MAX_TOP_K = 16;
export const MAX_EXPERTS = 512;

export class RoutingError extends InvalidArgumentError {}

/** Per-token marks for the duplicate check: dupMark[e] === dupStamp once token's expert e was seen. */
const dupMark = new Int32Array(MAX_EXPERTS);
let dupStamp = 0;

/** Throws a RoutingError on anything the kernels cannot take. O(S*k), allocates nothing on valid input. */
export function checkRouting(r: Routing, E: number): void {
  const S = r.S, k = r.k, ids = r.ids, weights = r.weights;
  if (!Number.isInteger(S) || S < 1 || S > MAX_TOKENS) throw new RoutingError(`S must be an integer in 1..${MAX_TOKENS}, got ${S}`);
  if (!Number.isInteger(k) || k < 1 || k > MAX_TOP_K) throw new RoutingError(`k must be an integer in 1..${MAX_TOP_K}, got ${k}`);
  if (!(ids instanceof Int32Array) || ids.length !== S * k) throw new RoutingError(`ids must be an Int32Array of S*k = ${S * k}`);
  if (!(weights instanceof Float32Array) || weights.length !== S * k) throw new RoutingError(`weights must be a Float32Array of S*k = ${S * k}`);
  const marks = E <= dupMark.length;
  for (let s = 0, i = 0; s < S; s++) {
    if (marks && ++dupStamp === 0x7fffffff) {
      dupMark.fill(0);
      dupStamp = 1;
    }
    for (let j = 0; j < k; j++, i++) {
      const e = ids[i]!;
      if (e < 0 || e >= E) throw new RoutingError(`expert id ${e} at token ${s}, slot ${j} is outside 0..${E - 1}`);
      if (!Number.isFinite(weights[i]!)) throw new RoutingError(`router weight at token ${s}, slot ${j} is ${weights[i]}`);
      if (marks) {
        if (dupMark[e] === dupStamp) throw new RoutingError(`token ${s} routes to expert ${e} twice`);
        dupMark[e] = dupStamp;
      } else {
        for (let j2 = 0; j2 < j; j2++) if (ids[s * k + j2] === e) throw new RoutingError(`token ${s} routes to expert ${e} twice`);
      }
    }
  }
  const sw = r.sharedWeights;
  if (sw !== undefined) {
    if (!(sw instanceof Float32Array) || sw.length !== S) throw new RoutingError(`sharedWeights must be a Float32Array of S = ${S}`);
    for (let s = 0; s < S; s++) if (!Number.isFinite(sw[s]!)) throw new RoutingError(`shared weight of token ${s} is ${sw[s]}`);
  }
}

/**
 * Work list of a call. Slot p = s*slotsPerToken + j holds token s's j-th expert (j = k is the
 * shared expert). Distinct experts in order of first appearance.
 */
export class WorkList {
  readonly capacityPairs: number;
  /** expert id of work item u (E = the shared expert). */
  readonly expert: Int32Array;
  readonly pairStart: Uint32Array;
  readonly pairCount: Uint32Array;
  /** Slots grouped by work item. */
  readonly pairs: Uint32Array;
  /** Weight of each slot (router weight, or the shared weight). */
  readonly slotWeight: Float32Array;
  items = 0;
  slotsPerToken = 0;
  private readonly seen: Int32Array;

  constructor(maxExperts = MAX_EXPERTS + 1, capacityPairs = MAX_TOKENS * (MAX_TOP_K + 1)) {
    this.capacityPairs = capacityPairs;
    this.expert = new Int32Array(capacityPairs);
    this.pairStart = new Uint32Array(capacityPairs);
    this.pairCount = new Uint32Array(capacityPairs);
    this.pairs = new Uint32Array(capacityPairs);
    this.slotWeight = new Float32Array(capacityPairs);
    this.seen = new Int32Array(maxExperts + 1).fill(-1);
  }

  /** Fills the list for `r` (already checked); `shared` adds the shared expert (id E) for every token. */
  build(r: Routing, E: number, shared: boolean): void {
    const S = r.S, k = r.k, ids = r.ids, weights = r.weights, sharedWeights = r.sharedWeights;
    const K = k + (shared ? 1 : 0);
    this.slotsPerToken = K;
    const { expert, pairStart, pairCount, pairs, slotWeight, seen } = this;
    let items = 0;
    // Pass 1: distinct experts and their pair counts.
    for (let s = 0; s < S; s++) {
      for (let j = 0; j < K; j++) {
        const e = j < k ? ids[s * k + j]! : E;
        let u = seen[e]!;
        if (u < 0) {
          u = seen[e] = items++;
          expert[u] = e;
          pairCount[u] = 0;
        }
        pairCount[u]!++;
      }
    }
    this.items = items;
    let at = 0;
    for (let u = 0; u < items; u++) {
      pairStart[u] = at;
      at += pairCount[u]!;
      pairCount[u] = 0;
    }
    // Pass 2: place slots.
    for (let s = 0; s < S; s++) {
      for (let j = 0; j < K; j++) {
        const e = j < k ? ids[s * k + j]! : E;
        const u = seen[e]!;
        const slot = s * K + j;
        pairs[pairStart[u]! + pairCount[u]!++] = slot;
        slotWeight[slot] = j < k ? weights[s * k + j]! : (sharedWeights?.[s] ?? 1);
      }
    }
    for (let u = 0; u < this.items; u++) seen[expert[u]!] = -1;
  }
}
