#version 450
#extension GL_GOOGLE_include_directive : require
// moe_fused_q8_idp_desc: a whole MoE layer call of few tokens in one dispatch on the integer-dot
// path (x quantized into shared memory per workgroup, integer-dot gate+up, float down split over I
// with float atomics, the sum over slots). See moe.glsl.
#define MOE
#define GATEUP
#define FUSED
#define QBITS 8
#include "gemv_idp.glsl"
