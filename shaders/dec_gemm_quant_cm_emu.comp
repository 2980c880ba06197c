#version 450
// dec_gemm_quant_cm_emu: dec_gemm_quant_cm with plain sums in place of the cooperative matrices (gemm_coopmat_tile.glsl's
// CM_EMULATE), for testing the loaders, the epilogue and the split on devices without them.
#extension GL_GOOGLE_include_directive : require
#define CM_EMULATE
#include "dec_gemm_quant_cm.glsl"
