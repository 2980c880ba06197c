/**
 * The Qwen3.5 MoE decoder on the CPU path (transformers' Qwen3_5MoeForCausalLM). A call runs a
 * chunk of up to 64 consecutive tokens through every layer: RMSNorm (1 + w) → token mixer →
 * residual → RMSNorm → MoE (router top-k through the ExpertRunner, plus the shared expert scaled
 * by sigmoid(shared_expert_gate x)) → residual. The token mixer is, per layer,
 * - "linear" (Gated DeltaNet): in_proj_qkv → causal depthwise conv1d + SiLU (rolling state) →
 *   q, k, v; β = sigmoid(in_proj_b x); g = −exp(A_log) · softplus(in_proj_a x + dt_bias) → the
 *   gated delta rule (chunked over a prompt chunk, recurrent for one token) → gated RMSNorm with
 *   z = in_proj_z x → out_proj;
 * - "full": q_proj gives each head's query and an output gate; q/k RMSNorm; RoPE over the first
 *   rotaryDim dims of each head; causal GQA attention over the KV cache; × sigmoid(gate) → o_proj.
 * The state of a sequence: the KV cache of the full layers, the conv and recurrent states of the
 * linear ones.
 */
import type { Routing } from "../moe/routing.ts";
import { causalConv1dSilu, gatedDeltaRuleChunked, gatedDeltaRuleRecurrent, gatedRmsNorm, newDeltaRuleState, type DeltaRuleShape, type DeltaRuleState } from "./linear-attention.ts";
import type { CpuDecoder, DecoderState } from "./cpu-decoder.ts";
import { MAX_CHUNK, type DecoderObserver } from "./decoder.ts";
import type { ExpertRunner } from "./experts.ts";
import { KvCache } from "./kv-cache.ts";
import { attendCpu, rmsNorm, ropeInverseFrequencies, routeTopK, silu } from "./ops.ts";
import type { Qwen35MoeConfig } from "./qwen35-config.ts";
import type { DeltaNetWeights, GatedAttentionWeights, HybridLayerWeights, HybridWeights } from "./qwen35-weights.ts";

const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));
/** torch's softplus (beta 1, threshold 20). */
const softplus = (x: number) => (x > 20 ? x : Math.log1p(Math.exp(x)));

/** One sequence's state: the full layers' KV cache, the linear layers' conv and recurrent states. */
export class HybridState implements DecoderState {
  length = 0;
  readonly kv: KvCache;
  /** Per linear layer (in layer order): [channels, kernel − 1], oldest first. */
  readonly conv: Float32Array[];
  readonly delta: DeltaRuleState[];

  constructor(cfg: Qwen35MoeConfig, ctx: number, precision: "f32" | "f16") {
    const full = cfg.layerTypes.filter((t) => t === "full").length;
    const linear = cfg.layers - full;
    const { keyHeads, valueHeads, keyDim, valueDim, convKernel } = cfg.linear;
    const channels = 2 * keyHeads * keyDim + valueHeads * valueDim;
    this.kv = new KvCache(full, ctx, cfg.kvHeads, cfg.headDim, precision);
    this.conv = Array.from({ length: linear }, () => new Float32Array(channels * (convKernel - 1)));
    this.delta = Array.from({ length: linear }, () => newDeltaRuleState({ keyHeads, valueHeads, keyDim, valueDim }));
  }

  reset(): void {
    this.length = 0;
    this.kv.length = 0;
    for (const c of this.conv) c.fill(0);
    for (const d of this.delta) d.recurrent.fill(0);
  }

  get bytes(): number {
    return this.kv.bytes + this.conv.reduce((n, c) => n + c.byteLength, 0) + this.delta.reduce((n, d) => n + d.recurrent.byteLength, 0);
  }
}

export class HybridDecoder implements CpuDecoder {
  readonly rewindable = false;
  private readonly inv: Float32Array;
  private readonly shape: DeltaRuleShape;
  /** Layer l's index among the layers of its type (into the state's KV cache, or conv / delta states). */
  private readonly slot: number[];
  private readonly s: ReturnType<typeof scratch>;

