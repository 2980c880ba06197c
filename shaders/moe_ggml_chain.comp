#version 450
// moe_ggml_chain: the decode graph's GGML experts call (moe_ggml's per-slot gate+up, then its down
// summing a token's slots) as ONE dispatch, an option (VKMOE_MOE_CHAIN=on): measured 2x slower
// than the two dispatches on an H100 (README), so not the default; and in the whole-token graph
// on Lavapipe its logits varied from run to run, a race not yet found (README). The idea: two dispatches have a
// compute barrier between them, and every dependent dispatch costs a drain and a ramp however
// little it reads; here down's workgroups load their first weights while gate+up still runs and
// then wait for just their token's h. The waits poll with atomics (a plain volatile load failed the
// race test on Lavapipe: no acquire without the Vulkan memory model), one address per token.
//
// Roles by ticket, not by workgroup id: each workgroup takes the next ticket (an atomic counter)
// when it starts. Tickets [0, G) are gate+up blocks (item u = slot u of the work list, RG rows of
// I), tickets [G, N) down blocks (token, RD rows of D). A down block waits until every gate+up
// block of its token has published its h (ready[token] == K * ceil(I / RG)). Every block it waits
// for holds a smaller ticket, so it started before the waiter and is running: resident workgroups
// run to completion on every GPU and on Lavapipe (a thread runs a workgroup to its end), so the
// wait always ends, whatever order the driver launches workgroups in or how many fit at once.
// The last block to finish zeroes the counters for the next call (each call leaves them 0).
//
// NORM_TAIL: that last block also does the next layer's input norm (moe_norm_tail.glsl; flags bit 0:
// quantized too), which then needs no dispatch and barrier of its own.
//
// Work list: dec_route's (moe.glsl): [0] = (S, K, items = S * K, seq), [1 + u] = (expert id, ...)
// for slot u; slot weights; expert blocks and table as moe_ggml. h: [slots][I] scratch, written
// and read in this dispatch (coherent: read past L1). Per slice: GGML's weights (ggml_blocks.glsl),
// f32 fma, as moe_ggml; sums in the same order as moe_ggml's for a lane's slices, then subgroup
// and workgroup sums (the partition differs from moe_ggml's: equal to rounding, not bits).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint RG = 4u;         // gate+up rows (of I) a block
layout(constant_id = 2) const uint FORMAT_GU = 3u;  // GGML_FMT_* of gate and up
layout(constant_id = 3) const uint FORMAT_DN = 5u;  // GGML_FMT_* of down
layout(constant_id = 4) const uint RD = 2u;         // down rows (of D) a block
layout(constant_id = 5) const bool USE_SUBGROUP = true;
layout(constant_id = 6) const uint PF = 4u;         // slices a lane loads before it computes any
layout(constant_id = 7) const bool NORM_TAIL = false;

const uint WG = gl_WorkGroupSize.x;
const uint MAX_K = 8u;  // slots a token, as dec_route

layout(std430, binding = 0) readonly restrict buffer XV { vec4 xv[]; };  // x [S][D]
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) coherent buffer HB { float hb[]; };  // h [slots][I]
layout(std430, binding = 2) coherent buffer HV { vec4 hv[]; };
layout(std430, binding = 3) coherent buffer YB { float yb[]; };  // y [S][D] (read by NORM_TAIL)
layout(std430, binding = 3) coherent buffer YV { vec4 tailY[]; };
layout(std430, binding = 4) readonly restrict buffer SW { float slotWeight[]; };
layout(std430, binding = 5) readonly restrict buffer EB { uint eb[]; };
layout(std430, binding = 5) readonly restrict buffer EV { uvec4 ev[]; };
layout(std430, binding = 6) readonly restrict buffer ET { uvec4 expertTable[]; };
// ticket, finished, then ready[token]: zero between calls
layout(std430, binding = 7) coherent restrict buffer CT { uint ctl[]; };
// NORM_TAIL only: the residual h [S][D], the norm's weights, xn [S][D], xn quantized (groups of 16)
layout(std430, binding = 8) restrict buffer RS { vec4 tailRes[]; };
layout(std430, binding = 9) readonly restrict buffer NW { vec4 tailW[]; };
layout(std430, binding = 10) writeonly restrict buffer XN { vec4 tailXn[]; };
layout(std430, binding = 11) writeonly restrict buffer XQ { uvec4 tailXq[]; };
layout(std430, binding = 12) writeonly restrict buffer XS { float tailXscale[]; };
layout(std430, binding = 13) writeonly restrict buffer XU { int tailXsum[]; };

