#version 450
// moe_ggml: the grouped MoE GEMVs over routed experts stored as GGML blocks (Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K, ggml_blocks.glsl's GGML_FMT_*) in the GGUF file's own layout; float path (each weight
// exactly GGML's, f32 fma accumulation). One shader, two modes (specialization constant GATEUP):
//   GATEUP: h[slot][i] = silu(gate_i · x[token]) * (up_i · x[token]), token = slot / slotsPerToken,
//           O = I rows of [I][D] gate and up blocks, cols = D;
//   down:   ypair[slot][d] = slotWeight[slot] * (down_d · h[slot]), O = D rows of [D][I] blocks;
//           moe_sum.comp then adds a token's slots (the same work list header it reads).
// Work list (binding 1) as moe.glsl defines it: [0] = (S, slotsPerToken, items, sequence number),
// [1 + u] = (expert id, unused, pairStart, pairCount), the item's slots in pairs[] (src/moe/routing.ts
// WorkList; dec_route / dec_group_experts write the same layout in the decode graph, with the expert
// id as the handle's first word). Workgroup (x, y) = (block of ROWS_PER_WG rows, work item y): an
// expert's blocks are read once per chunk of TOKENS slots, not once per slot.
//
// Laid out for bandwidth (as dec_gemv_ggml): work is by 32-weight slices (ggml_blocks.glsl: 16
// consecutive quant bytes, scales decoded once a slice). The R rows x (cols / 32) slices of a
// workgroup are one flat list that its lanes take in turn, lane t the slices t, t + WG, ...: every
// lane has work whatever the row length (down's cols = I = 768 is 24 slices: 8 rows of it are 3
// slices for each of 64 lanes), consecutive lanes read consecutive 16-byte words (rows are
// contiguous), and no byte is read twice. A lane's slices may fall in several rows: each row keeps
// its own sum in the lane (a select, not a dynamic register index). Then subgroupAdd and shared
// memory across subgroups, one barrier (or a shared-memory tree where there is no subgroup
// arithmetic). x is read from global memory (L1-resident: every workgroup of a token reads it).
//
// Addressing: every expert of the layer lives in one storage buffer (binding 5); the expert table
// (binding 6, uvec4 per expert) gives the byte offsets of its (gate, up, down) matrices in it. Plain
// descriptors, no buffer device address: no device feature needed (Lavapipe included), one
// descriptor set per layer; the cost is a 4 GiB cap on a layer's experts (32-bit byte offsets).
// Offsets: multiples of 16 (Q4_K/Q5_K read by uvec4), 4 readable bytes past the last block
// (ggml_blocks.glsl). Inputs x / h are read as vec4 (cols a multiple of 32). Rows past O read row
// O-1 (not stored).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 64, local_size_x_id = 0) in;  // a power of two (tree reduction)
layout(constant_id = 1) const uint ROWS_PER_WG = 2u;
layout(constant_id = 2) const uint FORMAT = 3u;      // GGML_FMT_* of this mode's matrices
layout(constant_id = 3) const uint TOKENS = 4u;      // slots per register chunk, 1..8
layout(constant_id = 4) const bool GATEUP = true;
layout(constant_id = 5) const bool USE_SUBGROUP = true;
// Down with the slots' sum (decode: dec_route's list, item u = slot u, one slot each): workgroup
// (x, y) = (ROWS_PER_WG rows, token y); its lanes share the flat (slot k, row, slice) list of the
// token's K slots and weigh each slice's sum by its slot's weight, so y[token] is written here
// whole: no ypair, no moe_sum dispatch, no barrier before it (the done word is not written).
layout(constant_id = 6) const bool DOWN_SUM = false;
// DOWN_SUM only: the next layer's input norm in the last workgroup to finish (moe_norm_tail.glsl;
// flags bit 0: quantized too), so that norm needs no dispatch and barrier of its own. Each
// workgroup writes its rows of y (coherent), publishes them with a fence and counts itself in the
// arrival word (binding 7); the one that counts the whole grid zeroes the word for the next call
// (calls on one word are separated by a barrier) and normalises the S tokens' rows.
layout(constant_id = 7) const bool NORM_TAIL = false;

const uint WG = gl_WorkGroupSize.x;
const uint R = ROWS_PER_WG;
const uint NMAT = GATEUP ? 2u : 1u;

