/**
 * What llama.cpp's convert_hf_to_gguf.py writes for a Qwen3.5 / Qwen3.6 MoE checkpoint (arch
 * `qwen35moe`, converted with --no-mtp: vkmoe does not run MTP layers): tensor names, GGUF dims
 * (innermost first), their order and types per file type, and the architecture's metadata keys.
 * Checked against a file the converter wrote (test/make-model-qwen35.test.ts).
 *
 * The layout is the converter's after its rewrites: norms already hold 1 + w (but the linear
 * layers' gated ssm_norm), ssm_a holds −exp(A_log), conv1d is squeezed to [kernel, channels], and
 * the linear-attention value heads are tiled ([g0v0, g1v0, g0v1, g1v1]) rather than grouped by key
 * head. Random values are independent and alike within a tensor, so drawn in place they are
 * already "tiled": no reorder step exists here. What the order decides is how a reader computes with
 * the file; the test runs vkmoe (which un-tiles) and llama.cpp (which computes tiled) on one file.
 */
import type { GgmlTypeName, GgufMetadata } from "../formats/gguf-writer.ts";
import { LLAMA_FTYPE, type ModelFileType, type PlannedTensor, sizeLabel, type TensorRole } from "./qwen3moe-gguf-layout.ts";
import { quantMixType } from "./qwen3moe-quant-mix.ts";

/** A Qwen3.5 MoE model's dimensions, named as Qwen35MoeConfig names them, plus what the file's metadata needs. */
export interface Qwen35MoeShape {
  family: "qwen35moe";
  name: string;
  contextLength: number;
  hidden: number;
  layers: number;
  /** Every full_attention_interval-th layer is full (gated softmax) attention, the others Gated DeltaNet. */
  fullAttentionInterval: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Leading dims of each head that RoPE rotates (head_dim · partial_rotary_factor). */
  rotaryDim: number;
  experts: number;
  topK: number;
  expertIntermediate: number;
  sharedIntermediate: number;
  vocab: number;
  /** No output.weight: the lm_head is token_embd (tie_word_embeddings; every Qwen3.5/3.6 MoE release has its own lm_head). */
  tieEmbeddings: boolean;
  ropeTheta: number;
  rmsEps: number;
  linear: { keyHeads: number; valueHeads: number; keyDim: number; valueDim: number; convKernel: number };
  /**
   * rope_parameters.mrope_section, padded to 4 as the converter writes it. Where the checkpoint
   * names it (the real Qwen3.5/3.6 configs) the key comes with the other RoPE keys; where it does
   * not (the tiny fixture's), the converter appends its default [11, 11, 10, 0] last.
   */
  mropeSections: readonly [number, number, number, number];
  mropeSectionInConfig: boolean;
}

/** Whether layer `i` is a Gated DeltaNet layer (transformers' default layer_types). */
export const isLinearLayer = (s: Qwen35MoeShape, i: number): boolean => (i + 1) % s.fullAttentionInterval !== 0;

/**
 * Tensors the converter keeps in F32 whatever the file type, which llama-quantize leaves so too:
 * 1-D ones (norms, ssm_a, ssm_dt.bias), the router, the shared expert's gate ([D, 1], one row: 1-D
 * to GGML) and the depthwise conv.
 */
function keptF32(name: string, ne: readonly number[]): boolean {
  return ne.length === 1 || ne[1] === 1 || name.endsWith(".ffn_gate_inp.weight") || name.endsWith(".ssm_conv1d.weight");
}

/**
 * Type of a weight in a file of `fileType`. As for qwen3moe (qwen3moe-gguf-layout.ts): q4_0 files
 * take a Q8_0 lm_head (llama-quantize would pick Q6_K on rows of a multiple of 256; Q8_0 keeps every
 * matrix in a type vkmoe's GPU kernels read), and the K-quant types mix as llama-quantize does: its
 * rules are by tensor category, and attn_qkv is attn_v-like there, counted by layer like attn_v
 * (one of the two per layer), so qwen3moe-quant-mix.ts serves both architectures.
 */
function tensorType(s: Qwen35MoeShape, fileType: ModelFileType, name: string, ne: readonly number[]): GgmlTypeName {
  if (keptF32(name, ne)) return "F32";
  // llama-quantize types a tied token_embd as the lm_head it also is
  if (s.tieEmbeddings && name === "token_embd.weight") return tensorType(s, fileType, "output.weight", ne);
  if (fileType === "f16") return "F16";
  if (fileType === "q8_0") return "Q8_0";
  if (fileType === "q4_0") return name === "output.weight" ? "Q8_0" : "Q4_0";
  return quantMixType(fileType, s, name, ne);
}

