/**
 * The tensor types llama.cpp's llama-quantize picks for a qwen3moe model in the K-quant file types
 * people download (llama_tensor_get_type in src/llama-quant.cpp, no imatrix, no overrides), so that a
 * random model made here is mixed as a real Q4_K_M / Q5_K_M / Q6_K / Q5_0 file is. Checked against
 * llama-quantize itself (test/make-model-kquant.test.ts).
 */
import type { GgmlTypeName } from "../formats/gguf-writer.ts";

export type QuantMixFileType = "q4_k_m" | "q5_k_m" | "q6_k" | "q5_0";

/** The ftype's default type (llama_ftype_get_default_type). */
const DEFAULT_TYPE: Record<QuantMixFileType, GgmlTypeName> = { q4_k_m: "Q4_K", q5_k_m: "Q5_K", q6_k: "Q6_K", q5_0: "Q5_0" };

const BLOCK: Partial<Record<GgmlTypeName, number>> = { Q4_K: 256, Q5_K: 256, Q6_K: 256, Q4_0: 32, Q4_1: 32, Q5_0: 32, Q5_1: 32, Q8_0: 32 };

/**
 * tensor_type_fallback: a row length the type's block does not divide takes the next type of
 * 32-element blocks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), or F16 when 32 does not divide it either.
 */
function fallback(type: GgmlTypeName, rowLength: number): GgmlTypeName {
  if (rowLength % (BLOCK[type] ?? 1) === 0) return type;
  const next: GgmlTypeName = type === "Q4_K" ? "Q5_0" : type === "Q5_K" ? "Q5_1" : type === "Q6_K" ? "Q8_0" : "F16";
  return rowLength % (BLOCK[next] ?? 1) === 0 ? next : "F16";
}

/**
 * use_more_bits: the first and last eighth of the layers and every third one between get more bits
 * (C's integer division; i < n/8 is tested first, so the modulo never sees a negative).
 */
export function useMoreBits(layer: number, layers: number): boolean {
  const eighth = Math.trunc(layers / 8);
  return layer < eighth || layer >= Math.trunc((7 * layers) / 8) || (layer - eighth) % 3 === 2;
}

/** The layer of a `blk.N.` tensor. */
function layerOf(name: string): number {
  const m = /^blk\.(\d+)\./.exec(name);
  if (!m) throw new RangeError(`${name} is not a layer's tensor`);
  return Number(m[1]);
}

export interface MixModel {
  layers: number;
  experts: number;
}

/**
 * The type of tensor `name` (GGUF dims `ne`) in a `fileType` file of a qwen3moe (or qwen35moe) model, as
 * llama-quantize chooses it. Tensors it does not quantize (norms, the router) stay F32, as the
 * converter writes them. attn_v counts layers in order: llama.cpp visits tensors by layer number
 * (the model loader's weight_name_comparer), and qwen3moe has one attn_v per layer.
 */
export function quantMixType(fileType: QuantMixFileType, model: MixModel, name: string, ne: readonly number[]): GgmlTypeName {
  if (ne.length < 2 || name.endsWith("_norm.weight") || name.endsWith("ffn_gate_inp.weight")) return "F32";
  const rowLength = ne[0]!;
  let type = DEFAULT_TYPE[fileType];
  const moreBits = () => useMoreBits(layerOf(name), model.layers);
  const kM = fileType === "q4_k_m" || fileType === "q5_k_m";
  if (name === "output.weight") {
    // Q8_0 where the default type's block does not divide the rows, else Q6_K (nothing here picks Q8_0).
    type = rowLength % BLOCK[type]! !== 0 ? "Q8_0" : "Q6_K";
  } else if (name === "token_embd.weight") {
    // The default type: the lm_head is its own tensor (no tied embeddings) and no rule here touches it.
  } else if (name.includes("attn_v.weight") || name.includes("attn_qkv.weight")) {
    // attn_qkv (qwen35moe's linear layers) is attn_v-like to llama-quantize, counted with attn_v: one of them a layer
    if (kM && moreBits()) type = "Q6_K";
    // "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
    if (model.experts === 8) type = "Q8_0";
  } else if (name.includes("attn_k.weight")) {
    if (model.experts === 8) type = "Q8_0";
  } else if (name.includes("attn_output.weight")) {
    if (model.experts === 8 && fileType === "q4_k_m") type = "Q5_K";
  } else if (name.includes("ffn_down")) {
    if (kM && moreBits()) type = "Q6_K";
  }
  return fallback(type, rowLength);
}
