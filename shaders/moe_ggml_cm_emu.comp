#version 450
// moe_ggml_cm_emu: moe_ggml_cm with plain sums in place of the cooperative matrices (gemm_coopmat_tile.glsl's
// CM_EMULATE), for testing the loaders and the epilogue on devices without them.
#extension GL_GOOGLE_include_directive : require
#define CM_EMULATE
#include "moe_ggml_cm.glsl"
