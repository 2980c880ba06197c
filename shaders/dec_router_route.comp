#version 450
// dec_router_route: the MoE router GEMV and the route in one dispatch, for calls of S <= 4 tokens
// (decode): dec_gemv_half's rows of the E x I router (f16, bf16 or f32 weights, gemv_half.glsl)
// write the [S][E] logits, and the last workgroup to finish runs dec_route's algorithm
// (route.glsl) for the S tokens in turn, writing the same tables. Bit for bit dec_gemv_half (this
// WG and ROWS_PER_WG) followed by dec_route (this WG): one dependent step fewer a MoE layer.
//
// The last workgroup is found as gemm_split.glsl's lastSplit finds it: each workgroup stores its
// logits, memoryBarrierBuffer, barrier, one thread counts it in the arrival word; the one that
// counts ceil(E / ROWS_PER_WG) resets the word to 0 (for the next call: calls on one word are
// separated by a barrier) and, after another memoryBarrierBuffer, reads every workgroup's logits
// (coherent) and routes. Workgroups past E (a grid larger than asked) exit before arriving.
//
// NORM_COLS = D > 0 folds the post-attention RMSNorm in (one dependent step fewer again): x is not
// read; every workgroup forms the S rows h + o (the residual and the o projection, bindings 10
// and 11, from xOffset) and their RMSNorm (weights: binding 12 from normWOffset; as dec_rmsnorm:
// the sum, x * inv rounded before w multiplies it) in shared memory itself, and the GEMV reads
// them there. The last workgroup, when every other has read h and o, writes h = h + o and the
// normed rows (binding 13, from xOffset) for the experts. The same values as dec_rmsnorm's up to
// the order of the sum of squares (dec_rmsnorm's 256 threads, this kernel's WG).
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS_PER_WG = 4u;
layout(constant_id = 2) const bool USE_SUBGROUP = true;
layout(constant_id = 3) const uint NORM_COLS = 0u;  // 0: x as given; D: the post-attention norm folded in
layout(constant_id = 4) const uint NORM_TOKENS = 1u;  // with the norm: tokens a call, 1..MAX_ROUTE_S (their rows in shared memory)
const bool NORM = NORM_COLS > 0u;

const uint WG = gl_WorkGroupSize.x;  // a power of two >= MAX_K (route.glsl)
const uint MAX_ROUTE_S = 4u;

layout(std430, binding = 0) readonly restrict buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly restrict buffer W1 { uint w1[]; };
layout(std430, binding = 1) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 1) readonly restrict buffer XV { vec4 xv[]; };
// The logits: written by every workgroup (gemv_half.glsl's yb), read by the last (route.glsl's logits).
layout(std430, binding = 2) coherent restrict buffer YB { float yb[]; };
#define logits yb
layout(std430, binding = 3) readonly buffer Table { uvec2 table[]; };
layout(std430, binding = 4) writeonly buffer Work { uvec4 work[]; };
layout(std430, binding = 5) writeonly buffer Pairs { uint pairs[]; };
layout(std430, binding = 6) writeonly buffer SlotWeight { float slotWeight[]; };
layout(std430, binding = 7) writeonly buffer SlotExpert { uvec2 slotExpert[]; };
layout(std430, binding = 8) writeonly buffer Chosen { uint chosen[]; };
layout(std430, binding = 9) coherent restrict buffer AR { uint arrived[]; };  // [0]: 0 between calls
// NORM_COLS > 0 only (else any buffers): the residual (read by all, written h + o by the last), the
// o projection, the norm's weights, its output
layout(std430, binding = 10) restrict buffer HR { float hres[]; };
layout(std430, binding = 11) readonly restrict buffer OA { float oadd[]; };
layout(std430, binding = 12) readonly restrict buffer NW { float normW[]; };
layout(std430, binding = 13) writeonly restrict buffer XN { float xnOut[]; };

layout(push_constant, std430) uniform PC {
    uint O;             // experts (the router's rows), 1..MAX_E
    uint I;             // the router's columns
    uint S;             // tokens, 1..MAX_ROUTE_S
    uint weightOffset;  // as dec_gemv_half's
    uint xOffset;       // floats
    uint yOffset;       // floats: the logits (dec_route's logitsOffset)
    uint flags;         // dec_gemv_half's: bit 0 bf16 (else f16), bit 1 f32 weights
    uint K;             // experts per token, 1..min(MAX_K, E)
    uint tableOffset;   // uvec2: expert e's handle at table[tableOffset + e]
    uint chosenOffset;  // uints
    uint seq;           // the call's sequence number (work header .w)
    uint routeFlags;    // dec_route's flags: bit 0 normalize the k weights to sum 1
    uint normWOffset;   // NORM_COLS > 0: floats, the norm's weights
    float eps;          // NORM_COLS > 0: the norm's epsilon
} pc;

// The normed rows [S][D] (NORM_COLS > 0), read by the GEMV in place of x.
shared float xsh[NORM ? NORM_TOKENS * NORM_COLS : 4u];
#define GEMV_HALF_X(i) (NORM ? xsh[i] : xs[i])
#define GEMV_HALF_X4(i) (NORM ? vec4(xsh[4u * (i)], xsh[4u * (i) + 1u], xsh[4u * (i) + 2u], xsh[4u * (i) + 3u]) : xv[i])
#define GEMV_HALF_X_OFFSET (NORM ? 0u : pc.xOffset)
#include "gemv_half.glsl"
#include "route.glsl"
#include "workgroup_sum.glsl"

shared bool lastToArrive;
// xsh = RMSNorm(h + o) of the S rows, each thread its columns t, t + WG, ...
void normToShared() {
    const uint t = gl_LocalInvocationIndex, D = NORM_COLS;
    for (uint s = 0u; s < pc.S; ++s) {
        const uint g = pc.xOffset + s * D;
        float ss = 0.0;
        for (uint i = t; i < D; i += WG) {
            precise float v = hres[g + i] + oadd[g + i];
            xsh[s * D + i] = v;
            ss += v * v;
        }
        const float inv = 1.0 / sqrt(workgroupSum(ss, WG) / float(D) + pc.eps);
        for (uint i = t; i < D; i += WG) {
            precise float u = xsh[s * D + i] * inv;
            precise float y = normW[pc.normWOffset + i] * u;
            xsh[s * D + i] = y;
        }
    }
    barrier();  // the GEMV reads other threads' columns
}

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBase = gl_WorkGroupID.x * R;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform
    if (NORM) normToShared();
    gemvHalfRows(rowBase);

    memoryBarrierBuffer();
    barrier();
    if (t == 0u) lastToArrive = atomicAdd(arrived[0], 1u) == (pc.O + R - 1u) / R - 1u;
    barrier();
    if (!lastToArrive) return;  // uniform
    memoryBarrierBuffer();
    if (t == 0u) arrived[0] = 0u;
    if (NORM) {
        // every other workgroup has read h and o: the residual moves on, the normed rows go out
        for (uint s = 0u; s < pc.S; ++s) {
            for (uint i = t; i < NORM_COLS; i += WG) {
                const uint g = pc.xOffset + s * NORM_COLS + i;
                precise float v = hres[g] + oadd[g];
                hres[g] = v;
                xnOut[g] = xsh[s * NORM_COLS + i];
            }
        }
    }
    for (uint token = 0u; token < min(pc.S, MAX_ROUTE_S); ++token) {
        if (token > 0u) barrier();  // the previous token's shared arrays read
        routeToken(token, pc.O, pc.yOffset, (pc.routeFlags & 1u) != 0u);
    }
}
