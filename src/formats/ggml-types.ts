/**
 * ggml tensor types as GGUF stores them: the ids of ggml.h's `enum ggml_type` (stable; the
 * removed Q4_2/Q4_3/Q4_0_4_4... ids are gaps), and the byte sizes of the ones vkmoe reads.
 */
import { GGML_BLOCK_LAYOUTS, GGML_BLOCK_TYPES } from "../quant/ggml-blocks.ts";
import type { TensorDType } from "./tensor.ts";

const GGML_TYPE_NAMES: Record<number, string> = {
  0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
  10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
  16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
  24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
  34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
};

export function ggmlTypeName(type: number): string {
  return GGML_TYPE_NAMES[type] ?? `type ${type}`;
}

/** How each readable type lays out: `blockBytes` bytes hold `blockElements` consecutive elements of a row. */
interface Encoding {
  dtype: TensorDType;
  blockElements: number;
  blockBytes: number;
}

const READABLE: Record<number, Encoding> = {
  0: { dtype: "F32", blockElements: 1, blockBytes: 4 },
  1: { dtype: "F16", blockElements: 1, blockBytes: 2 },
  30: { dtype: "BF16", blockElements: 1, blockBytes: 2 },
  8: { dtype: "Q8_0", blockElements: 32, blockBytes: 34 }, // f16 scale + 32 × i8
  2: { dtype: "Q4_0", blockElements: 32, blockBytes: 18 }, // f16 scale + 32 × 4-bit
  // Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: opened as views in their block layout (src/quant/ggml-blocks.ts);
  // the model layer says where it cannot use them.
  ...Object.fromEntries(GGML_BLOCK_TYPES.map((t) => {
    const { ggmlType, blockElements, blockBytes } = GGML_BLOCK_LAYOUTS[t];
    return [ggmlType, { dtype: t, blockElements, blockBytes }];
  })),
};

export function readableGgmlType(type: number): Encoding | undefined {
  return READABLE[type];
}