layout(push_constant, std430) uniform PC {
    uint D;
    uint I;
    uint G;  // gate+up blocks: S * K * ceil(I / RG)
    uint N;  // all blocks: G + S * ceil(D / RD)
    uint wOffset;  // NORM_TAIL: the norm's weights, floats (a multiple of 4)
    float eps;
    uint flags;    // NORM_TAIL: bit 0, write xn quantized too
} pc;

#define GGML_WORD(i) eb[i]
#define GGML_VEC4(i) ev[i]
#include "ggml_blocks.glsl"
#include "quantize_group16.glsl"
#include "moe_norm_tail.glsl"

const uint NSUM = 2u * (RG > RD ? RG : RD);
shared float red[WG * NSUM];
shared uint sharedTicket;
shared bool sharedLast;

// The R sums of every lane over the workgroup, into red[0 .. R).
void workgroupSums(inout float acc[NSUM], uint R) {
    const uint t = gl_LocalInvocationIndex;
    if (USE_SUBGROUP) {
        [[unroll]] for (uint i = 0u; i < NSUM; ++i) {
            if (i < R) {  // uniform
                const float v = subgroupAdd(acc[i]);
                if (subgroupElect()) red[gl_SubgroupID * NSUM + i] = v;
            }
        }
        barrier();
        if (t < R) {
            float v = red[t];
            for (uint g = 1u; g < gl_NumSubgroups; ++g) v += red[g * NSUM + t];
            red[t] = v;  // only lane t reads and writes column t
        }
    } else {
        [[unroll]] for (uint i = 0u; i < NSUM; ++i) red[t * NSUM + i] = acc[i];
        barrier();
        for (uint h = WG / 2u; h > 0u; h >>= 1u) {
            if (t < h) for (uint i = 0u; i < R; ++i) red[t * NSUM + i] += red[(t + h) * NSUM + i];
            barrier();
        }
    }
    barrier();
}

// x[col .. col+15] . w[0..15] and x[col+gap ..] . w[16..31], in moe_ggml's order.
float dotSlice(float w[32], uint xa, uint gap) {
    vec4 xr[8];
    [[unroll]] for (uint q = 0u; q < 4u; ++q) {
        xr[q] = xv[xa + q];
        xr[4u + q] = xv[xa + gap + q];
    }
    float a = 0.0;
    [[unroll]] for (uint q = 0u; q < 8u; ++q) {
        a = fma(w[4u * q], xr[q].x, a);
        a = fma(w[4u * q + 1u], xr[q].y, a);
        a = fma(w[4u * q + 2u], xr[q].z, a);
        a = fma(w[4u * q + 3u], xr[q].w, a);
    }
    return a;
}

// The same against h (coherent: written by other workgroups of this dispatch).
float dotSliceH(float w[32], uint ha, uint gap) {
    vec4 hr[8];
    [[unroll]] for (uint q = 0u; q < 4u; ++q) {
        hr[q] = hv[ha + q];
        hr[4u + q] = hv[ha + gap + q];
    }
    float a = 0.0;
    [[unroll]] for (uint q = 0u; q < 8u; ++q) {
        a = fma(w[4u * q], hr[q].x, a);
        a = fma(w[4u * q + 1u], hr[q].y, a);
        a = fma(w[4u * q + 2u], hr[q].z, a);
        a = fma(w[4u * q + 3u], hr[q].w, a);
    }
    return a;
}

