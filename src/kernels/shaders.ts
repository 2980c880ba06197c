/** The compiled shaders and their host-side interface (bindings, push-constant sizes). See shaders/README.md. */
import { fileURLToPath } from "node:url";
import type { PipelineSpec } from "../vk/pipeline.ts";

export const shaderFile = (name: string) => fileURLToPath(new URL(`../../shaders/${name}.spv`, import.meta.url));

export interface ShaderInterface {
  name: string;
  storageBuffers: number;
  pushConstantBytes: number;
}

const iface = (name: string, storageBuffers: number, pushWords: number): ShaderInterface => ({ name, storageBuffers, pushConstantBytes: 4 * pushWords });

/** Float-path GEMV: weights, scales, x, y; push O, I, S, rowWords, groupsPerRow, weightOffset (uvec4), scaleOffset, xOffset, yOffset. */
export const GEMV = { q4: iface("gemv_q4", 4, 9), q8: iface("gemv_q8", 4, 9) } as const;
/** Fused gate+up: gate w/s, up w/s, x, h; push O, I, S, rowWords, groupsPerRow, gateW, gateS, upW, upS, xOffset, hOffset, limit. */
export const GATEUP = { q4: iface("gateup_q4", 6, 12), q8: iface("gateup_q8", 6, 12) } as const;
/** Activation quantization: x, xq, xscale, xsum; push I, S, groupsPerRow, xOffset, xqRowWords. */
export const QUANTIZE_ACT = iface("quantize_act", 4, 5);
/** Integer-dot GEMV: weights, wscales, xq, xscale, xsum, y; push O, I, S, rowWords, groupsPerRow, weightOffset, scaleOffset, xqRowWords, yOffset. */
export const GEMV_IDP = { q4: iface("gemv_q4_idp", 6, 9), q8: iface("gemv_q8_idp", 6, 9) } as const;

/** Integer-dot GEMV from GGML blocks (decoder/ggml-gemv.ts): blocks, xq, xscale, xsum, y; push O, I, S, blockOffset, yOffset. */
export const DEC_GEMV_GGML_IDP = iface("dec_gemv_ggml_idp", 5, 5);
/** Integer-dot GEMM from GGML blocks, prompt chunks (decoder/ggml-gemm.ts): blocks, xq, xscale, xsum, y, partial tiles, arrival words; push O, I, S, blockOffset, yOffset, splits, splitCols. */
export const DEC_GEMM_GGML_IDP = iface("dec_gemm_ggml_idp", 7, 7);
/** Integer-dot GEMM of q4/q8 pool matrices, prompt chunks (decoder/quant-gemm-idp.ts): weights, scales (one buffer bound twice), xq, xscale, xsum, y, partial tiles, arrival words; push O, I, S, rowWords, groupsPerRow, weightOffset, scaleOffset, yOffset, splits, splitCols. */
export const DEC_GEMM_QUANT_IDP = iface("dec_gemm_quant_idp", 8, 10);
/** Integer-dot GGML experts, a row per lane (src/moe/ggml-experts.ts): xq, work, pairs, out, slot weights, expert bytes, expert table, xscale, xsum; push O, cols. */
export const MOE_GGML_ROWS_IDP = iface("moe_ggml_rows_idp", 9, 2);

export function pipelineSpec(s: ShaderInterface, specialization: Record<number, number> = {}): PipelineSpec {
  return { spirv: shaderFile(s.name), storageBuffers: s.storageBuffers, pushConstantBytes: s.pushConstantBytes, specialization };
}

/** Grouped MoE kernels (shaders/moe.glsl): x/h, work, pairs, out, slot weights (+ the slab array on the descriptor path). */
export const MOE_BINDINGS = 5;
/** The integer-dot gate+up adds xscale and xsum (bindings 5, 6); its slab array is binding 7. */
export const MOE_IDP_BINDINGS = 7;
export const MOE_PUSH_BYTES = 36;
/**
 * The one-dispatch call of few tokens: x, work, slot experts, y, slot weights, completion word,
 * arrival count, per-token accumulators, the pre-launch gate (+ slabs at 9); push constants: gate+up's 9 words, then the
 * down matrix's rowWords, groupsPerRow, weight offset (uvec4), scale offset (words).
 */
export const MOE_FUSED_BINDINGS = 9;
export const MOE_FUSED_PUSH_BYTES = 52;
/**
 * moe_fused_shared_* (BDA addressing only): the same, plus the layers' shared_expert_gate rows at
 * binding 9; push constants: the fused kernel's, then the shared expert's blob address (lo, hi)
 * and the offset of its gate row (floats).
 */
export const MOE_FUSED_SHARED_BINDINGS = 10;
export const MOE_FUSED_SHARED_PUSH_BYTES = 64;

/** The MoE layer's integer-dot gate+up as the probe creates it (8 slabs on the descriptor path). */
const moeIdpSpec = (format: "q4" | "q8", addressing: "bda" | "desc", groupSize: number): PipelineSpec => addressing === "bda"
  ? { spirv: shaderFile(`moe_gateup_${format}_idp_bda`), storageBuffers: MOE_IDP_BINDINGS, pushConstantBytes: MOE_PUSH_BYTES, specialization: { 4: groupSize } }
  : {
    spirv: shaderFile(`moe_gateup_${format}_idp_desc`), storageBuffers: MOE_IDP_BINDINGS + 1, pushConstantBytes: MOE_PUSH_BYTES,
    descriptorCounts: [...Array.from({ length: MOE_IDP_BINDINGS }, () => 1), 8], specialization: { 4: groupSize, 8: 8 },
  };

