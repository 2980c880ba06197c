#version 450
#extension GL_GOOGLE_include_directive : require
// moe_pool_bda_cm: see moe_pool_cm.glsl (bda addressing).
#define ADDR_BDA
#include "moe_pool_cm.glsl"
