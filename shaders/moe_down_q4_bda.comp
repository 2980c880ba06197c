#version 450
#extension GL_GOOGLE_include_directive : require
// moe_down_q4_bda: grouped MoE down over every (token, expert) pair of a layer call. See moe.glsl.
#define MOE
#define COLUMN_BLOCKS  // the down matrix's blob layout
#define ADDR_BDA
#define QBITS 4
#include "gemv_float.glsl"
