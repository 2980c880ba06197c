/**
 * The tensors of a Qwen3.5 MoE checkpoint, from the Hub layout (safetensors) or llama.cpp's GGUF
 * (`qwen35moe`), turned into what the hybrid decoder computes with, always in the Hub's layout:
 *
 * - RMSNorm weights as the multiplier itself: the Hub stores w and the model multiplies by (1 + w)
 *   (Qwen3_5MoeRMSNorm); llama.cpp's converter already wrote w + 1. The gated norm of the linear
 *   layers multiplies by its plain weight in both.
 * - llama.cpp reorders the linear-attention value heads from grouped by key head (the Hub's
 *   [g0v0, g0v1, g1v0, g1v1]) to tiled ([g0v0, g1v0, g0v1, g1v1]) so that ggml can broadcast. The
 *   quantized matrices stay as the file holds them (no requantization): their outputs (qkv's value
 *   rows, z, a, b) are permuted back after the product and out_proj's input before it; the small
 *   float tensors (conv1d, A, dt_bias) are permuted on load. The decoder sees the Hub layout.
 * - A is kept as −exp(A_log) (what the GGUF stores), so both sources give g = A · softplus(a + dt_bias).
 */
import type { TensorFile, TensorView } from "../formats/tensor.ts";
import { ModelWeightsError } from "./errors.ts";
import { floatElements, isFloatDType, readFloatRow, type Linear } from "./linear.ts";
import type { Qwen35MoeConfig } from "./qwen35-config.ts";
import { embeddingReader, ggufExperts, hfExperts, toLinear, WeightReader, type ExpertFormat, type ExpertMatrices, type LayerExperts, type QuantPlan } from "./weights.ts";

export interface GatedAttentionWeights {
  /** [heads · 2 · headDim, D]: per head its query rows, then its output-gate rows. */
  q: Linear;
  k: Linear;
  v: Linear;
  o: Linear;
  qNorm: Float32Array;
  kNorm: Float32Array;
}

export interface DeltaNetWeights {
  /** [2 · keyHeads · keyDim + valueHeads · valueDim, D]: q, k, v channels, the conv's inputs. */
  qkv: Linear;
  z: Linear;
  b: Linear;
  a: Linear;
  /** Depthwise conv weights [channels, kernel]. */
  conv: Float32Array;
  /** −exp(A_log) per value head. */
  negA: Float32Array;
  dtBias: Float32Array;
  /** The gated RMSNorm's weight [valueDim] (used as is). */
  norm: Float32Array;
  out: Linear;
}

export interface SharedExpertWeights {
  gate: Linear;
  up: Linear;
  down: Linear;
  /** [1, D]: the shared expert's output is scaled by sigmoid of this. */
  scale: Linear;
}

export interface HybridLayerWeights {
  type: "linear" | "full";
  /** Already the multiplier (1 + w of the Hub's weight). */
  inputNorm: Float32Array;
  postNorm: Float32Array;
  linear?: DeltaNetWeights;
  attention?: GatedAttentionWeights;
  router: Linear;
  shared: SharedExpertWeights;
  expertFormat: ExpertFormat;
  expertTypes: string[];
  expertBytes: number;
}

export interface HybridWeights {
  layers: HybridLayerWeights[];
  finalNorm: Float32Array;
  lmHead: Linear;
  embed(id: number, out: Float32Array): void;
  expert(layer: number, e: number): ExpertMatrices;
  releaseExperts(layer: number): void;
}

/** y = W x, then y's rows taken in `map` order (map[hubRow] = fileRow). Exported for the GPU graph, which runs `inner` in the file's order. */
export class RowPermutedLinear implements Linear {
  readonly rows: number;
  readonly cols: number;
  readonly kind: string;
  readonly bytes: number;
  private tmp = new Float32Array(0);
  constructor(readonly inner: Linear, readonly map: Int32Array) {
    this.rows = inner.rows;
    this.cols = inner.cols;
    this.kind = inner.kind;
    this.bytes = inner.bytes;
  }
  apply(x: Float32Array, S: number, y: Float32Array): void {
    const R = this.rows;
    if (this.tmp.length < S * R) this.tmp = new Float32Array(S * R);
    this.inner.apply(x, S, this.tmp);
    for (let s = 0; s < S; s++) for (let r = 0; r < R; r++) y[s * R + r] = this.tmp[s * R + this.map[r]!]!;
  }
}