// h[slot][rowBase ..+RG] = silu(gate . x) * (up . x); then the token's ready count goes up by one.
void gateUp(uint g) {
    const uint t = gl_LocalInvocationIndex;
    const uint K = work[0].y;
    const uint blocks = (pc.I + RG - 1u) / RG;
    const uint slot = g / blocks, rowBase = (g - slot * blocks) * RG;
    const uint token = slot / K;
    const uint e = work[1u + slot].x;
    // no expert (dec_route's NONE for NaN logits): nothing to compute; down skips the slot by weight
    const bool ok = e < uint(expertTable.length());
    const uvec4 offs = ok ? expertTable[e] : uvec4(0u);
    const uint slices = pc.D >> 5u;
    const uint rowBytes = (pc.D / GGML_BLOCK_ELEMENTS(FORMAT_GU)) * GGML_BLOCK_BYTES(FORMAT_GU);
    const uint SPB = GGML_BLOCK_ELEMENTS(FORMAT_GU) / 32u;
    const uint gap = GGML_SLICE_GAP(FORMAT_GU) / 4u;
    const uint total = ok ? RG * slices : 0u;
    float acc[NSUM];
    [[unroll]] for (uint i = 0u; i < NSUM; ++i) acc[i] = 0.0;
    for (uint c0 = 0u; c0 < total; c0 += WG * PF) {  // uniform: every lane the same chunks
        const uint f0 = c0 + t;
        uvec4 q0[PF][2], q1[PF][2];
        vec2 d[PF][2], mn[PF][2];
        uint rr[PF], col[PF];
        [[unroll]] for (uint i = 0u; i < PF; ++i) {
            const uint f = min(f0 + i * WG, total - 1u);
            const uint r = f / slices, u = f - r * slices;
            const uint blk = u / SPB, s = u - blk * SPB;
            rr[i] = r;
            col[i] = blk * GGML_BLOCK_ELEMENTS(FORMAT_GU) + ggml_slice_col(FORMAT_GU, s);
            const uint rowOff = min(rowBase + r, pc.I - 1u) * rowBytes + blk * GGML_BLOCK_BYTES(FORMAT_GU);
            ggml_slice(FORMAT_GU, offs.x + rowOff, s, q0[i][0], q1[i][0], d[i][0], mn[i][0]);
            ggml_slice(FORMAT_GU, offs.y + rowOff, s, q0[i][1], q1[i][1], d[i][1], mn[i][1]);
        }
        [[unroll]] for (uint i = 0u; i < PF; ++i) {
            if (f0 + i * WG < total) {
                const uint xa = (token * pc.D + col[i]) >> 2u;
                [[unroll]] for (uint m = 0u; m < 2u; ++m) {
                    float w[32];
                    ggml_slice_weights(FORMAT_GU, q0[i][m], q1[i][m], d[i][m], mn[i][m], w);
                    const float a = dotSlice(w, xa, gap);
                    [[unroll]] for (uint r = 0u; r < RG; ++r) acc[m * RG + r] += rr[i] == r ? a : 0.0;
                }
            }
        }
    }
    workgroupSums(acc, 2u * RG);
    if (t < RG && rowBase + t < pc.I && ok) {
        const float v = red[t], up = red[RG + t];
        hb[slot * pc.I + rowBase + t] = v / (1.0 + exp(-v)) * up;
    }
    memoryBarrierBuffer();  // h before the count that publishes it
    barrier();
    if (t == 0u) atomicAdd(ctl[2u + token], 1u);
}

