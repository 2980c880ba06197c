/**
 * What llama.cpp's convert_hf_to_gguf.py writes for a Qwen3-MoE checkpoint (arch `qwen3moe`):
 * tensor names, GGUF dims (innermost first), their order and types per file type, and the
 * architecture's metadata keys. Checked against a file the converter wrote (test/make-model.test.ts).
 */
import type { GgmlTypeName, GgufMetadata, GgufTensorSpec } from "../formats/gguf-writer.ts";
import { quantMixType } from "./qwen3moe-quant-mix.ts";
import type { Qwen3MoeShape } from "./shapes.ts";

/** q4_k_m ... q5_0: llama-quantize's per-tensor mix of that ftype (qwen3moe-quant-mix.ts). */
export const MODEL_FILE_TYPES = ["q4_0", "q8_0", "f16", "q4_k_m", "q5_k_m", "q6_k", "q5_0"] as const;
export type ModelFileType = (typeof MODEL_FILE_TYPES)[number];

/** llama_ftype numbers written as general.file_type (llama.h's LLAMA_FTYPE_MOSTLY_*). */
export const LLAMA_FTYPE: Record<ModelFileType, number> = { f16: 1, q4_0: 2, q8_0: 7, q5_0: 8, q4_k_m: 15, q5_k_m: 17, q6_k: 18 };

/** What a tensor is, which decides how its random values are drawn (the last three: qwen35moe's linear layers). */
export type TensorRole = "embedding" | "norm" | "attention" | "router" | "expert" | "lm_head" | "ssm_a" | "dt_bias" | "conv";

export interface PlannedTensor extends GgufTensorSpec {
  role: TensorRole;
}

/**
 * Type of a weight in a file of `fileType`. 1-D tensors (norms) and the router stay F32, as the
 * converter keeps them. In q4_0 files the lm_head is Q8_0, as in the reference Q4_0 file made by
 * llama-quantize (which falls back to Q8_0 there; on rows of a multiple of 256 it would pick Q6_K).
 * The K-quant types and q5_0 mix as llama-quantize does.
 */
function tensorType(s: Qwen3MoeShape, fileType: ModelFileType, name: string, ne: readonly number[]): GgmlTypeName {
  if (ne.length === 1 || name.endsWith(".ffn_gate_inp.weight")) return "F32";
  if (fileType === "f16") return "F16";
  if (fileType === "q8_0") return "Q8_0";
  if (fileType === "q4_0") return name === "output.weight" ? "Q8_0" : "Q4_0";
  return quantMixType(fileType, s, name, ne);
}

/** Every tensor, in the converter's order (the order of the Hugging Face names, sorted). */
export function qwen3MoeTensors(s: Qwen3MoeShape, fileType: ModelFileType): PlannedTensor[] {
  const q = s.heads * s.headDim;
  const kv = s.kvHeads * s.headDim;
  const list: [string, number[], TensorRole][] = [
    ["output.weight", [s.hidden, s.vocab], "lm_head"],
    ["token_embd.weight", [s.hidden, s.vocab], "embedding"],
  ];
  for (let i = 0; i < s.layers; i++) {
    const b = `blk.${i}`;
    list.push(
      [`${b}.attn_norm.weight`, [s.hidden], "norm"],
      [`${b}.ffn_down_exps.weight`, [s.expertIntermediate, s.hidden, s.experts], "expert"],
      [`${b}.ffn_gate_exps.weight`, [s.hidden, s.expertIntermediate, s.experts], "expert"],
      [`${b}.ffn_up_exps.weight`, [s.hidden, s.expertIntermediate, s.experts], "expert"],
      [`${b}.ffn_gate_inp.weight`, [s.hidden, s.experts], "router"],
      [`${b}.ffn_norm.weight`, [s.hidden], "norm"],
      [`${b}.attn_k_norm.weight`, [s.headDim], "norm"],
      [`${b}.attn_k.weight`, [s.hidden, kv], "attention"],
      [`${b}.attn_output.weight`, [q, s.hidden], "attention"],
      [`${b}.attn_q_norm.weight`, [s.headDim], "norm"],
      [`${b}.attn_q.weight`, [s.hidden, q], "attention"],
      [`${b}.attn_v.weight`, [s.hidden, kv], "attention"],
    );
  }
  list.push(["output_norm.weight", [s.hidden], "norm"]);
  return list.map(([name, ne, role]) => ({ name, ne, role, type: tensorType(s, fileType, name, ne) }));
}

/** gguf-py's model_weight_count_rounded_notation. */
function roundedCount(n: number): string {
  const [scaled, suffix] = n > 1e12 ? [n * 1e-12, "T"] : n > 1e9 ? [n * 1e-9, "B"] : n > 1e6 ? [n * 1e-6, "M"] : [n * 1e-3, "K"];
  const digits = Math.max(2 - String(Math.round(scaled)).length, 0);
  return `${scaled.toFixed(digits)}${suffix}`;
}

/** general.size_label as the converter computes it: experts x (shared weights + one expert's). */
export function sizeLabel(tensors: readonly PlannedTensor[], experts: number): string {
  let shared = 0;
  let perExpert = 0;
  for (const t of tensors) {
    const n = t.ne.reduce((a, b) => a * b, 1);
    if (t.name.includes("_exps.")) perExpert += n / experts;
    else shared += n;
  }
  return `${experts}x${roundedCount(shared + perExpert)}`;
}

/** The general.* and qwen3moe.* keys, in the converter's order; tokenizer keys go between. */
export function qwen3MoeMetadata(s: Qwen3MoeShape, fileType: ModelFileType, tokenizer: GgufMetadata): GgufMetadata {
  const u32 = (value: number) => ({ type: "u32", value }) as const;
  const f32 = (value: number) => ({ type: "f32", value }) as const;
  const str = (value: string) => ({ type: "string", value }) as const;
  const a = "qwen3moe";
  return [
    ["general.architecture", str(a)],
    ["general.type", str("model")],
    ["general.name", str(`vkmoe random ${s.name}`)],
    ["general.size_label", str(sizeLabel(qwen3MoeTensors(s, fileType), s.experts))],
    [`${a}.block_count`, u32(s.layers)],
    [`${a}.context_length`, u32(s.contextLength)],
    [`${a}.embedding_length`, u32(s.hidden)],
    [`${a}.feed_forward_length`, u32(s.denseIntermediate)],
    [`${a}.attention.head_count`, u32(s.heads)],
    [`${a}.attention.head_count_kv`, u32(s.kvHeads)],
    [`${a}.rope.freq_base`, f32(s.ropeTheta)],
    [`${a}.attention.layer_norm_rms_epsilon`, f32(s.rmsEps)],
    [`${a}.expert_count`, u32(s.experts)],
    [`${a}.expert_used_count`, u32(s.topK)],
    [`${a}.attention.key_length`, u32(s.headDim)],
    [`${a}.attention.value_length`, u32(s.headDim)],
    ["general.file_type", u32(LLAMA_FTYPE[fileType])],
    [`${a}.expert_feed_forward_length`, u32(s.expertIntermediate)],
    ["general.quantization_version", u32(2)],
    ...tokenizer,
  ];
}
