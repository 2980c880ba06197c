#version 450
// dec_gemm_ggml_wide_cm: see dec_gemm_ggml_wide.glsl.
#extension GL_GOOGLE_include_directive : require
#include "dec_gemm_ggml_wide.glsl"
