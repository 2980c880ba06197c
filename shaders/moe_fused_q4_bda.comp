#version 450
#extension GL_GOOGLE_include_directive : require
// moe_fused_q4_bda: a whole MoE layer call of few tokens in one dispatch (gate+up, SiLU, down
// split over I with float atomics, the sum over slots). See moe.glsl.
#define MOE
#define GATEUP
#define FUSED
#define ADDR_BDA
#define QBITS 4
#include "gemv_float.glsl"
