/** GPU kernels of the decoder's dense ops (shaders/dec_*.comp); see shaders/README.md for their interfaces. */
export { DecoderKernel, pushWords, submitAndWait, type DecoderKernelOptions } from "./common.ts";
export { DEC_RMSNORM, RMSNORM_MAX_N, RmsNormKernel, type RmsNormArgs, type RmsNormKernelOptions } from "./rmsnorm.ts";
export { DEC_ROPE_KV, ROPE_MAX_POSITION, RopeKvKernel, type RopeKvArgs, type RopeKvKernelOptions } from "./rope-kv.ts";
export { ARGMAX_NONE, DEC_ARGMAX, ArgmaxKernel, type ArgmaxArgs, type ArgmaxKernelOptions } from "./argmax.ts";
export { DEC_TOPK, TOPK_MAX, TopKKernel, type TopKArgs, type TopKKernelOptions } from "./topk.ts";
export { DecoderAttention, type AttentionBuffers, type DecoderAttentionOptions } from "./attention.ts";
export { DEC_GEMV_HALF, GEMV_HALF_MAX_S, GemvHalfKernel, type GemvHalfArgs, type GemvHalfKernelOptions, type HalfDType } from "./gemv-half.ts";
export { DEC_GEMM_FLOAT, DEC_GEMM_FLOAT_TILE, FLOAT_GEMM_MAX_ROWS, FLOAT_GEMM_NARROW_MAX_ROWS, FLOAT_GEMM_NARROW_TOKENS, FLOAT_GEMM_TILE_FROM_TOKENS, FLOAT_GEMM_TILE_ROWS, FLOAT_GEMM_TILE_TOKENS, FloatGemmKernel, FloatGemmTileKernel, floatGemmShape, type FloatGemm, type FloatGemmArgs, type FloatGemmKernelOptions } from "./float-gemm.ts";
export { COOPMAT_GEMM_ROWS, DEC_GEMM_QUANT, DEC_GEMM_QUANT_CM, GEMM_ROWS, GEMM_TOKENS, QuantGemmKernel, type ChunkGemmOptions } from "./quant-gemm.ts";
export { QuantGemmIdpKernel, type QuantGemmIdpArgs } from "./quant-gemm-idp.ts";
export { DEC_GEMM_GGML, DEC_GEMM_GGML_CM, GGML_GEMM_ROWS, GGML_GEMM_TOKENS, GgmlGemmKernel, type GgmlGemmArgs } from "./ggml-gemm.ts";
export { DEC_GROUP_EXPERTS, GroupExpertsKernel, type GroupExpertsArgs, type GroupExpertsKernelOptions } from "./group-experts.ts";
export { DEC_ROUTE, ROUTE_MAX_E, ROUTE_MAX_K, ROUTE_MAX_S, RouteKernel, type RouteArgs, type RouteKernelOptions } from "./route.ts";
export { CONV1D_MAX_KERNEL, CONV1D_MAX_S, CONV1D_TOKEN_BLOCK, Conv1dKernel, DEC_CONV1D, type Conv1dArgs, type Conv1dKernelOptions } from "./conv1d.ts";
export { DEC_DELTA_RULE, DELTA_RULE_MAX_S, DeltaRuleKernel, type DeltaRuleArgs, type DeltaRuleConv, type DeltaRuleKernelOptions } from "./delta-rule.ts";
export { DEC_GATED_NORM, GatedNormKernel, type GatedNormArgs, type GatedNormKernelOptions } from "./gated-norm.ts";
export { DEC_GATING, GatingKernel, type GatingArgs, type GatingMode } from "./gating.ts";
