#version 450
// dec_gemm_ggml_wide_cm_emu: dec_gemm_ggml_wide_cm with plain sums in place of the cooperative matrices
// (cm_slice_tile.glsl's CM_EMULATE), for testing the loaders and the epilogue on devices without them.
#extension GL_GOOGLE_include_directive : require
#define CM_EMULATE
#include "dec_gemm_ggml_wide.glsl"
