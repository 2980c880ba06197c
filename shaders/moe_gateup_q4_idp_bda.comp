#version 450
#extension GL_GOOGLE_include_directive : require
// moe_gateup_q4_idp_bda: grouped MoE gate+up on the integer-dot path (int8 activations from
// quantize_act, packed 4x8 dot products) over every (token, expert) pair of a layer call. See moe.glsl.
#define MOE
#define GATEUP
#define ADDR_BDA
#define QBITS 4
#include "gemv_idp.glsl"
