/**
 * The tensors of a Qwen3-MoE checkpoint, found by name in either file format and turned into what
 * the decoder computes with: norms as f32, dense matrices as Linear (in place for float and GGML
 * block types, QuantMatrix for q4/q8), embedding rows read on demand, and routed experts converted
 * one at a time when the MoE layer asks (never the whole checkpoint in the JS heap).
 */
import type { TensorFile, TensorView } from "../formats/tensor.ts";
import { dequantizeGgufRow, fromGgufQ4_0, fromGgufQ8_0 } from "../quant/gguf.ts";
import { dequantizeGgmlRow, ggmlBlockTensor, isGgmlBlockType } from "../quant/ggml-blocks.ts";
import { createQuantMatrix, getQ, setQ } from "../quant/layout.ts";
import { quantize } from "../quant/quantize.ts";
import type { QuantFormat, QuantMatrix } from "../quant/types.ts";
import type { Qwen3MoeConfig } from "./config.ts";
import { ModelWeightsError } from "./errors.ts";
import { FloatLinear, floatElements, GgmlBlockLinear, isFloatDType, QuantLinear, readFloatRow, type FloatDType, type Linear } from "./linear.ts";

/** How float checkpoint weights are held: "none" keeps them float (exact); q8/q4 quantize on load. */
export type WeightQuant = "none" | "q8" | "q4";
export interface QuantPlan {
  experts: WeightQuant;
  dense: WeightQuant;
}

export interface AttentionWeights {
  inputNorm: Float32Array;
  q: Linear;
  k: Linear;
  v: Linear;
  o: Linear;
  qNorm: Float32Array;
  kNorm: Float32Array;
  postNorm: Float32Array;
}

export interface DenseMlpWeights {
  gate: Linear;
  up: Linear;
  down: Linear;
}

/**
 * One routed expert: Linears the CPU runs (float in place, or GGML blocks in place, each matrix in
 * its own type), or quantized for the MoE backend (q4/q8 QuantMatrix, all three alike).
 */
export type ExpertMatrices =
  | { kind: "linear"; gate: Linear; up: Linear; down: Linear }
  | { kind: "quant"; gate: QuantMatrix; up: QuantMatrix; down: QuantMatrix };

/**
 * How an MoE layer's experts are held: "float" (in place), a QuantFormat every matrix uses (the MoE
 * backend's), or "ggml": GGML block types (Q4_K, Q6_K ...) as the file holds them (the GPU's
 * GgmlMoeBackend uploads them unchanged; the CPU reads them in place).
 */
export type ExpertFormat = "float" | "ggml" | QuantFormat;

export interface LayerWeights {
  attention: AttentionWeights;
  /** Router [E, D] (f32 or in place), present on MoE layers. */
  router?: Linear;
  /** Dense MLP on layers without experts. */
  mlp?: DenseMlpWeights;
  /** Expert storage of an MoE layer (see ExpertFormat). */
  expertFormat?: ExpertFormat;
  /** The file's tensor types of the layer's gate, up and down experts, distinct, in that order ("Q4_K", "Q6_K"). */
  expertTypes?: string[];
  /** Bytes of the layer's expert tensors in the file. */
  expertBytes?: number;
}

export interface ModelWeights {
  layers: LayerWeights[];
  finalNorm: Float32Array;
  lmHead: Linear;
  /** Writes token `id`'s embedding row (f32) into out. */
  embed(id: number, out: Float32Array): void;
  /** Expert e of layer l, converted now (the caller caches). */
  expert(layer: number, e: number): ExpertMatrices;
  /** Drops layer l's expert tensors from process memory (they live on the GPU now; a later read faults them back). */
  releaseExperts(layer: number): void;
}

type Naming = {
  embed: string;
  finalNorm: string;
  lmHead: string;
  inputNorm(l: number): string;
  postNorm(l: number): string;
  q(l: number): string;
  k(l: number): string;
  v(l: number): string;
  o(l: number): string;
  qNorm(l: number): string;
  kNorm(l: number): string;
  router(l: number): string;
  mlp(l: number, m: "gate" | "up" | "down"): string;
};

