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
export const MAX_TOP_K = 16;
export const MAX_EXPERTS = 512;

export class RoutingError extends InvalidArgumentError {}

export function checkRouting(r: Routing, E: number): void {
  if (!Number.isInteger(r.S) || r.S < 1 || r.S > MAX_TOKENS) throw new RoutingError(`S must be an integer in 1..${MAX_TOKENS}, got ${r.S}`);
  if (!Number.isInteger(r.k) || r.k < 1 || r.k > MAX_TOP_K) throw new RoutingError(`k must be an integer in 1..${MAX_TOP_K}, got ${r.k}`);
  if (!(r.ids instanceof Int32Array) || r.ids.length !== r.S * r.k) throw new RoutingError(`ids must be an Int32Array of S*k = ${r.S * r.k}`);
  if (!(r.weights instanceof Float32Array) || r.weights.length !== r.S * r.k) throw new RoutingError(`weights must be a Float32Array of S*k = ${r.S * r.k}`);
  for (let i = 0; i < r.ids.length; i++) {
    const e = r.ids[i]!;
    if (e < 0 || e >= E) throw new RoutingError(`expert id ${e} at token ${Math.floor(i / r.k)}, slot ${i % r.k} is outside 0..${E - 1}`);
    if (!Number.isFinite(r.weights[i]!)) throw new RoutingError(`router weight at token ${Math.floor(i / r.k)}, slot ${i % r.k} is ${r.weights[i]}`);
  }
  for (let s = 0; s < r.S; s++) {
    for (let j = 0; j < r.k; j++) for (let j2 = j + 1; j2 < r.k; j2++) {
      if (r.ids[s * r.k + j] === r.ids[s * r.k + j2]) throw new RoutingError(`token ${s} routes to expert ${r.ids[s * r.k + j]} twice`);
    }
  }
  if (r.sharedWeights !== undefined) {
    if (!(r.sharedWeights instanceof Float32Array) || r.sharedWeights.length !== r.S) throw new RoutingError(`sharedWeights must be a Float32Array of S = ${r.S}`);
    for (let s = 0; s < r.S; s++) if (!Number.isFinite(r.sharedWeights[s]!)) throw new RoutingError(`shared weight of token ${s} is ${r.sharedWeights[s]}`);
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
    const K = r.k + (shared ? 1 : 0);
    this.slotsPerToken = K;
    this.items = 0;
    const { expert, pairCount, seen } = this;
    // Pass 1: distinct experts and their pair counts.
    for (let s = 0; s < r.S; s++) {
      for (let j = 0; j < K; j++) {
        const e = j < r.k ? r.ids[s * r.k + j]! : E;
        let u = seen[e]!;
        if (u < 0) {
          u = seen[e] = this.items++;
          expert[u] = e;
          pairCount[u] = 0;
        }
        pairCount[u]!++;
      }
    }
    let at = 0;
    for (let u = 0; u < this.items; u++) {
      this.pairStart[u] = at;
      at += pairCount[u]!;
      pairCount[u] = 0;
    }
    // Pass 2: place slots.
    for (let s = 0; s < r.S; s++) {
      for (let j = 0; j < K; j++) {
        const e = j < r.k ? r.ids[s * r.k + j]! : E;
        const u = seen[e]!;
        const slot = s * K + j;
        this.pairs[this.pairStart[u]! + pairCount[u]!++] = slot;
        this.slotWeight[slot] = j < r.k ? r.weights[s * r.k + j]! : (r.sharedWeights?.[s] ?? 1);
      }
    }
    for (let u = 0; u < this.items; u++) seen[expert[u]!] = -1;
  }
}