/**
 * Every tensor, in the converter's order: the Hugging Face names sorted within a layer
 * (input_layernorm, linear_attn.* or the MoE block, post_attention_layernorm, self_attn.*), so
 * lm_head.weight (output.weight) leads and model.norm (output_norm) ends. No MTP layers.
 */
export function qwen35MoeTensors(s: Qwen35MoeShape, fileType: ModelFileType): PlannedTensor[] {
  const { hidden: D, experts: E, expertIntermediate: I, sharedIntermediate: F } = s;
  const { keyHeads, valueHeads: VH, keyDim, valueDim, convKernel } = s.linear;
  const Vd = VH * valueDim;
  const convChannels = 2 * keyHeads * keyDim + Vd;
  const list: [string, number[], TensorRole][] = [
    ...(s.tieEmbeddings ? [] : [["output.weight", [D, s.vocab], "lm_head"] as [string, number[], TensorRole]]),
    ["token_embd.weight", [D, s.vocab], "embedding"],
  ];
  for (let i = 0; i < s.layers; i++) {
    const b = `blk.${i}`;
    list.push([`${b}.attn_norm.weight`, [D], "norm"]);
    if (isLinearLayer(s, i)) {
      list.push(
        [`${b}.ssm_a`, [VH], "ssm_a"],
        [`${b}.ssm_conv1d.weight`, [convKernel, convChannels], "conv"],
        [`${b}.ssm_dt.bias`, [VH], "dt_bias"],
        [`${b}.ssm_alpha.weight`, [D, VH], "attention"],
        [`${b}.ssm_beta.weight`, [D, VH], "attention"],
        [`${b}.attn_qkv.weight`, [D, convChannels], "attention"],
        [`${b}.attn_gate.weight`, [D, Vd], "attention"],
        [`${b}.ssm_norm.weight`, [valueDim], "norm"],
        [`${b}.ssm_out.weight`, [Vd, D], "attention"],
      );
    }
    list.push(
      [`${b}.ffn_down_exps.weight`, [I, D, E], "expert"],
      [`${b}.ffn_gate_exps.weight`, [D, I, E], "expert"],
      [`${b}.ffn_up_exps.weight`, [D, I, E], "expert"],
      [`${b}.ffn_gate_inp.weight`, [D, E], "router"],
      [`${b}.ffn_down_shexp.weight`, [F, D], "expert"],
      [`${b}.ffn_gate_shexp.weight`, [D, F], "expert"],
      [`${b}.ffn_up_shexp.weight`, [D, F], "expert"],
      [`${b}.ffn_gate_inp_shexp.weight`, [D, 1], "attention"],
      [`${b}.post_attention_norm.weight`, [D], "norm"],
    );
    if (!isLinearLayer(s, i)) {
      const q = s.heads * s.headDim, kv = s.kvHeads * s.headDim;
      list.push(
        [`${b}.attn_k_norm.weight`, [s.headDim], "norm"],
        [`${b}.attn_k.weight`, [D, kv], "attention"],
        [`${b}.attn_output.weight`, [q, D], "attention"],
        [`${b}.attn_q_norm.weight`, [s.headDim], "norm"],
        // per head its query rows, then its output gate's
        [`${b}.attn_q.weight`, [D, 2 * q], "attention"],
        [`${b}.attn_v.weight`, [D, kv], "attention"],
      );
    }
  }
  list.push(["output_norm.weight", [D], "norm"]);
  return list.map(([name, ne, role]) => ({ name, ne, role, type: tensorType(s, fileType, name, ne) }));
}

