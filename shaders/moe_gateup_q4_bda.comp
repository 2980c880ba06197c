#version 450
#extension GL_GOOGLE_include_directive : require
// moe_gateup_q4_bda: grouped MoE gateup over every (token, expert) pair of a layer call. See moe.glsl.
#define MOE
#define GATEUP
#define ADDR_BDA
#define QBITS 4
#include "gemv_float.glsl"
