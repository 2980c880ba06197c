/**
 * The Qwen3-MoE decoder on the CPU path, with the routed experts behind `ExpertRunner` (the MoE
 * layer on the GPU, or the CPU). A call runs a chunk of up to 64 consecutive tokens through every
 * layer: embedding; per layer RMSNorm → q/k/v → per-head q/k RMSNorm → RoPE → grouped-query causal
 * attention over the KV cache → o_proj → residual → RMSNorm → router top-k → experts → residual;
 * final norm; lm_head for the positions asked.
 */
import type { Routing } from "../moe/routing.ts";
import type { Qwen3MoeConfig } from "./config.ts";
import type { CpuDecoder } from "./cpu-decoder.ts";
import type { ExpertRunner } from "./experts.ts";
import { KvCache } from "./kv-cache.ts";
import { applyRope, attendCpu, rmsNorm, routeTopK, ropeInverseFrequencies, silu } from "./ops.ts";
import type { ModelWeights } from "./weights.ts";

export const MAX_CHUNK = 64;

/** Taps for tests and debugging: each layer's output hidden states and each MoE layer's routing. */
export interface DecoderObserver {
  hidden?(layer: number, h: Float32Array, S: number): void;
  routing?(layer: number, ids: Int32Array, S: number, k: number): void;
}

export class Decoder implements CpuDecoder {
  /** The state is the KV cache alone: dropping its last tokens is setting its length. */
  readonly rewindable = true;
  private readonly inv: Float32Array;
  private readonly s: ReturnType<typeof scratch>;

  constructor(readonly cfg: Qwen3MoeConfig, readonly weights: ModelWeights, readonly experts: ExpertRunner) {
    this.inv = ropeInverseFrequencies(cfg.headDim, cfg.ropeTheta, cfg.ropeFrequencies);
    this.s = scratch(cfg);
  }

  newState(ctx: number, precision: "f32" | "f16"): KvCache {
    const c = this.cfg;
    return new KvCache(c.layers, ctx, c.kvHeads, c.headDim, precision);
  }

  /**
   * Runs `ids` (1..64 tokens) at positions kv.length.. and appends them to the cache. Logits of
   * the last `logitRows` tokens (0: none) go to `logits` [logitRows, vocab].
   */
  forward(ids: ArrayLike<number>, kv: KvCache, logitRows: number, logits: Float32Array | undefined, observer?: DecoderObserver): void {
    const cfg = this.cfg, w = this.weights, s = this.s;
    const S = ids.length, D = cfg.hidden;
    const p0 = kv.length;
    const h = s.h.subarray(0, S * D);
    for (let t = 0; t < S; t++) w.embed(ids[t]!, h.subarray(t * D, (t + 1) * D));
    observer?.hidden?.(-1, h, S);
    for (let l = 0; l < cfg.layers; l++) {
      this.attention(l, h, S, p0, kv);
      this.feedForward(l, h, S, observer);
      observer?.hidden?.(l, h, S);
    }
    kv.length = p0 + S;
    if (logitRows > 0 && logits) {
      const rows = Math.min(logitRows, S);
      const last = s.xn.subarray(0, rows * D);
      rmsNorm(h.subarray((S - rows) * D, S * D), w.finalNorm, D, rows, cfg.rmsEps, last);
      observer?.hidden?.(cfg.layers, last, rows);
      w.lmHead.apply(last, rows, logits.subarray(0, rows * cfg.vocab));
    }
  }

