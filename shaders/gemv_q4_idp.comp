#version 450
#extension GL_GOOGLE_include_directive : require
// gemv_q4_idp: y[s,o] = sum_g xscale(s,g) * wscale(o,g) * idot_g, int8 activations from
// quantize_act.comp, q4 weights, packed 4x8 integer dot products.  See README.md.
#define QBITS 4
#include "gemv_idp.glsl"