/** x's columns put in the file's order first (map[hubCol] = fileCol), then y = W x. Exported as RowPermutedLinear. */
export class ColumnPermutedLinear implements Linear {
  readonly rows: number;
  readonly cols: number;
  readonly kind: string;
  readonly bytes: number;
  private tmp = new Float32Array(0);
  constructor(readonly inner: Linear, readonly map: Int32Array) {
    this.rows = inner.rows;
    this.cols = inner.cols;
    this.kind = inner.kind;
    this.bytes = inner.bytes;
  }
  apply(x: Float32Array, S: number, y: Float32Array): void {
    const C = this.cols;
    if (this.tmp.length < S * C) this.tmp = new Float32Array(S * C);
    for (let s = 0; s < S; s++) for (let c = 0; c < C; c++) this.tmp[s * C + this.map[c]!] = x[s * C + c]!;
    this.inner.apply(this.tmp, S, y);
  }
}

/**
 * map[hub index] = file index over `heads` value heads of `size` entries, after `offset`
 * untouched entries: llama.cpp's _reorder_v_heads puts hub head g·r + j (key group g of K,
 * j-th of its r value heads) at file head j·K + g.
 */
export function valueHeadMap(keyHeads: number, valueHeads: number, size: number, offset = 0): Int32Array {
  const r = valueHeads / keyHeads;
  const map = new Int32Array(offset + valueHeads * size);
  for (let i = 0; i < offset; i++) map[i] = i;
  for (let g = 0; g < keyHeads; g++) {
    for (let j = 0; j < r; j++) {
      const hub = offset + (g * r + j) * size, file = offset + (j * keyHeads + g) * size;
      for (let i = 0; i < size; i++) map[hub + i] = file + i;
    }
  }
  return map;
}

const isIdentity = (map: Int32Array) => map.every((v, i) => v === i);

/** A float tensor of any shape as f32. */
function floats(r: WeightReader, name: string, shape: number[]): Float32Array {
  const t = r.tensor(name, shape);
  if (!isFloatDType(t.dtype)) throw new ModelWeightsError(`${r.where}: tensor ${name} is ${t.dtype}; it must be F32, F16 or BF16`);
  const n = shape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(n);
  readFloatRow(t.dtype, floatElements(t.dtype, t.bytes), 0, n, out);
  return out;
}

/** out[i] = v[map[i]] for blocks of `size` (a vector or the rows of a [n, size] matrix). */
function permuteRows(v: Float32Array, map: Int32Array, size: number): Float32Array {
  const out = new Float32Array(v.length);
  for (let i = 0; i < map.length; i++) out.set(v.subarray(map[i]! * size, (map[i]! + 1) * size), i * size);
  return out;
}

/** The Hub's (1 + w), rounded to f32 as torch adds it. */
const onePlus = (w: Float32Array) => w.map((x) => Math.fround(1 + x));

interface Names {
  embed: string;
  finalNorm: string;
  lmHead: string;
  inputNorm(l: number): string;
  postNorm(l: number): string;
  /** Hub name or GGUF name of a layer tensor. */
  linear(l: number, what: "qkv" | "z" | "b" | "a" | "out" | "conv" | "A" | "dt" | "norm"): string;
  attention(l: number, what: "q" | "k" | "v" | "o" | "qNorm" | "kNorm"): string;
  router(l: number): string;
  shared(l: number, what: "gate" | "up" | "down" | "scale"): string;
}