  constructor(readonly cfg: Qwen35MoeConfig, readonly weights: HybridWeights, readonly experts: ExpertRunner) {
    this.inv = ropeInverseFrequencies(cfg.rotaryDim, cfg.ropeTheta, cfg.ropeFrequencies);
    const { keyHeads, valueHeads, keyDim, valueDim } = cfg.linear;
    this.shape = { keyHeads, valueHeads, keyDim, valueDim };
    const seen = { linear: 0, full: 0 };
    this.slot = cfg.layerTypes.map((t) => seen[t]++);
    this.s = scratch(cfg);
  }

  newState(ctx: number, precision: "f32" | "f16"): HybridState {
    return new HybridState(this.cfg, ctx, precision);
  }

  forward(ids: ArrayLike<number>, state: HybridState, logitRows: number, logits: Float32Array | undefined, observer?: DecoderObserver): void {
    const cfg = this.cfg, w = this.weights, s = this.s;
    const S = ids.length, D = cfg.hidden;
    const p0 = state.length;
    const h = s.h.subarray(0, S * D), xn = s.xn.subarray(0, S * D), y = s.y.subarray(0, S * D);
    for (let t = 0; t < S; t++) w.embed(ids[t]!, h.subarray(t * D, (t + 1) * D));
    observer?.hidden?.(-1, h, S);
    for (let l = 0; l < cfg.layers; l++) {
      const layer = w.layers[l]!;
      rmsNorm(h, layer.inputNorm, D, S, cfg.rmsEps, xn);
      if (layer.type === "linear") this.deltaNet(layer.linear!, this.slot[l]!, xn, S, state, y);
      else this.attention(layer.attention!, this.slot[l]!, xn, S, p0, state, y);
      for (let i = 0; i < S * D; i++) h[i] = h[i]! + y[i]!;
      rmsNorm(h, layer.postNorm, D, S, cfg.rmsEps, xn);
      this.moe(l, layer, xn, S, y, observer);
      for (let i = 0; i < S * D; i++) h[i] = h[i]! + y[i]!;
      observer?.hidden?.(l, h, S);
    }
    state.length = p0 + S;
    state.kv.length = p0 + S;
    if (logitRows > 0 && logits) {
      const rows = Math.min(logitRows, S);
      const last = xn.subarray(0, rows * D);
      rmsNorm(h.subarray((S - rows) * D, S * D), w.finalNorm, D, rows, cfg.rmsEps, last);
      observer?.hidden?.(cfg.layers, last, rows);
      w.lmHead.apply(last, rows, logits.subarray(0, rows * cfg.vocab));
    }
  }

  /** A Gated DeltaNet layer over xn [S, D] into y [S, D]; `slot` picks its conv and recurrent states. */
  private deltaNet(w: DeltaNetWeights, slot: number, xn: Float32Array, S: number, state: HybridState, y: Float32Array): void {
    const s = this.s, { keyHeads: KH, valueHeads: VH, keyDim: kd, valueDim: vd, convKernel } = this.cfg.linear;
    const Kd = KH * kd, Vd = VH * vd, C = 2 * Kd + Vd;
    const mixed = s.mixed.subarray(0, S * C), conv = s.conv.subarray(0, S * C);
    w.qkv.apply(xn, S, mixed);
    causalConv1dSilu(mixed, S, C, convKernel, w.conv, state.conv[slot]!, conv);
    const q = s.lq.subarray(0, S * Kd), k = s.lk.subarray(0, S * Kd), v = s.lv.subarray(0, S * Vd);
    for (let t = 0; t < S; t++) {
      const row = conv.subarray(t * C, (t + 1) * C);
      q.set(row.subarray(0, Kd), t * Kd);
      k.set(row.subarray(Kd, 2 * Kd), t * Kd);
      v.set(row.subarray(2 * Kd), t * Vd);
    }
    const z = s.z.subarray(0, S * Vd), b = s.b.subarray(0, S * VH), a = s.a.subarray(0, S * VH);
    w.z.apply(xn, S, z);
    w.b.apply(xn, S, b);
    w.a.apply(xn, S, a);
    const beta = s.beta.subarray(0, S * VH), g = s.g.subarray(0, S * VH);
    for (let t = 0; t < S; t++) {
      for (let hh = 0; hh < VH; hh++) {
        const i = t * VH + hh;
        beta[i] = sigmoid(b[i]!);
        g[i] = w.negA[hh]! * Math.fround(softplus(Math.fround(a[i]! + w.dtBias[hh]!)));
      }
    }
    const core = s.core.subarray(0, S * Vd), normed = s.normed.subarray(0, S * Vd);
    // as transformers: one cached token steps the recurrence, a longer run goes chunk-wise
    if (S === 1) gatedDeltaRuleRecurrent(this.shape, q, k, v, g, beta, S, state.delta[slot]!, core);
    else gatedDeltaRuleChunked(this.shape, q, k, v, g, beta, S, state.delta[slot]!, core);
    gatedRmsNorm(core, z, w.norm, S * VH, vd, this.cfg.rmsEps, normed);
    w.out.apply(normed, S, y);
  }

