#version 450
// dec_attention_cm_emu: dec_attention_cm with plain sums in place of the cooperative matrices
// (dec_attention_cm.glsl's CM_EMULATE), for testing its tiles, masks and softmax on devices without them.
#extension GL_GOOGLE_include_directive : require
#define CM_EMULATE
#include "dec_attention_cm.glsl"
