#version 450
// dec_gated_norm: the gated RMSNorm of Gated DeltaNet's output (Qwen3_5MoeRMSNormGated, norm before
// gate), as src/model/linear-attention.ts gatedRmsNorm: per row of n (a value head of a token),
// y = w * (x / sqrt(mean(x^2) + eps)) * silu(z); the weight as is (not 1 + w). One workgroup per
// (head, token) row. y may alias x (every element is read and written by the same invocation).
// dec_delta_rule fuses the same norm in (flags bit 0); this is the unfused form for callers whose
// rows are not one workgroup's (a chunked prefill).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 2) const bool USE_SUBGROUP = true;

const uint WG = gl_WorkGroupSize.x;

#include "dec_linear_attention.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer Zb { float z[]; };
layout(set = 0, binding = 2) readonly buffer W { float w[]; };
layout(set = 0, binding = 3) buffer Y { float y[]; };

layout(push_constant) uniform Params {
    uint S;          // tokens
    uint heads;      // rows per token
    uint n;          // row length (the value head dim)
    uint xOffset;    // floats: row (t, h) at xOffset + t * xStride + h * n
    uint xStride;
    uint zOffset;    // likewise
    uint zStride;
    uint wOffset;    // n floats
    uint yOffset;    // likewise
    uint yStride;
    float eps;
} pc;

void main() {
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    if (h >= pc.heads || t >= pc.S) return;  // uniform per workgroup
    const uint li = gl_LocalInvocationIndex;
    const uint xo = pc.xOffset + t * pc.xStride + h * pc.n;
    const uint zo = pc.zOffset + t * pc.zStride + h * pc.n;
    const uint yo = pc.yOffset + t * pc.yStride + h * pc.n;
    float ss = 0.0;
    for (uint i = li; i < pc.n; i += WG) ss += x[xo + i] * x[xo + i];
    const float total = workgroupSum(ss, min(WG, pc.n));
    const float inv = 1.0 / sqrt(total / float(pc.n) + pc.eps);
    for (uint i = li; i < pc.n; i += WG) y[yo + i] = (w[pc.wOffset + i] * (x[xo + i] * inv)) * silu(z[zo + i]);
}
