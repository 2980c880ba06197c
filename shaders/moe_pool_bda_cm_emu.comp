#version 450
#extension GL_GOOGLE_include_directive : require
// moe_pool_bda_cm_emu: moe_pool_bda_cm with plain sums in place of the cooperative matrices (cm_slice_tile.glsl's
// CM_EMULATE), for testing the loaders and the epilogue on devices without them.
#define ADDR_BDA
#define CM_EMULATE
#include "moe_pool_cm.glsl"