const hfNames: Naming = {
  embed: "model.embed_tokens.weight",
  finalNorm: "model.norm.weight",
  lmHead: "lm_head.weight",
  inputNorm: (l) => `model.layers.${l}.input_layernorm.weight`,
  postNorm: (l) => `model.layers.${l}.post_attention_layernorm.weight`,
  q: (l) => `model.layers.${l}.self_attn.q_proj.weight`,
  k: (l) => `model.layers.${l}.self_attn.k_proj.weight`,
  v: (l) => `model.layers.${l}.self_attn.v_proj.weight`,
  o: (l) => `model.layers.${l}.self_attn.o_proj.weight`,
  qNorm: (l) => `model.layers.${l}.self_attn.q_norm.weight`,
  kNorm: (l) => `model.layers.${l}.self_attn.k_norm.weight`,
  router: (l) => `model.layers.${l}.mlp.gate.weight`,
  mlp: (l, m) => `model.layers.${l}.mlp.${m}_proj.weight`,
};

const ggufNames: Naming = {
  embed: "token_embd.weight",
  finalNorm: "output_norm.weight",
  lmHead: "output.weight",
  inputNorm: (l) => `blk.${l}.attn_norm.weight`,
  postNorm: (l) => `blk.${l}.ffn_norm.weight`,
  q: (l) => `blk.${l}.attn_q.weight`,
  k: (l) => `blk.${l}.attn_k.weight`,
  v: (l) => `blk.${l}.attn_v.weight`,
  o: (l) => `blk.${l}.attn_output.weight`,
  qNorm: (l) => `blk.${l}.attn_q_norm.weight`,
  kNorm: (l) => `blk.${l}.attn_k_norm.weight`,
  router: (l) => `blk.${l}.ffn_gate_inp.weight`,
  mlp: (l, m) => `blk.${l}.ffn_${m}.weight`,
};

export class WeightReader {
  constructor(readonly file: TensorFile, readonly where: string) {}

  tensor(name: string, shape: number[]): TensorView {
    const t = this.file.tensors.get(name);
    if (!t) throw new ModelWeightsError(`${this.where}: tensor ${name} is missing`);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new ModelWeightsError(`${this.where}: tensor ${name} has shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`);
    }
    return t;
  }

  has(name: string): boolean {
    return this.file.tensors.has(name);
  }

  /** A 1-D float tensor as f32 (norm weights). */
  vector(name: string, n: number): Float32Array {
    const t = this.tensor(name, [n]);
    if (!isFloatDType(t.dtype)) throw new ModelWeightsError(`${this.where}: tensor ${name} is ${t.dtype}; a norm weight must be F32, F16 or BF16`);
    const out = new Float32Array(n);
    readFloatRow(t.dtype, floatElements(t.dtype, t.bytes), 0, n, out);
    return out;
  }

  /** A [rows, cols] matrix held as `quant` says (float sources), or as its GGUF type (Q8_0/Q4_0 stay lossless). */
  linear(name: string, rows: number, cols: number, quant: WeightQuant): Linear {
    const t = this.tensor(name, [rows, cols]);
    return toLinear(t, rows, cols, quant, this.where);
  }
}

/** A matrix from a tensor; a converted copy lets the file's pages go (`release`), an in-place float view keeps them. */
export function toLinear(t: TensorView, rows: number, cols: number, quant: WeightQuant, where: string): Linear {
  let m: QuantMatrix;
  if (t.dtype === "Q8_0") m = fromGgufQ8_0(t.bytes, rows, cols);
  else if (t.dtype === "Q4_0") m = fromGgufQ4_0(t.bytes, rows, cols);
  else if (isGgmlBlockType(t.dtype)) return new GgmlBlockLinear(t.dtype, t.bytes, rows, cols, `${where}: tensor ${t.name}`); // in place, CPU GEMV
  else {
    if (!isFloatDType(t.dtype)) throw new ModelWeightsError(`${where}: tensor ${t.name} has type ${t.dtype}`);
    const data = floatElements(t.dtype, t.bytes);
    if (quant === "none") return new FloatLinear(t.dtype, data, rows, cols);
    m = quantizeFloat(t.dtype, data, rows, cols, quant, t.name, where);
  }
  t.release?.();
  return new QuantLinear(m);
}

function quantizeFloat(dtype: FloatDType, data: Float32Array | Uint16Array, rows: number, cols: number, format: "q8" | "q4", name: string, where: string): QuantMatrix {
  const source = dtype === "F32" ? { dtype: "f32" as const, data: data as Float32Array } : { dtype: dtype === "F16" ? "f16" as const : "bf16" as const, data: data as Uint16Array };
  try {
    return quantize(source, rows, cols, { format, groupSize: 32, scaleType: "f16" });
  } catch (e) {
    throw new ModelWeightsError(`${where}: cannot quantize ${name}: ${(e as Error).message}`);
  }
}

