#version 450
#extension GL_GOOGLE_include_directive : require
// moe_down_sum_q8_bda: MoE down for calls of few tokens, each token's slots summed in the
// workgroup (no separate sum dispatch). See moe.glsl.
#define MOE
#define DOWN_SUM
#define ADDR_BDA
#define QBITS 8
#include "gemv_float.glsl"
