#version 450
// dec_rmsnorm: y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for R rows of n, one workgroup per row
// (also per head for the q/k norms: rows = tokens * heads, n = headDim). With ADD (flags bit 0),
// x[r] += add[r] first (the residual), written back to x, and y is the norm of the sum: one pass
// instead of two dispatches (flags bit 1: plus Qwen3.5's gated shared expert, its dec_gating step
// folded in). As src/model/ops.ts rmsNorm: the normalised value x * inv is rounded
// to f32 before w multiplies it (precise: no contraction). y may alias x (in place): every
// element is read and written by the same invocation.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 2) const bool USE_SUBGROUP = true;

layout(set = 0, binding = 0) buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer Add { float add[]; };
layout(set = 0, binding = 2) readonly buffer W { float w[]; };
layout(set = 0, binding = 3) buffer Y { float y[]; };
// flags bit 1 (with bit 0): Qwen3.5's shared expert too, add[r] + sigmoid(gate[gateOffset + r]) * add2[r]
// (add2 laid out as add), summed before the residual as dec_gating's scaled add would leave it in add
layout(set = 0, binding = 4) readonly buffer Add2 { float add2[]; };
layout(set = 0, binding = 5) readonly buffer Gate { float gate[]; };

layout(push_constant) uniform Params {
    uint R;          // rows
    uint n;          // row length
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
const uint KEEP = 8u;  // elements a thread keeps in registers (2048 at the default 256 threads)
shared float partial[WG];

float workgroupSum(float v) {
    if (USE_SUBGROUP) {
        // One barrier: each subgroup's sum to shared memory, then every subgroup adds them up itself
        // (a tree over WG/2..1 took 8 barriers for 8 subgroups: ~10 us for one 2048-row on the H200).
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
    const uint xo = pc.xOffset + r * pc.xStride;
    const uint yo = pc.yOffset + r * pc.yStride;
    const bool residual = (pc.flags & 1u) != 0u;
    const uint ao = pc.addOffset + r * pc.xStride;
    const bool scaled = (pc.flags & 2u) != 0u;
    const float sg = scaled ? sigmoid(gate[pc.gateOffset + r]) : 0.0;
    // The thread's first KEEP elements (all of them where n <= KEEP * WG, as in the graphs) stay in
    // registers with their weights, loaded before the reduction: pass 2 then issues no load behind
    // the barrier. The same operations in the same order as the loop over the rest.
    const uint lid = gl_LocalInvocationIndex;
    float keptX[KEEP], keptW[KEEP];
    [[unroll]] for (uint k = 0u; k < KEEP; k++) {
        const uint i = lid + k * WG;
        if (i < pc.n) keptW[k] = w[pc.wOffset + i];
    }
    float ss = 0.0;
    [[unroll]] for (uint k = 0u; k < KEEP; k++) {
        const uint i = lid + k * WG;
        if (i < pc.n) {
            precise float v = x[xo + i];
            if (residual) {
                precise float a = add[ao + i];
                if (scaled) a = a + sg * add2[ao + i];
                v = v + a;
                x[xo + i] = v;
            }
            keptX[k] = v;
            ss += v * v;
        }
    }
    for (uint i = lid + KEEP * WG; i < pc.n; i += WG) {
        precise float v = x[xo + i];
        if (residual) {
            precise float a = add[ao + i];
            if (scaled) a = a + sg * add2[ao + i];
            v = v + a;
            x[xo + i] = v;
        }
        ss += v * v;
    }
    const float total = workgroupSum(ss);
    const float inv = 1.0 / sqrt(total / float(pc.n) + pc.eps);
    [[unroll]] for (uint k = 0u; k < KEEP; k++) {
        const uint i = lid + k * WG;
        if (i < pc.n) {
            precise float t = keptX[k] * inv;
            precise float o = keptW[k] * t;
            y[yo + i] = o;
        }
    }
    for (uint i = lid + KEEP * WG; i < pc.n; i += WG) {
        precise float t = x[xo + i] * inv;
        precise float o = w[pc.wOffset + i] * t;
        y[yo + i] = o;
    }
}
