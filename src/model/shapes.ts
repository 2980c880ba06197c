/**
 * Named Qwen3-MoE shapes (llama.cpp arch `qwen3moe`): the dimensions a random-weight model file is
 * made with, so benchmarks of full-size models need no download. The Qwen3.5/3.6 MoE shapes (arch
 * `qwen35moe`) are in qwen35moe-gguf-layout.ts; shapeByName finds both.
 */
import type { Qwen3MoeConfig } from "./config.ts";
import { QWEN35_MOE_SHAPES, type Qwen35MoeShape } from "./qwen35moe-gguf-layout.ts";

/** A model's dimensions, named as Qwen3MoeConfig names them, plus the context length written to the file. */
export type Qwen3MoeShape = { name: string; contextLength: number } & Pick<
  Qwen3MoeConfig,
  "hidden" | "layers" | "heads" | "kvHeads" | "headDim" | "experts" | "topK" | "expertIntermediate" | "denseIntermediate" | "vocab" | "ropeTheta" | "rmsEps" | "normTopkProb"
>;

/** Every row length (hidden, heads*headDim, expertIntermediate) is a multiple of 256, as K-quants need. */
const tiny: Qwen3MoeShape = {
  name: "tiny",
  hidden: 256,
  layers: 2,
  heads: 4,
  kvHeads: 2,
  // 128 like the real model, so attention kernels see its head size.
  headDim: 128,
  // Not 8: llama-quantize gives 8-expert models a Q8_0 attn_v, which would make the type plan differ.
  experts: 16,
  topK: 4,
  expertIntermediate: 256,
  denseIntermediate: 1024,
  vocab: 151936,
  ropeTheta: 1e6,
  rmsEps: 1e-6,
  contextLength: 4096,
  normTopkProb: true,
};

/** Qwen/Qwen3-30B-A3B's config.json. */
const qwen3_30bA3b: Qwen3MoeShape = {
  name: "qwen3-30b-a3b",
  hidden: 2048,
  layers: 48,
  heads: 32,
  kvHeads: 4,
  headDim: 128,
  experts: 128,
  topK: 8,
  expertIntermediate: 768,
  denseIntermediate: 6144,
  vocab: 151936,
  ropeTheta: 1e6,
  rmsEps: 1e-6,
  contextLength: 40960,
  normTopkProb: true,
};

export const QWEN3_MOE_SHAPES: Readonly<Record<string, Qwen3MoeShape>> = {
  [tiny.name]: tiny,
  [qwen3_30bA3b.name]: qwen3_30bA3b,
};

/** A shape of either family; a Qwen35MoeShape says so in its `family`. */
export type ModelShape = Qwen3MoeShape | Qwen35MoeShape;

export const isQwen35Shape = (s: ModelShape): s is Qwen35MoeShape => "family" in s && s.family === "qwen35moe";

const MODEL_SHAPES: Readonly<Record<string, ModelShape>> = { ...QWEN3_MOE_SHAPES, ...QWEN35_MOE_SHAPES };

export const SHAPE_NAMES: readonly string[] = Object.keys(MODEL_SHAPES);

/** The shape called `name`, or undefined. */
export function shapeByName(name: string): ModelShape | undefined {
  return Object.hasOwn(MODEL_SHAPES, name) ? MODEL_SHAPES[name] : undefined;
}

/** Weights in a model of this shape (every tensor, embeddings and lm_head included). */
export function parameterCount(s: Qwen3MoeShape): number {
  const q = s.heads * s.headDim;
  const kv = s.kvHeads * s.headDim;
  const attention = s.hidden * (q + 2 * kv) + q * s.hidden + 2 * s.headDim + s.hidden;
  const moe = s.hidden * s.experts + 3 * s.experts * s.hidden * s.expertIntermediate + s.hidden;
  return 2 * s.vocab * s.hidden + s.hidden + s.layers * (attention + moe);
}
