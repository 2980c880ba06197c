#version 450
// moe_ggml_cm: see moe_ggml_cm.glsl.
#extension GL_GOOGLE_include_directive : require
#include "moe_ggml_cm.glsl"