// y[token][rowBase ..+RD] = sum over the token's slots k of weight_k * (down_k . h_k).
void downSum(uint j) {
    const uint t = gl_LocalInvocationIndex;
    const uint K = min(work[0].y, MAX_K);
    const uint blocks = (pc.D + RD - 1u) / RD;
    const uint token = j / blocks, rowBase = (j - token * blocks) * RD;
    const uint slices = pc.I >> 5u;
    const uint rowBytes = (pc.I / GGML_BLOCK_ELEMENTS(FORMAT_DN)) * GGML_BLOCK_BYTES(FORMAT_DN);
    const uint SPB = GGML_BLOCK_ELEMENTS(FORMAT_DN) / 32u;
    const uint gap = GGML_SLICE_GAP(FORMAT_DN) / 4u;
    uint base[MAX_K];
    float weight[MAX_K];
    [[unroll]] for (uint k = 0u; k < MAX_K; ++k) {
        const uint slot = token * K + min(k, K - 1u);
        const uint e = work[1u + slot].x;
        const bool ok = k < K && e < uint(expertTable.length());
        base[k] = ok ? expertTable[e].z : 0u;
        weight[k] = ok ? slotWeight[slot] : 0.0;
    }
    const uint total = K * RD * slices;  // (slot, row, slice), slot-major
    const uint target = K * ((pc.I + RG - 1u) / RG);
    float acc[NSUM];
    [[unroll]] for (uint i = 0u; i < NSUM; ++i) acc[i] = 0.0;
    for (uint c0 = 0u; c0 < total; c0 += WG * PF) {  // uniform: the wait's barrier is in it
        const uint f0 = c0 + t;
        uvec4 q0[PF], q1[PF];
        vec2 d[PF], mn[PF];
        uint kk[PF], rr[PF], col[PF];
        [[unroll]] for (uint i = 0u; i < PF; ++i) {
            const uint f = min(f0 + i * WG, total - 1u);
            const uint kr = f / slices, u = f - kr * slices;
            const uint k = kr / RD, r = kr - k * RD;
            const uint blk = u / SPB, s = u - blk * SPB;
            uint b = base[0];
            [[unroll]] for (uint m = 1u; m < MAX_K; ++m) if (m == k) b = base[m];
            kk[i] = k;
            rr[i] = r;
            col[i] = blk * GGML_BLOCK_ELEMENTS(FORMAT_DN) + ggml_slice_col(FORMAT_DN, s);
            const uint rowOff = min(rowBase + r, pc.D - 1u) * rowBytes + blk * GGML_BLOCK_BYTES(FORMAT_DN);
            ggml_slice(FORMAT_DN, b + rowOff, s, q0[i], q1[i], d[i], mn[i]);
        }
        if (c0 == 0u) {  // the first chunk's loads are in flight while h is made
            if (t == 0u) {
                while (atomicAdd(ctl[2u + token], 0u) < target) {}
            }
            barrier();
            memoryBarrierBuffer();
        }
        [[unroll]] for (uint i = 0u; i < PF; ++i) {
            if (f0 + i * WG < total) {
                float sw = weight[0];
                [[unroll]] for (uint m = 1u; m < MAX_K; ++m) if (m == kk[i]) sw = weight[m];
                if (sw != 0.0) {
                    float w[32];
                    ggml_slice_weights(FORMAT_DN, q0[i], q1[i], d[i], mn[i], w);
                    const float a = dotSliceH(w, ((token * K + kk[i]) * pc.I + col[i]) >> 2u, gap);
                    [[unroll]] for (uint r = 0u; r < RD; ++r) acc[r] += rr[i] == r ? sw * a : 0.0;
                }
            }
        }
    }
    workgroupSums(acc, RD);
    if (t < RD && rowBase + t < pc.D) yb[token * pc.D + rowBase + t] = red[t];
}

void main() {
    const uint t = gl_LocalInvocationIndex;
    if (t == 0u) sharedTicket = atomicAdd(ctl[0], 1u);
    barrier();
    const uint ticket = sharedTicket;
    if (ticket < pc.G) gateUp(ticket);
    else if (ticket < pc.N) downSum(ticket - pc.G);
    memoryBarrierBuffer();  // y before the count that says this block is done
    barrier();
    if (t == 0u) sharedLast = atomicAdd(ctl[1], 1u) == pc.N - 1u;
    barrier();
    if (!sharedLast) return;  // uniform
    // every other block has finished: no one reads the counters again in this dispatch
    const uint S = work[0].x;
    if (t == 0u) for (uint i = 0u; i < 2u + S; ++i) atomicExchange(ctl[i], 0u);
    if (NORM_TAIL) {
        memoryBarrierBuffer();
        for (uint s = 0u; s < S; ++s) normTail(s, pc.D, pc.wOffset, pc.eps, (pc.flags & 1u) != 0u);
    }
}