function hubNames(prefix: string): Names {
  const L = (l: number) => `${prefix}.layers.${l}`;
  const lin = { qkv: "in_proj_qkv.weight", z: "in_proj_z.weight", b: "in_proj_b.weight", a: "in_proj_a.weight", out: "out_proj.weight", conv: "conv1d.weight", A: "A_log", dt: "dt_bias", norm: "norm.weight" };
  const att = { q: "q_proj.weight", k: "k_proj.weight", v: "v_proj.weight", o: "o_proj.weight", qNorm: "q_norm.weight", kNorm: "k_norm.weight" };
  const sh = { gate: "shared_expert.gate_proj.weight", up: "shared_expert.up_proj.weight", down: "shared_expert.down_proj.weight", scale: "shared_expert_gate.weight" };
  return {
    embed: `${prefix}.embed_tokens.weight`,
    finalNorm: `${prefix}.norm.weight`,
    lmHead: "lm_head.weight",
    inputNorm: (l) => `${L(l)}.input_layernorm.weight`,
    postNorm: (l) => `${L(l)}.post_attention_layernorm.weight`,
    linear: (l, w) => `${L(l)}.linear_attn.${lin[w]}`,
    attention: (l, w) => `${L(l)}.self_attn.${att[w]}`,
    router: (l) => `${L(l)}.mlp.gate.weight`,
    shared: (l, w) => `${L(l)}.mlp.${sh[w]}`,
  };
}

const ggufNames: Names = (() => {
  const lin = { qkv: "attn_qkv.weight", z: "attn_gate.weight", b: "ssm_beta.weight", a: "ssm_alpha.weight", out: "ssm_out.weight", conv: "ssm_conv1d.weight", A: "ssm_a", dt: "ssm_dt.bias", norm: "ssm_norm.weight" };
  const att = { q: "attn_q.weight", k: "attn_k.weight", v: "attn_v.weight", o: "attn_output.weight", qNorm: "attn_q_norm.weight", kNorm: "attn_k_norm.weight" };
  const sh = { gate: "ffn_gate_shexp.weight", up: "ffn_up_shexp.weight", down: "ffn_down_shexp.weight", scale: "ffn_gate_inp_shexp.weight" };
  return {
    embed: "token_embd.weight",
    finalNorm: "output_norm.weight",
    lmHead: "output.weight",
    inputNorm: (l) => `blk.${l}.attn_norm.weight`,
    postNorm: (l) => `blk.${l}.post_attention_norm.weight`,
    linear: (l, w) => `blk.${l}.${lin[w]}`,
    attention: (l, w) => `blk.${l}.${att[w]}`,
    router: (l) => `blk.${l}.ffn_gate_inp.weight`,
    shared: (l, w) => `blk.${l}.${sh[w]}`,
  };
})();

