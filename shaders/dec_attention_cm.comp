#version 450
// dec_attention_cm: see dec_attention_cm.glsl.
#extension GL_GOOGLE_include_directive : require
#include "dec_attention_cm.glsl"
