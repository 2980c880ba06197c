/**
 * The Qwen3.5/3.6 MoE architecture's hyperparameters (transformers `qwen3_5_moe`, llama.cpp
 * `qwen35moe`): Qwen3-MoE's fields plus the hybrid layer pattern (Gated DeltaNet linear attention,
 * full attention with an output gate and partial RoPE) and a shared expert. From a Hugging Face
 * config.json (`Qwen3_5MoeForCausalLM`, or `Qwen3_5MoeForConditionalGeneration` with its
 * `text_config`) or a GGUF's metadata; what is missing or unsupported is one ModelConfigError naming it.
 */
import type { Qwen3MoeConfig } from "./config.ts";
import { ModelConfigError } from "./errors.ts";

export type HybridLayerType = "linear" | "full";

/** The Gated DeltaNet layers' dimensions. */
export interface LinearAttentionConfig {
  keyHeads: number;
  valueHeads: number;
  keyDim: number;
  valueDim: number;
  convKernel: number;
}

export interface Qwen35MoeConfig extends Omit<Qwen3MoeConfig, "architecture"> {
  architecture: "qwen3_5_moe";
  /** Per layer: Gated DeltaNet ("linear") or gated softmax attention ("full"). */
  layerTypes: HybridLayerType[];
  linear: LinearAttentionConfig;
  /** Leading dims of each full-attention head that RoPE rotates (head_dim · partial_rotary_factor). */
  rotaryDim: number;
  /** Intermediate size of the shared expert every MoE layer runs beside the routed ones. */
  sharedIntermediate: number;
  /**
   * Where the tensors are: "model" (Qwen3_5MoeForCausalLM) or "model.language_model"
   * (Qwen3_5MoeForConditionalGeneration, whose vision tower vkmoe does not run).
   */
  hfPrefix: "model" | "model.language_model";
}

export const QWEN35_HF_MODEL_TYPES = ["qwen3_5_moe", "qwen3_5_moe_text"] as const;

/** Whether a config.json describes this family (then qwen35ConfigFromHf reads it). */
export function isQwen35HfConfig(json: unknown): boolean {
  const t = (json as { model_type?: unknown } | null)?.model_type;
  return typeof t === "string" && (QWEN35_HF_MODEL_TYPES as readonly string[]).includes(t);
}

type Json = Record<string, unknown>;

/** Field readers that name the field (and the file) when it is missing or of the wrong kind. */
function fields(j: Json, where: string) {
  const fail = (key: string, what: string): never => {
    throw new ModelConfigError(`${where}: ${key} ${what}`);
  };
  const int = (key: string, fallback?: number): number => {
    const v = j[key];
    if (v === undefined || v === null) return fallback ?? fail(key, "is missing (Qwen3.5 MoE needs it)");
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) fail(key, `must be a positive integer, got ${JSON.stringify(v)}`);
    return v as number;
  };
  const num = (key: string, fallback?: number): number => {
    const v = j[key];
    if (v === undefined || v === null) return fallback ?? fail(key, "is missing (Qwen3.5 MoE needs it)");
    if (typeof v !== "number" || !(v > 0)) fail(key, `must be a positive number, got ${JSON.stringify(v)}`);
    return v as number;
  };
  const bool = (key: string, fallback: boolean): boolean => {
    const v = j[key];
    if (v === undefined || v === null) return fallback;
    if (typeof v !== "boolean") fail(key, `must be true or false, got ${JSON.stringify(v)}`);
    return v as boolean;
  };
  return { int, num, bool, fail };
}

function layerTypesFromHf(j: Json, layers: number, where: string): HybridLayerType[] {
  const raw = j.layer_types;
  if (raw === undefined || raw === null) {
    // as transformers: every full_attention_interval-th layer is full attention
    const interval = j.full_attention_interval;
    if (typeof interval !== "number" || !Number.isInteger(interval) || interval < 1) {
      throw new ModelConfigError(`${where}: layer_types is missing (and no full_attention_interval to derive it from)`);
    }
    return Array.from({ length: layers }, (_, i) => ((i + 1) % interval === 0 ? "full" : "linear"));
  }
  if (!Array.isArray(raw)) throw new ModelConfigError(`${where}: layer_types must be a list, got ${JSON.stringify(raw)}`);
  if (raw.length !== layers) throw new ModelConfigError(`${where}: layer_types has ${raw.length} entries for ${layers} layers (num_hidden_layers)`);
  return raw.map((t, i) => {
    if (t === "linear_attention") return "linear";
    if (t === "full_attention") return "full";
    throw new ModelConfigError(`${where}: layer_types[${i}] is ${JSON.stringify(t)}; vkmoe runs "linear_attention" and "full_attention" layers`);
  });
}

