#version 450
#extension GL_GOOGLE_include_directive : require
// moe_down_q4_idp_desc: grouped MoE down on the integer-dot path (h quantized to int8 by
// quantize_act, packed 4x8 dot products) over every (token, expert) pair of a layer call. See moe.glsl.
#define MOE
#define COLUMN_BLOCKS  // the down matrix's blob layout
#define QBITS 4
#include "gemv_idp.glsl"
