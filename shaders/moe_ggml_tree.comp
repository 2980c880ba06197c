#version 450
// moe_ggml_tree: the first moe_ggml kernel (by 32-column units, a shared-memory tree), kept for
// scripts/bench-moe-ggml.ts --old (GgmlExpertKernels option kernel: "tree"). moe_ggml: the grouped MoE GEMVs over routed experts stored as GGML blocks (Q4_1, Q5_0, Q5_1, Q4_K,
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
// Addressing: every expert of the layer lives in one storage buffer (binding 5); the expert table
// (binding 6, uvec4 per expert) gives the byte offsets of its (gate, up, down) matrices in it. Plain
// descriptors, no buffer device address: no device feature needed (Lavapipe included), one
// descriptor set per layer; the cost is a 4 GiB cap on a layer's experts (32-bit byte offsets).
// Offsets: multiples of 16 (Q4_K/Q5_K read by uvec4), 4 readable bytes past the last block
// (ggml_blocks.glsl). Inputs x / h are read as vec4 (cols a multiple of 32).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 64, local_size_x_id = 0) in;  // a power of two (tree reduction)
layout(constant_id = 1) const uint ROWS_PER_WG = 2u;
layout(constant_id = 2) const uint FORMAT = 3u;      // GGML_FMT_* of this mode's matrices
layout(constant_id = 3) const uint TOKENS = 4u;      // slots per register chunk, 1..8
layout(constant_id = 4) const bool GATEUP = true;

const uint WG = gl_WorkGroupSize.x;
const uint R = ROWS_PER_WG;

layout(std430, binding = 0) readonly restrict buffer XV { vec4 xv[]; };   // x [S][D] or h [slots][I]
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) readonly restrict buffer PR { uint pairs[]; };
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; }; // h [slots][I] or ypair [slots][D]
layout(std430, binding = 4) readonly restrict buffer SW { float slotWeight[]; };
layout(std430, binding = 5) readonly restrict buffer EB { uint eb[]; };
layout(std430, binding = 5) readonly restrict buffer EV { uvec4 ev[]; };
layout(std430, binding = 6) readonly restrict buffer ET { uvec4 expertTable[]; };

layout(push_constant, std430) uniform PC {
    uint O;     // rows: I (gate+up) or D (down)
    uint cols;  // D (gate+up) or I (down); a multiple of the block's elements
} pc;

#define GGML_WORD(i) eb[i]
#define GGML_VEC4(i) ev[i]
#include "ggml_blocks.glsl"

const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint UNITS_PER_BLOCK = GGML_BLOCK_ELEMENTS(FORMAT) / 32u;

// Matrices of this mode: gate and up (GATEUP), or down; sized for two either way (m < 1 folds away).
shared float red[WG * 2u * R * TOKENS];
float acc[2][R][TOKENS];
vec4 xr[TOKENS][8];

void main() {
    const uint nmat = GATEUP ? 2u : 1u;
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
    const uint units = pc.cols >> 5u;
    const uint rowBytes = (units / UNITS_PER_BLOCK) * BLOCK_BYTES;

    uint rowAddr[2][R];
    [[unroll]] for (uint m = 0u; m < 2u; ++m) {
        const uint base = m == 1u ? offs.y : (GATEUP ? offs.x : offs.z);
        [[unroll]] for (uint r = 0u; r < R; ++r) rowAddr[m][r] = base + min(rowBase + r, pc.O - 1u) * rowBytes;  // past O: row O-1, not stored
    }

    for (uint p0 = 0u; p0 < item.w; p0 += TOKENS) {
        const uint nt = min(TOKENS, item.w - p0);
        uint xrow[TOKENS];  // vec4 index of each slot's input row
        [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
            const uint slot = pairs[item.z + p0 + min(k, nt - 1u)];
            xrow[k] = (GATEUP ? slot / K : slot) * (pc.cols >> 2u);
        }
        [[unroll]] for (uint m = 0u; m < 2u; ++m)
            [[unroll]] for (uint r = 0u; r < R; ++r)
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[m][r][k] = 0.0;

        for (uint u = t; u < units; u += WG) {
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k)
                if (k < nt) [[unroll]] for (uint q = 0u; q < 8u; ++q) xr[k][q] = xv[xrow[k] + 8u * u + q];
            const uint blk = u / UNITS_PER_BLOCK, j = u % UNITS_PER_BLOCK;
            [[unroll]] for (uint m = 0u; m < 2u; ++m) {
                if (m < nmat) {
                    [[unroll]] for (uint r = 0u; r < R; ++r) {
                        float w[32];
                        ggml_dequant32(FORMAT, rowAddr[m][r] + blk * BLOCK_BYTES, j, w);
                        [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                            if (k < nt) {  // uniform
                                float a = acc[m][r][k];
                                [[unroll]] for (uint q = 0u; q < 8u; ++q) {
                                    a = fma(w[4u * q], xr[k][q].x, a);
                                    a = fma(w[4u * q + 1u], xr[k][q].y, a);
                                    a = fma(w[4u * q + 2u], xr[k][q].z, a);
                                    a = fma(w[4u * q + 3u], xr[k][q].w, a);
                                }
                                acc[m][r][k] = a;
                            }
                        }
                    }
                }
            }
        }

        // Shared-memory tree over the workgroup: portable (no subgroup operations needed).
        const uint n = 2u * R * TOKENS;
        [[unroll]] for (uint m = 0u; m < 2u; ++m)
            [[unroll]] for (uint r = 0u; r < R; ++r)
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) red[t * n + (m * R + r) * TOKENS + k] = acc[m][r][k];
        barrier();
        for (uint h = WG / 2u; h > 0u; h >>= 1u) {
            if (t < h) {
                for (uint i = 0u; i < n; ++i) red[t * n + i] += red[(t + h) * n + i];
            }
            barrier();
        }
        for (uint i = t; i < R * TOKENS; i += WG) {
            const uint r = i / TOKENS, k = i % TOKENS;
            if (k < nt && rowBase + r < pc.O) {
                const uint slot = pairs[item.z + p0 + k];
                const float v = red[r * TOKENS + k];
                if (GATEUP) {
                    const float up = red[(R + r) * TOKENS + k];
                    yb[slot * pc.O + rowBase + r] = v / (1.0 + exp(-v)) * up;
                } else {
                    yb[slot * pc.O + rowBase + r] = slotWeight[slot] * v;
                }
            }
        }
        barrier();  // red is rewritten by the next chunk
    }
}
