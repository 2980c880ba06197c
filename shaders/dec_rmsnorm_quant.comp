#version 450
// dec_rmsnorm_quant: dec_rmsnorm (one workgroup per row, the residual add with flags bit 0) that
// also writes its output quantized for the integer-dot GGML GEMVs, exactly as quantize_act with
// groups of 16 would from y: the GEMVs that read the norm (q, k, v; the shared expert) then need
// no quantize dispatch and barrier of their own. Per group of 16 columns of a row:
//   amax = max |y|;  amax == 0 -> scale 0, q 0;  else amax = m * 2^e (frexp), scale = 2^(e-7),
//   q = clamp(roundEven(y * 2^(7-e)), -127, 127)
// xq: row r's group g at uvec4 r * n/16 + g (byte j of word k is column 4k + j), xscale and xsum
// (int, the sum of q) at r * n/16 + g. n is a multiple of 16. Each invocation owns whole groups in
// both passes, so it reads back only what it wrote itself (y may alias x, as in dec_rmsnorm); its
// first group it keeps in registers, with that group's weights loaded before the reduction.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "quantize_group16.glsl"

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 2) const bool USE_SUBGROUP = true;

// Read and written as vec4 (16-byte accesses, a quarter of the instructions): every offset and
// stride is a multiple of 4 floats (the host checks).
layout(set = 0, binding = 0) buffer X { vec4 x[]; };
layout(set = 0, binding = 1) readonly buffer Add { vec4 add[]; };
layout(set = 0, binding = 2) readonly buffer W { vec4 w[]; };
layout(set = 0, binding = 3) buffer Y { vec4 y[]; };
layout(set = 0, binding = 4) writeonly buffer XQ { uvec4 xq[]; };
layout(set = 0, binding = 5) writeonly buffer XS { float xscale[]; };
layout(set = 0, binding = 6) writeonly buffer XU { int xsum[]; };
// flags bit 1 (with bit 0): add[r] + sigmoid(gate[gateOffset + r]) * add2[r], as dec_rmsnorm
layout(set = 0, binding = 7) readonly buffer Add2 { vec4 add2[]; };
layout(set = 0, binding = 8) readonly buffer Gate { float gate[]; };

layout(push_constant) uniform Params {
    uint R;          // rows
    uint n;          // row length, a multiple of 16
    uint xOffset;    // floats
    uint xStride;    // floats between rows of x (and of add)
    uint addOffset;  // floats
    uint wOffset;    // floats
    uint yOffset;    // floats
    uint yStride;    // floats between rows of y
    float eps;
    uint flags;      // bit 0: add the residual first; bit 1: and the scaled add2
    uint gateOffset; // floats: row r's gate at gateOffset + r
} pc;

float sigmoid(float v) { return 1.0 / (1.0 + exp(-v)); }

const uint WG = gl_WorkGroupSize.x;
const uint GROUP = 16u;
shared float partial[WG];

float workgroupSum(float v) {
    if (USE_SUBGROUP) {
        v = subgroupAdd(v);
        const uint nsg = gl_NumSubgroups;
        if (nsg == 1u) return v;
        if (subgroupElect()) partial[gl_SubgroupID] = v;
        barrier();
        float t = 0.0;
        for (uint s = gl_SubgroupInvocationID; s < nsg; s += gl_SubgroupSize) t += partial[s];
        return subgroupAdd(t);
    } else {
        partial[gl_LocalInvocationIndex] = v;
        barrier();
        for (uint s = WG / 2u; s > 0u; s >>= 1u) {
            if (gl_LocalInvocationIndex < s) partial[gl_LocalInvocationIndex] += partial[gl_LocalInvocationIndex + s];
            barrier();
        }
    }
    return partial[0];
}

void main() {
    const uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (r >= pc.R) return;  // uniform per workgroup
    // in vec4s
    const uint xo = (pc.xOffset + r * pc.xStride) >> 2u;
    const uint yo = (pc.yOffset + r * pc.yStride) >> 2u;
    const uint ao = (pc.addOffset + r * pc.xStride) >> 2u;
    const uint wo = pc.wOffset >> 2u;
    const bool residual = (pc.flags & 1u) != 0u;
    const bool scaled = (pc.flags & 2u) != 0u;
    const float sg = scaled ? sigmoid(gate[pc.gateOffset + r]) : 0.0;
    const uint groups = pc.n / GROUP;
    // The thread's first group (its only one where groups <= WG, as in the graphs) stays in registers
    // with its weights, loaded before the reduction: pass 2 then issues no load behind the barrier.
    const uint first = gl_LocalInvocationIndex;
    vec4 keptX[4], keptW[4];
    if (first < groups) [[unroll]] for (uint j = 0u; j < 4u; ++j) keptW[j] = w[wo + 4u * first + j];
    float ss = 0.0;
    for (uint g = gl_LocalInvocationIndex; g < groups; g += WG) {
        precise vec4 v[4];
        [[unroll]] for (uint j = 0u; j < 4u; ++j) v[j] = x[xo + 4u * g + j];
        if (residual) {
            [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                precise vec4 a = add[ao + 4u * g + j];
                if (scaled) a = a + sg * add2[ao + 4u * g + j];
                v[j] = v[j] + a;
                x[xo + 4u * g + j] = v[j];
            }
        }
        if (g == first) [[unroll]] for (uint j = 0u; j < 4u; ++j) keptX[j] = v[j];
        // element order within the group, as the scalar loop
        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
            ss += v[j].x * v[j].x;
            ss += v[j].y * v[j].y;
            ss += v[j].z * v[j].z;
            ss += v[j].w * v[j].w;
        }
    }
    const float total = workgroupSum(ss);
    const float inv = 1.0 / sqrt(total / float(pc.n) + pc.eps);
    for (uint g = gl_LocalInvocationIndex; g < groups; g += WG) {
        float o[GROUP];
        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
            precise vec4 t = (g == first ? keptX[j] : x[xo + 4u * g + j]) * inv;
            precise vec4 v = (g == first ? keptW[j] : w[wo + 4u * g + j]) * t;
            y[yo + 4u * g + j] = v;
            o[4u * j] = v.x;
            o[4u * j + 1u] = v.y;
            o[4u * j + 2u] = v.z;
            o[4u * j + 3u] = v.w;
        }
        uvec4 words;
        float scale;
        int qsum;
        quantizeGroup16(o, words, scale, qsum);
        const uint at = r * groups + g;
        xq[at] = words;
        xscale[at] = scale;
        xsum[at] = qsum;
    }
}
