#version 450
#extension GL_GOOGLE_include_directive : require
// gemv_q4: y[s,o] = sum_i x[s,i] * dequant(W)[o,i], q4 weights, float path.  See README.md.
#define QBITS 4
#include "gemv_float.glsl"
