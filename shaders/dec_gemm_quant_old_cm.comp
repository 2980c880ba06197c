#version 450
// dec_gemm_quant_old_cm: see dec_gemm_quant_old.glsl.
#extension GL_GOOGLE_include_directive : require
#include "dec_gemm_quant_old.glsl"
