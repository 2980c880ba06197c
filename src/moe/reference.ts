/** The MoE layer on the CPU: an f64 reference (the test oracle) and the f32 fallback the backend runs without a GPU. */
import { gateUpCpu, gemvCpu } from "../quant/gemv-cpu.ts";
import { gateUpReference, gemvReference } from "../quant/gemv-reference.ts";
import { gemvIntDotEmulated, quantizeActivations } from "../quant/intdot.ts";
import { swiglu } from "../quant/swiglu.ts";
import type { QuantMatrix } from "../quant/types.ts";
import type { Routing } from "./routing.ts";

export interface ExpertWeights {
  gate: QuantMatrix;
  up: QuantMatrix;
  down: QuantMatrix;
}

/**
 * Which GPU path the oracle models: "float"; "integer-dot" (gate+up on int8 activations, down in
 * float: the layer calls and the fused kernel); "integer-dot-grouped" (h quantized too, down on
 * int8 activations: the graph stage's grouped calls).
 */
export type MoePath = "float" | "integer-dot" | "integer-dot-grouped";

/**
 * y[S, D] = Σ_j w_j · down_j(silu(gate_j x) ⊙ up_j x) (+ shared), accumulated in f64. On the
 * "integer-dot" path gate and up see x quantized to int8 per group (quantizeActivations), exactly
 * as the GPU's quantize_act + integer-dot gate+up do; h is rounded to f32 as the GPU stores it
 * (and on "integer-dot-grouped" quantized in turn for down).
 */
export function moeReference(x: Float32Array, r: Routing, expert: (id: number) => ExpertWeights, shared?: ExpertWeights, limit?: number, path: MoePath = "float"): Float64Array {
  const D = expert(r.ids[0]!).gate.cols;
  const y = new Float64Array(r.S * D);
  const one = (e: ExpertWeights, xs: Float32Array, w: number, s: number) => {
    const out = expertReference(e, xs, limit, path);
    for (let d = 0; d < D; d++) y[s * D + d]! += w * out[d]!;
  };
  for (let s = 0; s < r.S; s++) {
    const xs = x.subarray(s * D, (s + 1) * D);
    for (let j = 0; j < r.k; j++) one(expert(r.ids[s * r.k + j]!), xs, r.weights[s * r.k + j]!, s);
    if (shared) one(shared, xs, r.sharedWeights?.[s] ?? 1, s);
  }
  return y;
}

/** One expert on one token row: down(silu(gate x) ⊙ up x) in f64, h rounded to f32 as the GPU stores it. */
export function expertReference(e: ExpertWeights, xs: Float32Array, limit?: number, path: MoePath = "float"): Float64Array {
  let h: Float64Array;
  if (path === "float") h = gateUpReference(e.gate, e.up, xs, 1, limit);
  else {
    const act = quantizeActivations(xs, 1, e.gate.cols, e.gate.groupSize);
    h = gemvIntDotEmulated(e.gate, act, 1);
    const u = gemvIntDotEmulated(e.up, act, 1);
    for (let i = 0; i < h.length; i++) h[i] = swiglu(h[i]!, u[i]!, limit);
    if (path === "integer-dot-grouped") return gemvIntDotEmulated(e.down, quantizeActivations(Float32Array.from(h), 1, e.down.cols, e.down.groupSize), 1);
  }
  return gemvReference(e.down, Float32Array.from(h), 1);
}

/** The same in f32 with the fast CPU GEMV; scratch buffers are the caller's so a call allocates nothing. */
export class MoeCpu {
  private h: Float32Array;
  private out: Float32Array;
  constructor(readonly hidden: number, readonly intermediate: number) {
    this.h = new Float32Array(intermediate);
    this.out = new Float32Array(hidden);
  }

  /** Adds w · expert(x_s) into y[s] for one (token, expert) pair. */
  addPair(e: ExpertWeights, x: Float32Array, s: number, w: number, y: Float32Array, limit?: number): void {
    const D = this.hidden;
    gateUpCpu(e.gate, e.up, x.subarray(s * D, (s + 1) * D), 1, this.h, limit);
    gemvCpu(e.down, this.h, 1, this.out);
    for (let d = 0; d < D; d++) y[s * D + d]! += w * this.out[d]!;
  }
}
