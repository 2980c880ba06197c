#version 450
// dec_gemm_quant_wide_cm: see dec_gemm_quant_wide.glsl.
#extension GL_GOOGLE_include_directive : require
#include "dec_gemm_quant_wide.glsl"
