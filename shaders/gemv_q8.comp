#version 450
#extension GL_GOOGLE_include_directive : require
// gemv_q8: y[s,o] = sum_i x[s,i] * dequant(W)[o,i], q8 weights, float path.  See README.md.
#define QBITS 8
#include "gemv_float.glsl"