function check(c: Qwen35MoeConfig, where: string): Qwen35MoeConfig {
  if (c.heads % c.kvHeads !== 0) throw new ModelConfigError(`${where}: ${c.heads} attention heads are not a multiple of ${c.kvHeads} KV heads`);
  if (c.rotaryDim % 2 !== 0 || c.rotaryDim < 2 || c.rotaryDim > c.headDim) throw new ModelConfigError(`${where}: RoPE dimension ${c.rotaryDim} must be even and within head_dim ${c.headDim}`);
  if (c.topK > c.experts) throw new ModelConfigError(`${where}: ${c.topK} experts per token but only ${c.experts} experts`);
  if (c.linear.valueHeads % c.linear.keyHeads !== 0) throw new ModelConfigError(`${where}: ${c.linear.valueHeads} linear-attention value heads are not a multiple of ${c.linear.keyHeads} key heads`);
  return c;
}

/**
 * From a Hugging Face config.json object: a Qwen3_5MoeForCausalLM config (model_type
 * qwen3_5_moe_text), or a Qwen3_5MoeForConditionalGeneration one (qwen3_5_moe) whose text_config
 * holds the language model's fields.
 */
export function qwen35ConfigFromHf(json: unknown, where = "config.json"): Qwen35MoeConfig {
  const outer = json as Json;
  const conditional = outer.model_type === "qwen3_5_moe";
  let j = outer;
  if (conditional) {
    if (outer.text_config === null || typeof outer.text_config !== "object") throw new ModelConfigError(`${where}: text_config is missing (a qwen3_5_moe config holds the language model there)`);
    j = outer.text_config as Json;
  } else if (outer.model_type !== "qwen3_5_moe_text") {
    throw new ModelConfigError(`${where}: model_type ${JSON.stringify(outer.model_type)} is not Qwen3.5 MoE`);
  }
  const f = fields(j, conditional ? `${where} (text_config)` : where);
  if (f.bool("attention_bias", false)) f.fail("attention_bias", "= true is not supported");
  const act = j.hidden_act ?? "silu";
  if (act !== "silu") f.fail("hidden_act", `"${String(act)}" is not supported (silu only)`);
  const rope = (j.rope_parameters ?? {}) as Json;
  if (rope.rope_type !== undefined && rope.rope_type !== "default") f.fail("rope_parameters.rope_type", `"${String(rope.rope_type)}" is not supported (vkmoe runs the default RoPE)`);
  const ropeTheta = (rope.rope_theta ?? j.rope_theta) as number | undefined;
  if (typeof ropeTheta !== "number" || !(ropeTheta > 0)) f.fail("rope_parameters.rope_theta", "is missing");
  const partial = (rope.partial_rotary_factor ?? j.partial_rotary_factor ?? 0.25) as number;
  if (typeof partial !== "number" || !(partial > 0 && partial <= 1)) f.fail("partial_rotary_factor", `must be in (0, 1], got ${JSON.stringify(partial)}`);
  const hidden = f.int("hidden_size"), heads = f.int("num_attention_heads"), layers = f.int("num_hidden_layers");
  const headDim = f.int("head_dim", Math.floor(hidden / heads));
  const experts = f.int("num_experts");
  const dtype = j.dtype ?? j.torch_dtype ?? outer.dtype ?? outer.torch_dtype;
  // tie_word_embeddings of a conditional-generation model is the outer config's
  const tie = typeof outer.tie_word_embeddings === "boolean" ? outer.tie_word_embeddings : f.bool("tie_word_embeddings", false);
  return check({
    architecture: "qwen3_5_moe",
    hidden,
    layers,
    heads,
    kvHeads: f.int("num_key_value_heads", heads),
    headDim,
    experts,
    topK: f.int("num_experts_per_tok"),
    expertIntermediate: f.int("moe_intermediate_size"),
    denseIntermediate: 0,
    sharedIntermediate: f.int("shared_expert_intermediate_size"),
    vocab: f.int("vocab_size"),
    ropeTheta: ropeTheta as number,
    rotaryDim: Math.floor(headDim * partial),
    rmsEps: f.num("rms_norm_eps"),
    // the router always renormalises its top-k weights (Qwen3_5MoeTopKRouter)
    normTopkProb: true,
    tieEmbeddings: tie,
    maxPositions: f.int("max_position_embeddings"),
    moeLayers: Array.from({ length: layers }, () => true),
    ropeFrequencies: dtype === "bfloat16" ? "bf16" : "f32",
    layerTypes: layerTypesFromHf(j, layers, where),
    linear: {
      keyHeads: f.int("linear_num_key_heads"),
      valueHeads: f.int("linear_num_value_heads"),
      keyDim: f.int("linear_key_head_dim"),
      valueDim: f.int("linear_value_head_dim"),
      convKernel: f.int("linear_conv_kernel_dim"),
    },
    hfPrefix: conditional ? "model.language_model" : "model",
  }, where);
}

