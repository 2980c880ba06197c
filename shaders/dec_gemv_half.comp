#version 450
// dec_gemv_half: y[s, o] = sum_i W[o, i] * x[s, i] for S = 1..8 tokens, W row-major [O][I] of
// 16-bit floats (f16, or bf16 with flags bit 0) packed two per uint, element 2j of the flat
// array in the low half (a float GGUF / safetensors tensor as it is): with I odd, rows start
// mid-word.  With flags bit 1, W is f32 instead, one element per uint (weightOffset then counts
// f32 elements).  x f32 [S][I] at xOffset, y f32 [S][O] at yOffset, f32 accumulation.
//
// One workgroup per block of ROWS_PER_WG rows; thread t takes the 8-column chunks t, t + WG, ...
// of all the block's rows, and each weight is read once for all S tokens (S * ROWS_PER_WG
// accumulators).  Then subgroupAdd and shared memory across subgroups (or a shared-memory tree).
// Weight loads: uvec4 when I % 8 == 0 and weightOffset % 4 == 0, else 4 uint loads per chunk
// when I is even, else one load per half; the last partial chunk (I % 8 != 0) is read half by
// half, with weights and x past I taken as 0.  f32 weights: two uvec4 loads per chunk when
// I % 4 == 0 and weightOffset % 4 == 0, else 8 uint loads; the tail element by element.
// The arithmetic is gemv_half.glsl's, shared with dec_router_route.
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS_PER_WG = 4u;
layout(constant_id = 2) const bool USE_SUBGROUP = true;

const uint WG = gl_WorkGroupSize.x;

layout(std430, binding = 0) readonly restrict buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly restrict buffer W1 { uint w1[]; };
layout(std430, binding = 1) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 1) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 2) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;
    uint S;             // 1..8
    uint weightOffset;  // uints (two halves each; f32 weights: one element each)
    uint xOffset;       // floats
    uint yOffset;       // floats
    uint flags;         // bit 0: bf16 (else f16); bit 1: f32 weights (bit 0 ignored)
} pc;

#include "gemv_half.glsl"

void main() {
    const uint block = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint rowBase = block * R;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform
    gemvHalfRows(rowBase);
}