  /** A gated full-attention layer over xn [S, D] at positions p0.. into y [S, D]. */
  private attention(w: GatedAttentionWeights, slot: number, xn: Float32Array, S: number, p0: number, state: HybridState, y: Float32Array): void {
    const cfg = this.cfg, s = this.s;
    const { heads: H, kvHeads: KV, headDim: hd, rmsEps: eps } = cfg;
    const qg = s.qg.subarray(0, S * H * 2 * hd);
    const q = s.q.subarray(0, S * H * hd), gate = s.gate.subarray(0, S * H * hd);
    const k = s.k.subarray(0, S * KV * hd), v = s.v.subarray(0, S * KV * hd);
    w.q.apply(xn, S, qg);
    // q_proj's rows per head: the query's headDim, then the gate's
    for (let r = 0; r < S * H; r++) {
      q.set(qg.subarray(r * 2 * hd, r * 2 * hd + hd), r * hd);
      gate.set(qg.subarray(r * 2 * hd + hd, (r + 1) * 2 * hd), r * hd);
    }
    w.k.apply(xn, S, k);
    w.v.apply(xn, S, v);
    rmsNorm(q, w.qNorm, hd, S * H, eps, q);
    rmsNorm(k, w.kNorm, hd, S * KV, eps, k);
    const kv = state.kv, row = KV * hd;
    const keys = kv.keys[slot]!, values = kv.values[slot]!;
    for (let t = 0; t < S; t++) {
      partialRope(q, t * H * hd, H, hd, this.cfg.rotaryDim, p0 + t, this.inv);
      partialRope(k, t * row, KV, hd, this.cfg.rotaryDim, p0 + t, this.inv);
      kv.store(keys, k.subarray(t * row, (t + 1) * row), p0 + t);
      kv.store(values, v.subarray(t * row, (t + 1) * row), p0 + t);
    }
    const out = s.attn.subarray(0, S * H * hd);
    attendCpu(q, keys, values, S, p0, H, KV, hd, out, s.scores, s.acc);
    for (let i = 0; i < S * H * hd; i++) out[i] = out[i]! * Math.fround(sigmoid(gate[i]!));
    w.o.apply(out, S, y);
  }

  /**
   * Layer l's routed experts over xn [S, D] into y [S, D] from the router logits [S, E] (top-k,
   * renormalised): the host's half of the hybrid graph's split runs, and of moe() here.
   */
  routeAndRun(l: number, xn: Float32Array, logits: Float32Array, S: number, y: Float32Array, observer?: DecoderObserver): void {
    const cfg = this.cfg, s = this.s, E = cfg.experts, k = cfg.topK;
    const ids = s.ids.subarray(0, S * k), weights = s.weights.subarray(0, S * k);
    for (let t = 0; t < S; t++) routeTopK(logits.subarray(t * E, (t + 1) * E), E, k, true, s.probs, ids, weights, t * k);
    observer?.routing?.(l, ids, S, k);
    const routing: Routing = { S, k, ids, weights };
    this.experts.forward(l, xn, routing, y);
  }

