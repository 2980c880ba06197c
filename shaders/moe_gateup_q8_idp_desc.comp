#version 450
#extension GL_GOOGLE_include_directive : require
// moe_gateup_q8_idp_desc: grouped MoE gate+up on the integer-dot path (int8 activations from
// quantize_act, packed 4x8 dot products) over every (token, expert) pair of a layer call. See moe.glsl.
#define MOE
#define GATEUP
#define QBITS 8
#include "gemv_idp.glsl"