layout(std430, binding = 0) readonly restrict buffer XV { vec4 xv[]; };   // x [S][D] or h [slots][I]
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) readonly restrict buffer PR { uint pairs[]; };
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; }; // h [slots][I] or ypair [slots][D]
layout(std430, binding = 4) readonly restrict buffer SW { float slotWeight[]; };
layout(std430, binding = 5) readonly restrict buffer EB { uint eb[]; };
layout(std430, binding = 5) readonly restrict buffer EV { uvec4 ev[]; };
layout(std430, binding = 6) readonly restrict buffer ET { uvec4 expertTable[]; };
// NORM_TAIL only (else any buffers, never read): y as the tail writes and reads it (binding 3 again,
// coherent), the arrival word (0 between calls), the residual h [S][D], the norm's weights, xn
// [S][D] and xn quantized (groups of 16)
layout(std430, binding = 3) coherent buffer YC { float tailYb[]; };
layout(std430, binding = 3) coherent buffer YCV { vec4 tailY[]; };
layout(std430, binding = 7) coherent restrict buffer AR { uint arrived[]; };
layout(std430, binding = 8) restrict buffer RS { vec4 tailRes[]; };
layout(std430, binding = 9) readonly restrict buffer NW { vec4 tailW[]; };
layout(std430, binding = 10) writeonly restrict buffer XN { vec4 tailXn[]; };
layout(std430, binding = 11) writeonly restrict buffer XQ { uvec4 tailXq[]; };
layout(std430, binding = 12) writeonly restrict buffer XS { float tailXscale[]; };
layout(std430, binding = 13) writeonly restrict buffer XU { int tailXsum[]; };

layout(push_constant, std430) uniform PC {
    uint O;     // rows: I (gate+up) or D (down)
    uint cols;  // D (gate+up) or I (down); a multiple of the block's elements
    uint wOffset;  // NORM_TAIL: the norm's weights, floats (a multiple of 4)
    float eps;     // NORM_TAIL
    uint flags;    // NORM_TAIL: bit 0, write xn quantized too
} pc;

#define GGML_WORD(i) eb[i]
#define GGML_VEC4(i) ev[i]
#include "ggml_blocks.glsl"
#include "quantize_group16.glsl"
#include "moe_norm_tail.glsl"

const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT) / 4u;  // vec4s from a slice's first run to its second

// Sized for the tree (every lane's sums); the subgroup path uses the first gl_NumSubgroups lanes' worth.
shared float red[WG * NMAT * R * TOKENS];
float acc[NMAT][R][TOKENS];

const uint MAX_K = 8u;  // slots a token, as dec_route

void storeY(uint i, float v) {
    if (NORM_TAIL) tailYb[i] = v;  // read by the last workgroup
    else yb[i] = v;
}