export function loadQwen35Weights(file: TensorFile, cfg: Qwen35MoeConfig, plan: QuantPlan, where: string, log: (line: string) => void, progress?: (fraction: number) => void): HybridWeights {
  const gguf = file.format === "gguf";
  const names = gguf ? ggufNames : hubNames(cfg.hfPrefix);
  const r = new WeightReader(file, where);
  const { hidden: D, heads: H, kvHeads: KV, headDim: hd, vocab, experts: E, expertIntermediate: I, sharedIntermediate: F } = cfg;
  const { keyHeads: KH, valueHeads: VH, keyDim: kd, valueDim: vd, convKernel: kernel } = cfg.linear;
  const Kd = KH * kd, Vd = VH * vd, convDim = 2 * Kd + Vd;
  // The Hub's norms multiply by 1 + w; the GGUF's already hold w + 1.
  const norm = (name: string, n: number) => (gguf ? r.vector(name, n) : onePlus(r.vector(name, n)));
  if (!gguf) {
    const other = [...file.tensors.keys()].filter((n) => n.startsWith("model.visual.") || n.startsWith("mtp."));
    if (other.length > 0) log(`vkmoe: ${other.length} vision-tower / MTP tensors (model.visual.*, mtp.*) ignored: vkmoe runs the language model only`);
    if (file.tensors.has(`${cfg.hfPrefix}.layers.0.linear_attn.in_proj_qkvz.weight`)) throw new ModelWeightsError(`${where}: in_proj_qkvz / in_proj_ba (the Qwen3-Next layout) is not supported; Qwen3.5 checkpoints hold in_proj_qkv, in_proj_z, in_proj_b and in_proj_a`);
  }
  // Only llama.cpp's files hold the value heads tiled (see the module comment).
  const heads = (size: number, offset = 0) => (gguf ? valueHeadMap(KH, VH, size, offset) : undefined);
  const rows = (m: Linear, map: Int32Array | undefined) => (map && !isIdentity(map) ? new RowPermutedLinear(m, map) : m);
  const cols = (m: Linear, map: Int32Array | undefined) => (map && !isIdentity(map) ? new ColumnPermutedLinear(m, map) : m);
  const vec = (v: Float32Array, map: Int32Array | undefined, size = 1) => (map && !isIdentity(map) ? permuteRows(v, map, size) : v);
  const layers: HybridLayerWeights[] = [];
  const expertTensors: LayerExperts[] = [];
  for (let l = 0; l < cfg.layers; l++) {
    const type = cfg.layerTypes[l]!;
    let linear: DeltaNetWeights | undefined, attention: GatedAttentionWeights | undefined;
    if (type === "linear") {
      const n = (w: Parameters<Names["linear"]>[1]) => names.linear(l, w);
      const A = floats(r, n("A"), [VH]);
      linear = {
        qkv: rows(r.linear(n("qkv"), convDim, D, plan.dense), heads(vd, 2 * Kd)),
        z: rows(r.linear(n("z"), Vd, D, plan.dense), heads(vd)),
        // tiny matrices [VH, D]: kept float
        b: rows(r.linear(n("b"), VH, D, "none"), heads(1)),
        a: rows(r.linear(n("a"), VH, D, "none"), heads(1)),
        conv: vec(floats(r, n("conv"), gguf ? [convDim, kernel] : [convDim, 1, kernel]), heads(vd, 2 * Kd), kernel),
        negA: vec(gguf ? A : A.map((x) => -Math.fround(Math.exp(x))), heads(1)),
        dtBias: vec(floats(r, n("dt"), [VH]), heads(1)),
        norm: r.vector(n("norm"), vd),
        out: cols(r.linear(n("out"), D, Vd, plan.dense), heads(vd)),
      };
    } else {
      const n = (w: Parameters<Names["attention"]>[1]) => names.attention(l, w);
      attention = {
        q: r.linear(n("q"), H * 2 * hd, D, plan.dense),
        k: r.linear(n("k"), KV * hd, D, plan.dense),
        v: r.linear(n("v"), KV * hd, D, plan.dense),
        o: r.linear(n("o"), D, H * hd, plan.dense),
        qNorm: norm(n("qNorm"), hd),
        kNorm: norm(n("kNorm"), hd),
      };
    }
    // The router stays float: its top-k must match the reference's choices.
    const router = toLinear(r.tensor(names.router(l), [E, D]), E, D, "none", where);
    const shared: SharedExpertWeights = {
      gate: r.linear(names.shared(l, "gate"), F, D, plan.dense),
      up: r.linear(names.shared(l, "up"), F, D, plan.dense),
      down: r.linear(names.shared(l, "down"), D, F, plan.dense),
      scale: r.linear(names.shared(l, "scale"), 1, D, "none"),
    };
    const experts: LayerExperts = gguf ? ggufExperts(r, l, E, I, D) : hfExperts(r, l, E, I, D, plan.experts, `${cfg.hfPrefix}.layers`);
    expertTensors[l] = experts;
    layers.push({
      type,
      inputNorm: norm(names.inputNorm(l), D),
      postNorm: norm(names.postNorm(l), D),
      linear,
      attention,
      router,
      shared,
      expertFormat: experts.format,
      expertTypes: [...new Set(experts.tensors.map((t) => t.dtype))],
      expertBytes: experts.tensors.reduce((s, t) => s + t.bytes.byteLength, 0),
    });
    progress?.((l + 1) / cfg.layers);
  }
  const embedding: TensorView = r.tensor(names.embed, [vocab, D]);
  let lmHead: Linear;
  if (cfg.tieEmbeddings) lmHead = toLinear(embedding, vocab, D, plan.dense, where);
  else if (r.has(names.lmHead)) lmHead = r.linear(names.lmHead, vocab, D, plan.dense);
  else throw new ModelWeightsError(`${where}: tensor ${names.lmHead} is missing (and tie_word_embeddings is false)`);
  return {
    layers,
    finalNorm: norm(names.finalNorm, D),
    lmHead,
    embed: embeddingReader(embedding, D, where),
    expert: (l, e) => {
      const experts = expertTensors[l];
      if (!experts) throw new ModelWeightsError(`${where}: layer ${l} has no experts`);
      return experts.get(e);
    },
    releaseExperts: (l) => {
      for (const t of expertTensors[l]?.tensors ?? []) t.release?.();
    },
  };
}
