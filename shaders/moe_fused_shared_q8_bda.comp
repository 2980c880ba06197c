#version 450
#extension GL_GOOGLE_include_directive : require
// moe_fused_shared_q8_bda: moe_fused_q8_bda with the layer's shared expert as one more slot a token (its own
// blob address, weighted by sigmoid(x . its shared_expert_gate row)). See moe.glsl, SHARED_SLOT.
#define MOE
#define GATEUP
#define FUSED
#define SHARED_SLOT
#define ADDR_BDA
#define QBITS 8
#include "gemv_float.glsl"