void downSumRows() {
    const uint rowBase = gl_WorkGroupID.x * R;
    if (rowBase >= pc.O) return;  // uniform
    const uint t = gl_LocalInvocationIndex;
    const uint K = min(work[0].y, MAX_K);
    const uint token = gl_WorkGroupID.y;
    if (token >= work[0].x) return;  // uniform
    const uint slices = pc.cols >> 5u;
    const uint rowBytes = (pc.cols / BLOCK_ELEMENTS) * BLOCK_BYTES;
    uint base[MAX_K];
    float weight[MAX_K];
    [[unroll]] for (uint k = 0u; k < MAX_K; ++k) {
        const uint slot = token * K + min(k, K - 1u);
        const uint e = work[1u + slot].x;
        // no expert (dec_route's NONE for NaN logits; gate+up left its h row as it was) or past K:
        // its slices are skipped (weight 0 marks them)
        const bool ok = k < K && e < uint(expertTable.length());
        base[k] = ok ? expertTable[e].z : 0u;
        weight[k] = ok ? slotWeight[slot] : 0.0;
    }
    [[unroll]] for (uint rr = 0u; rr < R; ++rr) acc[0][rr][0] = 0.0;
    const uint work_ = K * R * slices;  // (slot, row, slice), slot-major
    // (k, r, u) of the flat index f = (k * R + r) * slices + u, stepped without a division
    uint kr = t / slices, u = t - kr * slices;
    uint k = kr / R, r = kr - k * R;
    for (uint f = t; f < work_; f += WG) {
        uint b = base[0];
        float sw = weight[0];
        [[unroll]] for (uint j = 1u; j < MAX_K; ++j) if (j == k) { b = base[j]; sw = weight[j]; }
        if (sw != 0.0) {
            const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
            const uint col = blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s);
            const uint rowOff = min(rowBase + r, pc.O - 1u) * rowBytes + blk * BLOCK_BYTES;
            float w[32];
            uvec4 q0, q1;
            vec2 d, mn;
            ggml_slice(FORMAT, b + rowOff, s, q0, q1, d, mn);
            ggml_slice_weights(FORMAT, q0, q1, d, mn, w);
            const uint xa = ((token * K + k) * pc.cols + col) >> 2u;
            vec4 xr[8];
            [[unroll]] for (uint q = 0u; q < 4u; ++q) {
                xr[q] = xv[xa + q];
                xr[4u + q] = xv[xa + GAP + q];
            }
            float a = 0.0;
            [[unroll]] for (uint q = 0u; q < 8u; ++q) {
                a = fma(w[4u * q], xr[q].x, a);
                a = fma(w[4u * q + 1u], xr[q].y, a);
                a = fma(w[4u * q + 2u], xr[q].z, a);
                a = fma(w[4u * q + 3u], xr[q].w, a);
            }
            [[unroll]] for (uint rr = 0u; rr < R; ++rr) acc[0][rr][0] += rr == r ? sw * a : 0.0;
        }
        u += WG;
        while (u >= slices) { u -= slices; if (++r == R) { r = 0u; ++k; } }
    }
    if (USE_SUBGROUP) {
        [[unroll]] for (uint rr = 0u; rr < R; ++rr) {
            const float v = subgroupAdd(acc[0][rr][0]);
            if (subgroupElect()) red[gl_SubgroupID * R + rr] = v;
        }
        barrier();
        for (uint i = t; i < R; i += WG) {
            float v = red[i];
            for (uint g = 1u; g < gl_NumSubgroups; ++g) v += red[g * R + i];
            if (rowBase + i < pc.O) storeY(token * pc.O + rowBase + i, v);
        }
    } else {
        [[unroll]] for (uint rr = 0u; rr < R; ++rr) red[t * R + rr] = acc[0][rr][0];
        barrier();
        for (uint h = WG / 2u; h > 0u; h >>= 1u) {
            if (t < h) {
                for (uint i = 0u; i < R; ++i) red[t * R + i] += red[(t + h) * R + i];
            }
            barrier();
        }
        for (uint i = t; i < R; i += WG) if (rowBase + i < pc.O) storeY(token * pc.O + rowBase + i, red[i]);
    }
}

shared bool tailLast;

void mainDownSum() {
    downSumRows();
    if (!NORM_TAIL) return;
    // every workgroup counts itself, those past the rows or the tokens too
    memoryBarrierBuffer();  // y before the count that publishes it
    barrier();
    if (gl_LocalInvocationIndex == 0u) tailLast = atomicAdd(arrived[0], 1u) == gl_NumWorkGroups.x * gl_NumWorkGroups.y - 1u;
    barrier();
    if (!tailLast) return;  // uniform
    if (gl_LocalInvocationIndex == 0u) atomicExchange(arrived[0], 0u);
    memoryBarrierBuffer();
    const uint S = work[0].x;
    for (uint s = 0u; s < S; ++s) normTail(s, pc.O, pc.wOffset, pc.eps, (pc.flags & 1u) != 0u);
}

