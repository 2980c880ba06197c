/**
 * The Qwen3-MoE architecture's hyperparameters, from a Hugging Face config.json or a GGUF's
 * metadata: one typed object the decoder reads, validated once, naming what is wrong or unsupported.
 */
import { z } from "zod";
import { ModelConfigError } from "./errors.ts";

export interface Qwen3MoeConfig {
  architecture: "qwen3_moe";
  hidden: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  experts: number;
  topK: number;
  /** Intermediate size of each routed expert. */
  expertIntermediate: number;
  /** Intermediate size of dense MLP layers (mlp_only_layers / decoder_sparse_step). */
  denseIntermediate: number;
  vocab: number;
  ropeTheta: number;
  rmsEps: number;
  /** Router weights renormalised over the top-k. */
  normTopkProb: boolean;
  tieEmbeddings: boolean;
  maxPositions: number;
  /** true where layer i has routed experts, false where it is a dense MLP. */
  moeLayers: boolean[];
  /**
   * Precision of RoPE's inverse frequencies. transformers keeps them in the checkpoint's dtype, so a
   * bf16 checkpoint rotates with bf16-rounded frequencies; matching that is what makes its outputs
   * reproducible (tiny fixture, chat prompt: logits NMSE 6.7e-6 with f32 frequencies, 1e-12 with bf16).
   */
  ropeFrequencies: "f32" | "bf16";
}

const positive = z.number().int().positive();
const hfSchema = z.looseObject({
  architectures: z.array(z.string()).optional(),
  model_type: z.string(),
  hidden_size: positive,
  num_hidden_layers: positive,
  num_attention_heads: positive,
  num_key_value_heads: positive.optional(),
  head_dim: positive.optional(),
  num_experts: z.number().int().nonnegative().optional(),
  num_local_experts: z.number().int().nonnegative().optional(),
  num_experts_per_tok: positive,
  moe_intermediate_size: positive,
  intermediate_size: positive.optional(),
  vocab_size: positive,
  rope_theta: z.number().positive().optional(),
  rope_parameters: z.looseObject({ rope_theta: z.number().positive().optional(), rope_type: z.string().optional() }).nullish(),
  rope_scaling: z.looseObject({ rope_type: z.string().optional(), type: z.string().optional() }).nullish(),
  rms_norm_eps: z.number().positive(),
  norm_topk_prob: z.boolean().default(false),
  tie_word_embeddings: z.boolean().default(false),
  max_position_embeddings: positive,
  mlp_only_layers: z.array(z.number().int().nonnegative()).default([]),
  decoder_sparse_step: positive.default(1),
  attention_bias: z.boolean().default(false),
  hidden_act: z.string().default("silu"),
  use_sliding_window: z.boolean().default(false),
  dtype: z.string().optional(),
  torch_dtype: z.string().optional(),
});

const SUPPORTED = "qwen3_moe (Qwen3MoeForCausalLM) and qwen3_5_moe (Qwen3_5MoeForCausalLM / ForConditionalGeneration)";

function checkRope(type: string | undefined): void {
  if (type !== undefined && type !== "default") throw new ModelConfigError(`config.json: rope type "${type}" is not supported (vkmoe runs the default RoPE)`);
}

function check(c: Qwen3MoeConfig, where: string): Qwen3MoeConfig {
  if (c.heads % c.kvHeads !== 0) throw new ModelConfigError(`${where}: ${c.heads} attention heads are not a multiple of ${c.kvHeads} KV heads`);
  if (c.headDim % 2 !== 0) throw new ModelConfigError(`${where}: head_dim ${c.headDim} must be even for RoPE`);
  if (c.topK > c.experts && c.moeLayers.some((m) => m)) throw new ModelConfigError(`${where}: ${c.topK} experts per token but only ${c.experts} experts`);
  return c;
}