/** The general.* and qwen35moe.* keys, in the converter's order; tokenizer keys go after. */
export function qwen35MoeMetadata(s: Qwen35MoeShape, fileType: ModelFileType, tokenizer: GgufMetadata): GgufMetadata {
  const u32 = (value: number) => ({ type: "u32", value }) as const;
  const f32 = (value: number) => ({ type: "f32", value }) as const;
  const str = (value: string) => ({ type: "string", value }) as const;
  const a = "qwen35moe";
  const sections = [`${a}.rope.dimension_sections`, { type: "array", of: "i32", value: Int32Array.from(s.mropeSections) }] as const;
  return [
    ["general.architecture", str(a)],
    ["general.type", str("model")],
    ["general.name", str(`vkmoe random ${s.name}`)],
    ["general.size_label", str(sizeLabel(qwen35MoeTensors(s, fileType), s.experts))],
    [`${a}.block_count`, u32(s.layers)],
    [`${a}.context_length`, u32(s.contextLength)],
    [`${a}.embedding_length`, u32(s.hidden)],
    [`${a}.attention.head_count`, u32(s.heads)],
    [`${a}.attention.head_count_kv`, u32(s.kvHeads)],
    ...(s.mropeSectionInConfig ? [sections] : []),
    [`${a}.rope.freq_base`, f32(s.ropeTheta)],
    [`${a}.attention.layer_norm_rms_epsilon`, f32(s.rmsEps)],
    [`${a}.expert_count`, u32(s.experts)],
    [`${a}.expert_used_count`, u32(s.topK)],
    [`${a}.attention.key_length`, u32(s.headDim)],
    [`${a}.attention.value_length`, u32(s.headDim)],
    ["general.file_type", u32(LLAMA_FTYPE[fileType])],
    [`${a}.expert_feed_forward_length`, u32(s.expertIntermediate)],
    [`${a}.expert_shared_feed_forward_length`, u32(s.sharedIntermediate)],
    [`${a}.ssm.conv_kernel`, u32(s.linear.convKernel)],
    [`${a}.ssm.state_size`, u32(s.linear.keyDim)],
    [`${a}.ssm.group_count`, u32(s.linear.keyHeads)],
    [`${a}.ssm.time_step_rank`, u32(s.linear.valueHeads)],
    [`${a}.ssm.inner_size`, u32(s.linear.valueHeads * s.linear.valueDim)],
    [`${a}.attention.recurrent_layers`, { type: "array", of: "bool", value: Array.from({ length: s.layers }, (_, i) => isLinearLayer(s, i)) }],
    [`${a}.full_attention_interval`, u32(s.fullAttentionInterval)],
    [`${a}.rope.dimension_count`, u32(s.rotaryDim)],
    ...(s.mropeSectionInConfig ? [] : [sections]),
    ["general.quantization_version", u32(2)],
    ...tokenizer,
  ];
}

/**
 * Small enough for tests, every row length (hidden, the intermediates, heads·head_dim, value
 * heads·value dim) a multiple of 256 as K-quants need, and the real family's head dims (256 for
 * attention, 128 for the linear heads, two value heads per key head so the value-head order matters).
 */
const qwen35Tiny: Qwen35MoeShape = {
  family: "qwen35moe",
  name: "qwen3.5-tiny",
  contextLength: 4096,
  hidden: 256,
  // 3 linear + 1 full
  layers: 4,
  fullAttentionInterval: 4,
  heads: 4,
  kvHeads: 2,
  headDim: 256,
  rotaryDim: 64,
  // Not 8: llama-quantize gives 8-expert models other attn_v/attn_qkv/attn_k types.
  experts: 16,
  topK: 4,
  expertIntermediate: 256,
  sharedIntermediate: 256,
  vocab: 151936,
  tieEmbeddings: false,
  ropeTheta: 1e7,
  rmsEps: 1e-6,
  linear: { keyHeads: 2, valueHeads: 4, keyDim: 128, valueDim: 128, convKernel: 4 },
  mropeSections: [11, 11, 10, 0],
  mropeSectionInConfig: true,
};

/**
 * Qwen/Qwen3.6-35B-A3B's text_config (the same dimensions as Qwen3.5-35B-A3B): 40 layers as 10 ×
 * (3 Gated DeltaNet + 1 gated attention), 256 experts top-8 plus a shared expert, untied
 * embeddings of the padded 248320-token vocab (the file's tokenizer is Qwen3's, its tail [PAD]).
 */
const qwen36_35bA3b: Qwen35MoeShape = {
  family: "qwen35moe",
  name: "qwen3.6-35b-a3b",
  contextLength: 262144,
  hidden: 2048,
  layers: 40,
  fullAttentionInterval: 4,
  heads: 16,
  kvHeads: 2,
  headDim: 256,
  // partial_rotary_factor 0.25
  rotaryDim: 64,
  experts: 256,
  topK: 8,
  expertIntermediate: 512,
  sharedIntermediate: 512,
  vocab: 248320,
  tieEmbeddings: false,
  ropeTheta: 1e7,
  rmsEps: 1e-6,
  linear: { keyHeads: 16, valueHeads: 32, keyDim: 128, valueDim: 128, convKernel: 4 },
  mropeSections: [11, 11, 10, 0],
  mropeSectionInConfig: true,
};

export const QWEN35_MOE_SHAPES: Readonly<Record<string, Qwen35MoeShape>> = {
  [qwen35Tiny.name]: qwen35Tiny,
  [qwen36_35bA3b.name]: qwen36_35bA3b,
};
