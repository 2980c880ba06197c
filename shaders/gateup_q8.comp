#version 450
#extension GL_GOOGLE_include_directive : require
// gateup_q8: h[s,o] = silu(x.Wg[o]) * (x.Wu[o]), q8 weights, float path.  See README.md.
#define QBITS 8
#define GATEUP 1
#include "gemv_float.glsl"
