#version 450
#extension GL_GOOGLE_include_directive : require
// moe_pool_desc_cm: see moe_pool_cm.glsl (desc addressing).

#include "moe_pool_cm.glsl"