void main() {
    if (DOWN_SUM) {
        mainDownSum();
        return;
    }
    const uint rowBase = gl_WorkGroupID.x * R;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform
    const uint t = gl_LocalInvocationIndex;
    const uint K = work[0].y;
    // The grid may cover more items than the list holds (the decode graph sizes it for the most a
    // call can have, before dec_group_experts counts them): those workgroups have nothing to do.
    if (gl_WorkGroupID.y >= work[0].z) return;  // uniform
    const uvec4 item = work[1u + gl_WorkGroupID.y];
    // No expert (dec_route's NONE for NaN logits): nothing to read; moe_sum skips its slot by weight.
    if (item.x >= uint(expertTable.length())) return;  // uniform
    const uvec4 offs = expertTable[item.x];
    const uint slices = pc.cols >> 5u;
    const uint rowBytes = (pc.cols / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint work_ = R * slices;  // this workgroup's (row, slice) list
    uint base[NMAT];
    base[0] = GATEUP ? offs.x : offs.z;
    if (GATEUP) base[NMAT - 1u] = offs.y;

    for (uint p0 = 0u; p0 < item.w; p0 += TOKENS) {
        const uint nt = min(TOKENS, item.w - p0);
        uint xrow[TOKENS];  // float index of each slot's input row
        [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
            const uint slot = pairs[item.z + p0 + min(k, nt - 1u)];
            xrow[k] = (GATEUP ? slot / K : slot) * pc.cols;
        }
        [[unroll]] for (uint m = 0u; m < NMAT; ++m)
            [[unroll]] for (uint r = 0u; r < R; ++r)
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[m][r][k] = 0.0;

        // (row r, slice u) of the flat index f = r * slices + u, stepped without a division
        uint r = t / slices, u = t - r * slices;
        for (uint f = t; f < work_; f += WG) {
            const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
            const uint col = blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s);
            const uint rowOff = min(rowBase + r, pc.O - 1u) * rowBytes + blk * BLOCK_BYTES;
            float w[NMAT][32];
            [[unroll]] for (uint m = 0u; m < NMAT; ++m) {
                uvec4 q0, q1;
                vec2 d, mn;
                ggml_slice(FORMAT, base[m] + rowOff, s, q0, q1, d, mn);
                ggml_slice_weights(FORMAT, q0, q1, d, mn, w[m]);
            }
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                if (k < nt) {  // uniform
                    const uint xa = (xrow[k] + col) >> 2u;
                    vec4 xr[8];
                    [[unroll]] for (uint q = 0u; q < 4u; ++q) {
                        xr[q] = xv[xa + q];
                        xr[4u + q] = xv[xa + GAP + q];
                    }
                    [[unroll]] for (uint m = 0u; m < NMAT; ++m) {
                        float a = 0.0;
                        [[unroll]] for (uint q = 0u; q < 8u; ++q) {
                            a = fma(w[m][4u * q], xr[q].x, a);
                            a = fma(w[m][4u * q + 1u], xr[q].y, a);
                            a = fma(w[m][4u * q + 2u], xr[q].z, a);
                            a = fma(w[m][4u * q + 3u], xr[q].w, a);
                        }
                        [[unroll]] for (uint rr = 0u; rr < R; ++rr) acc[m][rr][k] += rr == r ? a : 0.0;
                    }
                }
            }
            u += WG;
            while (u >= slices) { u -= slices; ++r; }
        }

        // ---- the chunk's NMAT * R * nt sums over the workgroup ----
        const uint n = NMAT * R * TOKENS;
        if (USE_SUBGROUP) {
            [[unroll]] for (uint m = 0u; m < NMAT; ++m)
                [[unroll]] for (uint rr = 0u; rr < R; ++rr)
                    [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                        if (k < nt) {  // uniform: a decode item has one slot, not TOKENS
                            const float v = subgroupAdd(acc[m][rr][k]);
                            if (subgroupElect()) red[gl_SubgroupID * n + (m * R + rr) * TOKENS + k] = v;
                        }
                    }
            barrier();
            if (gl_NumSubgroups > 1u) {
                for (uint i = t; i < n; i += WG) {
                    float v = red[i];
                    for (uint g = 1u; g < gl_NumSubgroups; ++g) v += red[g * n + i];
                    red[i] = v;  // only lane i reads and writes column i
                }
                barrier();
            }
        } else {
            [[unroll]] for (uint m = 0u; m < NMAT; ++m)
                [[unroll]] for (uint rr = 0u; rr < R; ++rr)
                    [[unroll]] for (uint k = 0u; k < TOKENS; ++k) red[t * n + (m * R + rr) * TOKENS + k] = acc[m][rr][k];
            barrier();
            for (uint h = WG / 2u; h > 0u; h >>= 1u) {
                if (t < h) {
                    for (uint i = 0u; i < n; ++i) red[t * n + i] += red[(t + h) * n + i];
                }
                barrier();
            }
        }
        for (uint i = t; i < R * TOKENS; i += WG) {
            const uint rr = i / TOKENS, k = i % TOKENS;
            if (k < nt && rowBase + rr < pc.O) {
                const uint slot = pairs[item.z + p0 + k];
                const float v = red[rr * TOKENS + k];
                if (GATEUP) {
                    const float up = red[(R + rr) * TOKENS + k];
                    yb[slot * pc.O + rowBase + rr] = v / (1.0 + exp(-v)) * up;
                } else {
                    yb[slot * pc.O + rowBase + rr] = slotWeight[slot] * v;
                }
            }
        }
        barrier();  // red is rewritten by the next chunk
    }
}