  /** The MoE block over xn [S, D] into y [S, D]: routed experts plus the gated shared expert. */
  private moe(l: number, layer: HybridLayerWeights, xn: Float32Array, S: number, y: Float32Array, observer?: DecoderObserver): void {
    const cfg = this.cfg, s = this.s;
    const D = cfg.hidden, E = cfg.experts, k = cfg.topK, F = cfg.sharedIntermediate;
    const logits = s.router.subarray(0, S * E);
    layer.router.apply(xn, S, logits);
    this.routeAndRun(l, xn, logits, S, y, observer);
    const sh = layer.shared;
    const g = s.sg.subarray(0, S * F), u = s.su.subarray(0, S * F), out = s.so.subarray(0, S * D), scale = s.scale.subarray(0, S);
    sh.gate.apply(xn, S, g);
    sh.up.apply(xn, S, u);
    for (let i = 0; i < S * F; i++) g[i] = silu(g[i]!) * u[i]!;
    sh.down.apply(g, S, out);
    sh.scale.apply(xn, S, scale);
    for (let t = 0; t < S; t++) {
      const gs = Math.fround(sigmoid(scale[t]!));
      for (let d = 0; d < D; d++) y[t * D + d] = y[t * D + d]! + gs * out[t * D + d]!;
    }
  }
}

/**
 * Rotate-half RoPE over the first `rotaryDim` dims of each of `heads` heads (stride headDim) of one
 * token, in place; the other dims pass through (transformers' partial rotary).
 */
export function partialRope(x: Float32Array, offset: number, heads: number, headDim: number, rotaryDim: number, pos: number, inv: Float32Array): void {
  const half = rotaryDim / 2;
  for (let i = 0; i < half; i++) {
    const angle = Math.fround(pos * inv[i]!);
    const c = Math.fround(Math.cos(angle)), sn = Math.fround(Math.sin(angle));
    for (let h = 0; h < heads; h++) {
      const b = offset + h * headDim;
      const x1 = x[b + i]!, x2 = x[b + i + half]!;
      x[b + i] = x1 * c - x2 * sn;
      x[b + i + half] = x2 * c + x1 * sn;
    }
  }
}

function scratch(cfg: Qwen35MoeConfig) {
  const S = MAX_CHUNK, D = cfg.hidden, qd = cfg.heads * cfg.headDim, kd = cfg.kvHeads * cfg.headDim;
  const { keyHeads, valueHeads, keyDim, valueDim } = cfg.linear;
  const Kd = keyHeads * keyDim, Vd = valueHeads * valueDim, C = 2 * Kd + Vd;
  return {
    h: new Float32Array(S * D),
    xn: new Float32Array(S * D),
    y: new Float32Array(S * D),
    mixed: new Float32Array(S * C),
    conv: new Float32Array(S * C),
    lq: new Float32Array(S * Kd),
    lk: new Float32Array(S * Kd),
    lv: new Float32Array(S * Vd),
    z: new Float32Array(S * Vd),
    b: new Float32Array(S * valueHeads),
    a: new Float32Array(S * valueHeads),
    beta: new Float32Array(S * valueHeads),
    g: new Float32Array(S * valueHeads),
    core: new Float32Array(S * Vd),
    normed: new Float32Array(S * Vd),
    qg: new Float32Array(S * 2 * qd),
    q: new Float32Array(S * qd),
    gate: new Float32Array(S * qd),
    k: new Float32Array(S * kd),
    v: new Float32Array(S * kd),
    attn: new Float32Array(S * qd),
    scores: new Float64Array(cfg.maxPositions + MAX_CHUNK),
    acc: new Float64Array(cfg.headDim),
    router: new Float32Array(S * cfg.experts),
    probs: new Float64Array(cfg.experts),
    ids: new Int32Array(S * cfg.topK),
    weights: new Float32Array(S * cfg.topK),
    sg: new Float32Array(S * cfg.sharedIntermediate),
    su: new Float32Array(S * cfg.sharedIntermediate),
    so: new Float32Array(S * D),
    scale: new Float32Array(S),
  };
}
