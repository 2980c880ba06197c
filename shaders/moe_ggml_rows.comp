#version 450
// moe_ggml_rows: moe_ggml's grouped MoE GEMVs for prompt chunks (work items grouped by expert, a
// few to tens of slots each), with a row per lane instead of a row's slices spread over the lanes.
// Same bindings, push constants, work list and outputs as moe_ggml.comp (GATEUP: h = silu(gate x) *
// (up x); down: ypair = slot weight * (down h), moe_sum adds a token's slots); each weight is
// GGML's (ggml_blocks.glsl slices), accumulation f32 fma in slice order.
//
// Why: moe_ggml shares a row's slices among the lanes, which suits decode (one slot an item: every
// lane has work, one short reduction) but at a prompt chunk's 2..16 slots an item each lane does a
// slice or two and then the workgroup reduces NMAT x R x TOKENS sums through subgroups and shared
// memory behind a barrier, per chunk of TOKENS slots. Here LANES consecutive lanes (1, 2, 4 or 8) own a
// row whole: each walks every LANES-th slice of it, dequantizes each once (both matrices for
// gate+up) and multiplies it with the chunk's TOKENS slots; the LANES partial sums are added by
// subgroup shuffles at the end. No barrier, no shared memory; the x / h slice the lanes of a subgroup
// read is one of LANES addresses (a broadcast). LANES > 1 gives the GPU more rows in flight (a
// lane's slice loop is a chain of dependent loads).
//
// Workgroup (x, y) = (WG / LANES rows, work item y). Rows past O read row O-1 and are not stored.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 2) const uint FORMAT = 3u;  // GGML_FMT_* of this mode's matrices
layout(constant_id = 3) const uint TOKENS = 8u;  // slots per register chunk, 1..8
layout(constant_id = 4) const bool GATEUP = true;
layout(constant_id = 5) const uint LANES = 1u;   // lanes a row: 1, 2, 4 or 8 (divides the subgroup size)

const uint NMAT = GATEUP ? 2u : 1u;

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
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT) / 4u;  // vec4s from a slice's first run to its second

void main() {
    const uint ROWS = gl_WorkGroupSize.x / LANES;
    const uint rowBase = gl_WorkGroupID.x * ROWS;
    if (rowBase >= pc.O) return;  // uniform
    // The grid may cover more items than the list holds (sized before dec_group_experts counts them).
    if (gl_WorkGroupID.y >= work[0].z) return;  // uniform
    const uvec4 item = work[1u + gl_WorkGroupID.y];
    if (item.x >= uint(expertTable.length())) return;  // no expert (NaN logits): moe_sum skips its slots
    const uint K = work[0].y;
    const uint row = rowBase + gl_LocalInvocationIndex / LANES;
    const uint part = gl_LocalInvocationIndex % LANES;
    const uvec4 offs = expertTable[item.x];
    const uint blocks = pc.cols / BLOCK_ELEMENTS;
    const uint slices = blocks * SLICES_PER_BLOCK;
    const uint rowOff = min(row, pc.O - 1u) * blocks * BLOCK_BYTES;
    uint base[NMAT];
    base[0] = (GATEUP ? offs.x : offs.z) + rowOff;
    if (GATEUP) base[NMAT - 1u] = offs.y + rowOff;

    for (uint p0 = 0u; p0 < item.w; p0 += TOKENS) {
        const uint nt = min(TOKENS, item.w - p0);
        uint xrow[TOKENS];  // vec4 index of each slot's input row
        [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
            const uint slot = pairs[item.z + p0 + min(k, nt - 1u)];
            xrow[k] = ((GATEUP ? slot / K : slot) * pc.cols) >> 2u;
        }
        float acc[NMAT][TOKENS];
        [[unroll]] for (uint m = 0u; m < NMAT; ++m) [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[m][k] = 0.0;
        for (uint u = part; u < slices; u += LANES) {
            const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
            const uint col = (blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s)) >> 2u;
            float w[NMAT][32];
            [[unroll]] for (uint m = 0u; m < NMAT; ++m) {
                uvec4 q0, q1;
                vec2 d, mn;
                ggml_slice(FORMAT, base[m] + blk * BLOCK_BYTES, s, q0, q1, d, mn);
                ggml_slice_weights(FORMAT, q0, q1, d, mn, w[m]);
            }
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                if (k < nt) {  // uniform
                    const uint xa = xrow[k] + col;
                    vec4 xr[8];
                    [[unroll]] for (uint q = 0u; q < 4u; ++q) {
                        xr[q] = xv[xa + q];
                        xr[4u + q] = xv[xa + GAP + q];
                    }
                    [[unroll]] for (uint m = 0u; m < NMAT; ++m) {
                        float a = acc[m][k];
                        [[unroll]] for (uint q = 0u; q < 8u; ++q) {
                            a = fma(w[m][4u * q], xr[q].x, a);
                            a = fma(w[m][4u * q + 1u], xr[q].y, a);
                            a = fma(w[m][4u * q + 2u], xr[q].z, a);
                            a = fma(w[m][4u * q + 3u], xr[q].w, a);
                        }
                        acc[m][k] = a;
                    }
                }
            }
        }
        // the row's LANES partial sums (lanes of one row are consecutive, within a subgroup)
        [[unroll]] for (uint o = 1u; o < LANES; o <<= 1u)
            [[unroll]] for (uint m = 0u; m < NMAT; ++m)
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[m][k] += subgroupShuffleXor(acc[m][k], o);
        if (row < pc.O && part == 0u) {
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                if (k < nt) {
                    const uint slot = pairs[item.z + p0 + k];
                    const float g = acc[0][k];
                    if (GATEUP) yb[slot * pc.O + row] = g / (1.0 + exp(-g)) * acc[NMAT - 1u][k];
                    else yb[slot * pc.O + row] = slotWeight[slot] * g;
                }
            }
        }
    }
}