/** GGUF Q4_0 widened to q8 (same scales, q in -8..7): lossless, for layers whose expert matrices mix Q4_0 and Q8_0. */
export function widenQ4(m: QuantMatrix): QuantMatrix {
  const out = createQuantMatrix("q8", m.rows, m.cols, m.groupSize, m.scaleType);
  for (let r = 0; r < m.rows; r++) for (let c = 0; c < m.cols; c++) setQ(out, r, c, getQ(m, r, c));
  out.scales.set(m.scales);
  return out;
}

export function loadWeights(file: TensorFile, cfg: Qwen3MoeConfig, plan: QuantPlan, where: string, progress?: (fraction: number) => void): ModelWeights {
  const names = file.format === "gguf" ? ggufNames : hfNames;
  const r = new WeightReader(file, where);
  const { hidden: D, heads, kvHeads, headDim, vocab, experts: E, expertIntermediate: I } = cfg;
  const layers: LayerWeights[] = [];
  const expertTensors: LayerExperts[] = [];
  for (let l = 0; l < cfg.layers; l++) {
    const attention: AttentionWeights = {
      inputNorm: r.vector(names.inputNorm(l), D),
      q: r.linear(names.q(l), heads * headDim, D, plan.dense),
      k: r.linear(names.k(l), kvHeads * headDim, D, plan.dense),
      v: r.linear(names.v(l), kvHeads * headDim, D, plan.dense),
      o: r.linear(names.o(l), D, heads * headDim, plan.dense),
      qNorm: r.vector(names.qNorm(l), headDim),
      kNorm: r.vector(names.kNorm(l), headDim),
      postNorm: r.vector(names.postNorm(l), D),
    };
    const layer: LayerWeights = { attention };
    if (cfg.moeLayers[l]) {
      // The router stays float: its top-k must match the reference's choices.
      const router = r.tensor(names.router(l), [E, D]);
      layer.router = toLinear(router, E, D, "none", where);
      const experts = file.format === "gguf" ? ggufExperts(r, l, E, I, D) : hfExperts(r, l, E, I, D, plan.experts);
      layer.expertFormat = experts.format;
      layer.expertTypes = [...new Set(experts.tensors.map((t) => t.dtype))];
      layer.expertBytes = experts.tensors.reduce((n, t) => n + t.bytes.byteLength, 0);
      expertTensors[l] = experts;
    } else {
      const F = cfg.denseIntermediate;
      layer.mlp = {
        gate: r.linear(names.mlp(l, "gate"), F, D, plan.dense),
        up: r.linear(names.mlp(l, "up"), F, D, plan.dense),
        down: r.linear(names.mlp(l, "down"), D, F, plan.dense),
      };
    }
    layers.push(layer);
    progress?.((l + 1) / cfg.layers);
  }
  const embedding = r.tensor(names.embed, [vocab, D]);
  const lmHead = cfg.tieEmbeddings || !r.has(names.lmHead)
    ? toLinear(embedding, vocab, D, plan.dense, where)
    : r.linear(names.lmHead, vocab, D, plan.dense);
  return {
    layers,
    finalNorm: r.vector(names.finalNorm, D),
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

export function embeddingReader(t: TensorView, D: number, where: string): (id: number, out: Float32Array) => void {
  if (isFloatDType(t.dtype)) {
    const dtype = t.dtype;
    const data = floatElements(dtype, t.bytes);
    return (id, out) => readFloatRow(dtype, data, id, D, out);
  }
  if (isGgmlBlockType(t.dtype)) {
    const blocks = ggmlBlockTensor(t.dtype, t.bytes, t.shape[0] ?? 1, D, `${where}: embedding ${t.name}`);
    return (id, out) => dequantizeGgmlRow(blocks, id, out);
  }
  if (t.dtype !== "Q8_0" && t.dtype !== "Q4_0") throw new ModelWeightsError(`${where}: embedding ${t.name} of type ${t.dtype} cannot be read`);
  const type = t.dtype, rows = t.shape[0] ?? 1;
  return (id, out) => dequantizeGgufRow(type, t.bytes, rows, D, id, out);
}

export interface LayerExperts {
  format: ExpertFormat;
  get(e: number): ExpertMatrices;
  /** The file tensors the experts are read from. */
  tensors: TensorView[];
}

/** Expert e's [rows, cols] slice of a stacked [E, rows, cols] tensor, named for errors. */
function expertSlice(t: TensorView, E: number, e: number, rows: number, cols: number): TensorView {
  const per = t.bytes.byteLength / E;
  // No `release`: a conversion of one slice must not drop the pages of the whole stack.
  return { ...t, name: `${t.name} (expert ${e})`, shape: [rows, cols], bytes: t.bytes.subarray(e * per, (e + 1) * per), release: undefined };
}

/** GGUF stacks a layer's experts: ffn_{gate,up}_exps [E, I, D], ffn_down_exps [E, D, I]; expert e is a contiguous slice. */
export function ggufExperts(r: WeightReader, l: number, E: number, I: number, D: number): LayerExperts {
  const gate = r.tensor(`blk.${l}.ffn_gate_exps.weight`, [E, I, D]);
  const up = r.tensor(`blk.${l}.ffn_up_exps.weight`, [E, I, D]);
  const down = r.tensor(`blk.${l}.ffn_down_exps.weight`, [E, D, I]);
  const all = [gate, up, down];
  const quantTypes = new Set(all.map((t) => t.dtype));
  const float = all.every((t) => isFloatDType(t.dtype));
  const unusable = all.find((t) => !isFloatDType(t.dtype) && t.dtype !== "Q8_0" && t.dtype !== "Q4_0" && !isGgmlBlockType(t.dtype));
  if (unusable) throw new ModelWeightsError(`${r.where}: tensor ${unusable.name} is ${unusable.dtype}, which routed experts cannot be`);
  const linears = (e: number): ExpertMatrices => {
    const g = expertSlice(gate, E, e, I, D), u = expertSlice(up, E, e, I, D), d = expertSlice(down, E, e, D, I);
    return { kind: "linear", gate: toLinear(g, I, D, "none", r.where), up: toLinear(u, I, D, "none", r.where), down: toLinear(d, D, I, "none", r.where) };
  };
  if (float) return { format: "float", tensors: all, get: linears };
  // Any GGML block type (Q4_K_M files mix Q4_K gate/up with Q6_K or Q4_K down): every matrix a CPU Linear, read in place.
  if (all.some((t) => isGgmlBlockType(t.dtype))) return { format: "ggml", tensors: all, get: linears };
  if (!all.every((t) => t.dtype === "Q8_0" || t.dtype === "Q4_0")) {
    throw new ModelWeightsError(`${r.where}: layer ${l} mixes float and quantized expert tensors (${[...quantTypes].join(", ")}); vkmoe needs them alike`);
  }
  const format: QuantFormat = quantTypes.has("Q8_0") ? "q8" : "q4";
  const quant = (t: TensorView, rows: number, cols: number): QuantMatrix => {
    const m = t.dtype === "Q8_0" ? fromGgufQ8_0(t.bytes, rows, cols) : fromGgufQ4_0(t.bytes, rows, cols);
    return format === "q8" && m.format === "q4" ? widenQ4(m) : m;
  };
  return {
    format,
    tensors: all,
    get: (e) => ({ kind: "quant", gate: quant(expertSlice(gate, E, e, I, D), I, D), up: quant(expertSlice(up, E, e, I, D), I, D), down: quant(expertSlice(down, E, e, D, I), D, I) }),
  };
}

/** `prefix`: where the layers are ("model.layers", or "model.language_model.layers" in a Qwen3.5 conditional-generation checkpoint). */
export function hfExperts(r: WeightReader, l: number, E: number, I: number, D: number, quant: WeightQuant, prefix = "model.layers"): LayerExperts {
  const name = (e: number, m: string) => `${prefix}.${l}.mlp.experts.${e}.${m}_proj.weight`;
  // Check every expert's tensors now, so a bad file fails at load and not mid-generation.
  const tensors: TensorView[] = [];
  for (let e = 0; e < E; e++) {
    for (const [m, rows, cols] of [["gate", I, D], ["up", I, D], ["down", D, I]] as const) {
      const t = r.tensor(name(e, m), [rows, cols]);
      if (!isFloatDType(t.dtype)) throw new ModelWeightsError(`${r.where}: tensor ${t.name} is ${t.dtype}; Hugging Face weights must be F32, F16 or BF16`);
      tensors.push(t);
    }
  }
  return {
    format: quant === "none" ? "float" : quant,
    tensors,
    get: (e) => {
      const gate = r.tensor(name(e, "gate"), [I, D]), up = r.tensor(name(e, "up"), [I, D]), down = r.tensor(name(e, "down"), [D, I]);
      if (quant === "none") return { kind: "linear", gate: toLinear(gate, I, D, "none", r.where), up: toLinear(up, I, D, "none", r.where), down: toLinear(down, D, I, "none", r.where) };
      const q = (t: TensorView, rows: number, cols: number) => quantizeFloat(t.dtype as FloatDType, floatElements(t.dtype as FloatDType, t.bytes), rows, cols, quant, t.name, r.where);
      return { kind: "quant", gate: q(gate, I, D), up: q(up, I, D), down: q(down, D, I) };
    },
  };
}