/**
 * From GGUF metadata (arch qwen35moe), the keys llama.cpp's converter writes: ssm.* for the linear
 * layers (state_size = key head dim, group_count = key heads, time_step_rank = value heads,
 * inner_size = value heads × value head dim), attention.recurrent_layers for the pattern (else
 * full_attention_interval), rope.dimension_count for the rotated dims. Tied embeddings are told by
 * the tensors present.
 */
export function qwen35ConfigFromGguf(meta: Readonly<Record<string, unknown>>, hasTensor: (name: string) => boolean, where = "GGUF", ropeFrequencies: "f32" | "bf16" = "f32"): Qwen35MoeConfig {
  const a = "qwen35moe";
  if (meta["general.architecture"] !== a) throw new ModelConfigError(`${where}: architecture ${JSON.stringify(meta["general.architecture"])} is not ${a}`);
  const num = (key: string, fallback?: number): number => {
    const v = meta[`${a}.${key}`];
    const n = typeof v === "bigint" ? Number(v) : v;
    if (typeof n === "number" && Number.isFinite(n)) return n;
    if (fallback !== undefined) return fallback;
    throw new ModelConfigError(`${where}: metadata key ${a}.${key} is missing or not a number`);
  };
  const scaling = meta[`${a}.rope.scaling.type`];
  if (scaling !== undefined && scaling !== "none") throw new ModelConfigError(`${where}: rope scaling "${String(scaling)}" is not supported (vkmoe runs the default RoPE)`);
  const hidden = num("embedding_length"), heads = num("attention.head_count"), layers = num("block_count");
  const headDim = num("attention.key_length", hidden / heads);
  const recurrent = meta[`${a}.attention.recurrent_layers`];
  let layerTypes: HybridLayerType[];
  if (Array.isArray(recurrent)) {
    if (recurrent.length < layers) throw new ModelConfigError(`${where}: ${a}.attention.recurrent_layers has ${recurrent.length} entries for ${layers} layers`);
    // the converter appends entries for MTP layers; vkmoe runs the first block_count
    layerTypes = recurrent.slice(0, layers).map((r) => (r ? "linear" : "full"));
  } else {
    const interval = num("full_attention_interval");
    layerTypes = Array.from({ length: layers }, (_, i) => ((i + 1) % interval === 0 ? "full" : "linear"));
  }
  const valueHeads = num("ssm.time_step_rank");
  const inner = num("ssm.inner_size");
  if (inner % valueHeads !== 0) throw new ModelConfigError(`${where}: ${a}.ssm.inner_size ${inner} is not a multiple of ${a}.ssm.time_step_rank ${valueHeads}`);
  const tokens = meta["tokenizer.ggml.tokens"];
  const nextn = num("nextn_predict_layers", 0);
  if (nextn > 0) throw new ModelConfigError(`${where}: ${a}.nextn_predict_layers = ${nextn}: files with MTP layers are not supported (convert with --no-mtp)`);
  return check({
    architecture: "qwen3_5_moe",
    hidden,
    layers,
    heads,
    kvHeads: num("attention.head_count_kv", heads),
    headDim,
    experts: num("expert_count"),
    topK: num("expert_used_count"),
    expertIntermediate: num("expert_feed_forward_length"),
    denseIntermediate: 0,
    sharedIntermediate: num("expert_shared_feed_forward_length"),
    vocab: Array.isArray(tokens) ? tokens.length : num("vocab_size"),
    ropeTheta: num("rope.freq_base", 10000),
    rotaryDim: num("rope.dimension_count", headDim),
    rmsEps: num("attention.layer_norm_rms_epsilon"),
    normTopkProb: true,
    tieEmbeddings: !hasTensor("output.weight"),
    maxPositions: num("context_length"),
    moeLayers: Array.from({ length: layers }, () => true),
    ropeFrequencies,
    layerTypes,
    linear: {
      keyHeads: num("ssm.group_count"),
      valueHeads,
      keyDim: num("ssm.state_size"),
      valueDim: inner / valueHeads,
      convKernel: num("ssm.conv_kernel"),
    },
    hfPrefix: "model",
  }, where);
}