  private attention(l: number, h: Float32Array, S: number, p0: number, kv: KvCache): void {
    const cfg = this.cfg, a = this.weights.layers[l]!.attention, s = this.s;
    const { hidden: D, heads: H, kvHeads: KV, headDim: hd, rmsEps: eps } = cfg;
    const xn = s.xn.subarray(0, S * D);
    rmsNorm(h, a.inputNorm, D, S, eps, xn);
    const q = s.q.subarray(0, S * H * hd), k = s.k.subarray(0, S * KV * hd), v = s.v.subarray(0, S * KV * hd);
    a.q.apply(xn, S, q);
    a.k.apply(xn, S, k);
    a.v.apply(xn, S, v);
    rmsNorm(q, a.qNorm, hd, S * H, eps, q);
    rmsNorm(k, a.kNorm, hd, S * KV, eps, k);
    const row = KV * hd;
    const keys = kv.keys[l]!, values = kv.values[l]!;
    for (let t = 0; t < S; t++) {
      applyRope(q, t * H * hd, H, hd, p0 + t, this.inv);
      applyRope(k, t * row, KV, hd, p0 + t, this.inv);
      kv.store(keys, k.subarray(t * row, (t + 1) * row), p0 + t);
      kv.store(values, v.subarray(t * row, (t + 1) * row), p0 + t);
    }
    const out = s.attn.subarray(0, S * H * hd);
    attendCpu(q, keys, values, S, p0, H, KV, hd, out, s.scores, s.acc);
    const o = s.o.subarray(0, S * D);
    a.o.apply(out, S, o);
    for (let i = 0; i < S * D; i++) h[i] = h[i]! + o[i]!;
  }

  /**
   * The MoE half of layer l from its router logits [S][E]: top-k per token, then the experts into
   * y [S][D]. Also the host's half of the GPU's split runs (src/graph), which compute xn and the
   * logits on the device.
   */
  routeAndRun(l: number, xn: Float32Array, logits: Float32Array, S: number, y: Float32Array, observer?: DecoderObserver): void {
    const cfg = this.cfg, s = this.s;
    const E = cfg.experts, k = cfg.topK;
    const ids = s.ids.subarray(0, S * k), weights = s.weights.subarray(0, S * k);
    for (let t = 0; t < S; t++) routeTopK(logits.subarray(t * E, (t + 1) * E), E, k, cfg.normTopkProb, s.probs, ids, weights, t * k);
    observer?.routing?.(l, ids, S, k);
    const routing: Routing = { S, k, ids, weights };
    this.experts.forward(l, xn, routing, y);
  }

  private feedForward(l: number, h: Float32Array, S: number, observer?: DecoderObserver): void {
    const cfg = this.cfg, layer = this.weights.layers[l]!, s = this.s;
    const D = cfg.hidden;
    const xn = s.xn.subarray(0, S * D);
    rmsNorm(h, layer.attention.postNorm, D, S, cfg.rmsEps, xn);
    const y = s.o.subarray(0, S * D);
    if (layer.router) {
      const logits = s.router.subarray(0, S * cfg.experts);
      layer.router.apply(xn, S, logits);
      this.routeAndRun(l, xn, logits, S, y, observer);
    } else {
      const m = layer.mlp!;
      const F = cfg.denseIntermediate;
      const g = s.gate.subarray(0, S * F), u = s.up.subarray(0, S * F);
      m.gate.apply(xn, S, g);
      m.up.apply(xn, S, u);
      for (let i = 0; i < S * F; i++) g[i] = silu(g[i]!) * u[i]!;
      m.down.apply(g, S, y);
    }
    for (let i = 0; i < S * D; i++) h[i] = h[i]! + y[i]!;
  }
}

function scratch(cfg: Qwen3MoeConfig) {
  const S = MAX_CHUNK, D = cfg.hidden, qd = cfg.heads * cfg.headDim, kd = cfg.kvHeads * cfg.headDim;
  const F = Math.max(cfg.denseIntermediate, 1);
  return {
    h: new Float32Array(S * D),
    xn: new Float32Array(S * D),
    q: new Float32Array(S * qd),
    k: new Float32Array(S * kd),
    v: new Float32Array(S * kd),
    attn: new Float32Array(S * qd),
    o: new Float32Array(S * D),
    scores: new Float64Array(cfg.maxPositions + MAX_CHUNK),
    acc: new Float64Array(cfg.headDim),
    router: new Float32Array(S * Math.max(cfg.experts, 1)),
    probs: new Float64Array(Math.max(cfg.experts, 1)),
    ids: new Int32Array(S * Math.max(cfg.topK, 1)),
    weights: new Float32Array(S * Math.max(cfg.topK, 1)),
    gate: new Float32Array(S * F),
    up: new Float32Array(S * F),
  };
}