/** From a Hugging Face config.json object (`where` names the file in errors). */
export function configFromHf(json: unknown, where = "config.json"): Qwen3MoeConfig {
  const modelType = (json as { model_type?: unknown })?.model_type;
  if (modelType !== "qwen3_moe") throw new ModelConfigError(`${where}: model_type ${JSON.stringify(modelType)} is not supported; vkmoe runs ${SUPPORTED}`);
  const parsed = hfSchema.safeParse(json);
  if (!parsed.success) throw new ModelConfigError(`${where}: ${z.prettifyError(parsed.error).replace(/\n/g, "; ")}`);
  const j = parsed.data;
  if (j.attention_bias) throw new ModelConfigError(`${where}: attention_bias = true is not supported`);
  if (j.hidden_act !== "silu") throw new ModelConfigError(`${where}: hidden_act "${j.hidden_act}" is not supported (silu only)`);
  if (j.use_sliding_window) throw new ModelConfigError(`${where}: sliding-window attention is not supported`);
  checkRope(j.rope_scaling?.rope_type ?? j.rope_scaling?.type);
  checkRope(j.rope_parameters?.rope_type);
  const ropeTheta = j.rope_parameters?.rope_theta ?? j.rope_theta;
  if (ropeTheta === undefined) throw new ModelConfigError(`${where}: no rope_theta (nor rope_parameters.rope_theta)`);
  const experts = j.num_experts ?? j.num_local_experts ?? 0;
  const layers = j.num_hidden_layers;
  const moeLayers = Array.from({ length: layers }, (_, i) => experts > 0 && !j.mlp_only_layers.includes(i) && (i + 1) % j.decoder_sparse_step === 0);
  if (moeLayers.some((m) => !m) && j.intermediate_size === undefined) throw new ModelConfigError(`${where}: dense MLP layers need intermediate_size`);
  return check({
    architecture: "qwen3_moe",
    hidden: j.hidden_size,
    layers,
    heads: j.num_attention_heads,
    kvHeads: j.num_key_value_heads ?? j.num_attention_heads,
    headDim: j.head_dim ?? j.hidden_size / j.num_attention_heads,
    experts,
    topK: j.num_experts_per_tok,
    expertIntermediate: j.moe_intermediate_size,
    denseIntermediate: j.intermediate_size ?? 0,
    vocab: j.vocab_size,
    ropeTheta,
    rmsEps: j.rms_norm_eps,
    normTopkProb: j.norm_topk_prob,
    tieEmbeddings: j.tie_word_embeddings,
    maxPositions: j.max_position_embeddings,
    moeLayers,
    ropeFrequencies: (j.dtype ?? j.torch_dtype) === "bfloat16" ? "bf16" : "f32",
  }, where);
}

/**
 * From GGUF metadata (arch qwen3moe). llama.cpp always renormalises qwen3moe's top-k weights, so
 * normTopkProb is true unless the file says otherwise (expert_weights_norm). Dense layers and tied
 * embeddings are told by the tensors present: `hasTensor` answers for a name.
 */
export function configFromGguf(meta: Readonly<Record<string, unknown>>, hasTensor: (name: string) => boolean, where = "GGUF", ropeFrequencies: "f32" | "bf16" = "f32"): Qwen3MoeConfig {
  const arch = meta["general.architecture"];
  if (arch !== "qwen3moe") throw new ModelConfigError(`${where}: architecture ${JSON.stringify(arch)} is not supported; vkmoe runs qwen3moe and qwen35moe`);
  const num = (key: string, fallback?: number): number => {
    const v = meta[`qwen3moe.${key}`];
    const n = typeof v === "bigint" ? Number(v) : v;
    if (typeof n === "number" && Number.isFinite(n)) return n;
    if (fallback !== undefined) return fallback;
    throw new ModelConfigError(`${where}: metadata key qwen3moe.${key} is missing or not a number`);
  };
  const scaling = meta["qwen3moe.rope.scaling.type"];
  if (scaling !== undefined && scaling !== "none") throw new ModelConfigError(`${where}: rope scaling "${String(scaling)}" is not supported (vkmoe runs the default RoPE)`);
  const hidden = num("embedding_length");
  const heads = num("attention.head_count");
  const layers = num("block_count");
  const experts = num("expert_count", 0);
  const tokens = meta["tokenizer.ggml.tokens"];
  const vocab = Array.isArray(tokens) ? tokens.length : num("vocab_size");
  const moeLayers = Array.from({ length: layers }, (_, i) => hasTensor(`blk.${i}.ffn_gate_exps.weight`));
  const norm = meta["qwen3moe.expert_weights_norm"];
  return check({
    architecture: "qwen3_moe",
    hidden,
    layers,
    heads,
    kvHeads: num("attention.head_count_kv", heads),
    headDim: num("attention.key_length", hidden / heads),
    experts,
    topK: num("expert_used_count", 0),
    expertIntermediate: num("expert_feed_forward_length", 0),
    denseIntermediate: num("feed_forward_length", 0),
    vocab,
    ropeTheta: num("rope.freq_base", 10000),
    rmsEps: num("attention.layer_norm_rms_epsilon"),
    normTopkProb: typeof norm === "boolean" ? norm : true,
    tieEmbeddings: !hasTensor("output.weight"),
    maxPositions: num("context_length"),
    moeLayers,
    ropeFrequencies,
  }, where);
}