/** The graph stage's integer-dot grouped down as the probe creates it (DOWN_KERNEL's shape: 256 threads, a row a lane, 8 slices). */
const moeDownIdpSpec = (format: "q4" | "q8", addressing: "bda" | "desc", groupSize: number): PipelineSpec => {
  const specialization = { 0: 256, 1: 32, 4: groupSize, 5: 1, 6: 32 };
  return addressing === "bda"
    ? { spirv: shaderFile(`moe_down_${format}_idp_bda`), storageBuffers: MOE_IDP_BINDINGS, pushConstantBytes: MOE_PUSH_BYTES, specialization }
    : {
      spirv: shaderFile(`moe_down_${format}_idp_desc`), storageBuffers: MOE_IDP_BINDINGS + 1, pushConstantBytes: MOE_PUSH_BYTES,
      descriptorCounts: [...Array.from({ length: MOE_IDP_BINDINGS }, () => 1), 8], specialization: { ...specialization, 8: 8 },
    };
};

/** The MoE layer's fused integer-dot call as the probe creates it (256 threads x 32 rows, D = 2048). */
const moeFusedIdpSpec = (format: "q4" | "q8", addressing: "bda" | "desc", groupSize: number, prelaunched: boolean): PipelineSpec => {
  const specialization = { 0: 256, 1: 32, 4: groupSize, 5: 32, 6: 8, 9: 2048, 10: prelaunched ? 1 : 0 };
  return addressing === "bda"
    ? { spirv: shaderFile(`moe_fused_${format}_idp_bda`), storageBuffers: MOE_FUSED_BINDINGS, pushConstantBytes: MOE_FUSED_PUSH_BYTES, specialization }
    : {
      spirv: shaderFile(`moe_fused_${format}_idp_desc`), storageBuffers: MOE_FUSED_BINDINGS + 1, pushConstantBytes: MOE_FUSED_PUSH_BYTES,
      descriptorCounts: [...Array.from({ length: MOE_FUSED_BINDINGS }, () => 1), 8], specialization: { ...specialization, 8: 8 },
    };
};

/** Every integer dot-product pipeline; the child-process probe creates each before the path is enabled. */
export const IDP_PIPELINES: PipelineSpec[] = [
  ...[QUANTIZE_ACT, GEMV_IDP.q4, GEMV_IDP.q8].flatMap((s) => [32, 128].map((g) => pipelineSpec(s, { 4: g }))),
  ...(["q4", "q8"] as const).flatMap((f) => [32, 128].flatMap((g) => [moeIdpSpec(f, "desc", g), moeDownIdpSpec(f, "desc", g)])),
  // the q4/q8 pool matrices' prompt-chunk GEMM (f16 scales, as GGUF's Q4_0 / Q8_0 and the quantized checkpoints have)
  ...[4, 8].flatMap((bits) => [32, 128].map((g) => pipelineSpec(DEC_GEMM_QUANT_IDP, { 0: bits, 1: 1, 2: g }))),
  // the GGML blocks' integer-dot GEMV and prompt-chunk GEMM (one pipeline each per GGML_FMT_*, Q4_1 .. Q6_K) and their x quantization (groups of 16)
  pipelineSpec(QUANTIZE_ACT, { 0: 128, 4: 16 }),
  ...[0, 1, 2, 3, 4, 5].map((format) => pipelineSpec(DEC_GEMV_GGML_IDP, { 3: format })),
  ...[0, 1, 2, 3, 4, 5].map((format) => pipelineSpec(DEC_GEMM_GGML_IDP, { 0: format })),
];
/** The GGML experts' integer-dot rows kernel (prompt chunks; gate+up and down per format, 2, 4 and 8 lanes a row), created by the probe where subgroup shuffles are supported. */
export const IDP_SHUFFLE_PIPELINES: PipelineSpec[] = [0, 1, 2, 3, 4, 5].flatMap((format) => [0, 1].flatMap((gateUp) => [2, 4, 8].map((lanes) => pipelineSpec(MOE_GGML_ROWS_IDP, { 0: 64, 2: format, 3: 8, 4: gateUp, 5: lanes }))));
/** The same, created by the probe only where bufferDeviceAddress is enabled. */
export const IDP_BDA_PIPELINES: PipelineSpec[] = (["q4", "q8"] as const).flatMap((f) => [32, 128].flatMap((g) => [moeIdpSpec(f, "bda", g), moeDownIdpSpec(f, "bda", g)]));
/** The fused MoE call's integer-dot pipelines, created by the probe where float atomics are enabled (BDA ones where BDA is). */
export const idpFusedPipelines = (bda: boolean): PipelineSpec[] =>
  (["q4", "q8"] as const).flatMap((f) => [32, 128].flatMap((g) => [false, true].flatMap((pre) => [moeFusedIdpSpec(f, "desc", g, pre), ...(bda ? [moeFusedIdpSpec(f, "bda", g, pre)] : [])])));
/** Part of the cached verdict's name: a new set of probed pipelines (or changed SPIR-V of them, as in v3: moe.glsl; v4: the fused call; v5: one column loop; v6: the fused call quantizes with subgroup shuffles; v7: its pre-launched variant; v8: down by column blocks; v9: the gate clears its decision word; v10: the GGML blocks' GEMV; v11: the GGML experts' rows kernel; v12: the GGML blocks' prompt-chunk GEMM; v13: that GEMM split over the columns; v14: the graph stage's grouped down, the pool matrices' prompt-chunk GEMM, the GGML one's tile shared with it) is probed again. */
export const IDP_PROBE_VERSION = 14;
