#version 450
// moe_ggml_rows_idp: moe_ggml_rows on the integer-dot path. The same work list, rows per lane, lanes a
// row and outputs (GATEUP: h = silu(gate x) * (up x); down: ypair = slot weight * (down h)), but the
// input rows come quantized by quantize_act in groups of 16 (int8 xq [rows][cols], a power-of-two f32
// scale and the int sum of the q per 16 columns: dec_gemv_ggml_idp's input), and each run of a slice
// (16 columns with one weight scale d and min m, ggml_slice) is dotted with its x group by 4 OpSUDot:
//   acc += xs * (d * (dot(q_w, q_x) - OFF * xsum) + m * xsum)
// exactly dec_gemv_ggml_idp's per-run formula. Why: at a prompt chunk's few slots an expert the float
// kernel spends 32 fma and 8 vec4 loads a slice and slot after dequantizing the slice; here it is 8
// dot products, 2 uvec4 loads and 2 fma, and the weights stay as quant bytes (no per-weight float).
//
// Workgroup (x, y) = (WG / LANES * RPT rows, work item y); with RPT > 1 a lane does the same slices
// of RPT rows (WG / LANES apart), so each x group it loads serves RPT rows' dot products. Rows past O
// read row O-1 and are not stored.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 2) const uint FORMAT = 3u;  // GGML_FMT_* of this mode's matrices
layout(constant_id = 3) const uint TOKENS = 8u;  // slots per register chunk, 1..8
layout(constant_id = 4) const bool GATEUP = true;
layout(constant_id = 5) const uint LANES = 1u;   // lanes a row: 1, 2, 4 or 8 (divides the subgroup size)
// Read the lane's next slice (its quants, scales and mins) before computing the current one, so
// the next loads are in flight while this slice's dot products run.
layout(constant_id = 6) const bool PREFETCH = false;
layout(constant_id = 7) const uint RPT = 1u;     // rows a lane, 1..4

const uint NMAT = GATEUP ? 2u : 1u;
const uint NR = NMAT * RPT;  // (matrix, row) pairs a lane: index m * RPT + j

// OpSUDot (SPV_KHR_integer_dot_product) as dec_gemv_ggml_idp declares it.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4x8(uint a, uint b, spirv_literal int packedFormat);  // signed a x unsigned b

layout(std430, binding = 0) readonly restrict buffer XQ { uvec4 xq[]; };  // quantized x [S][D] or h [slots][I]: a uvec4 per 16 columns
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) readonly restrict buffer PR { uint pairs[]; };
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; }; // h [slots][I] or ypair [slots][D]
layout(std430, binding = 4) readonly restrict buffer SW { float slotWeight[]; };
layout(std430, binding = 5) readonly restrict buffer EB { uint eb[]; };
layout(std430, binding = 5) readonly restrict buffer EV { uvec4 ev[]; };
layout(std430, binding = 6) readonly restrict buffer ET { uvec4 expertTable[]; };
layout(std430, binding = 7) readonly restrict buffer XS { float xscale[]; };  // per 16 columns
layout(std430, binding = 8) readonly restrict buffer XU { int xsum[]; };

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
const uint GAP = GGML_SLICE_GAP(FORMAT) / 16u;  // x groups from a slice's first run to its second
const int OFF = int(GGML_SLICE_OFFSET(FORMAT));

int dot16(uvec4 a, uvec4 w) {
    return sudot4x8(a.x, w.x, 0) + sudot4x8(a.y, w.y, 0) + sudot4x8(a.z, w.z, 0) + sudot4x8(a.w, w.w, 0);
}

void main() {
    const uint PASS_ROWS = gl_WorkGroupSize.x / LANES;  // rows of one lane each
    const uint rowBase = gl_WorkGroupID.x * PASS_ROWS * RPT;
    if (rowBase >= pc.O) return;  // uniform
    // The grid may cover more items than the list holds (sized before dec_group_experts counts them).
    if (gl_WorkGroupID.y >= work[0].z) return;  // uniform
    const uvec4 item = work[1u + gl_WorkGroupID.y];
    if (item.x >= uint(expertTable.length())) return;  // no expert (NaN logits): moe_sum skips its slots
    const uint K = work[0].y;
    const uint row0 = rowBase + gl_LocalInvocationIndex / LANES;  // the lane's rows: row0 + j * PASS_ROWS
    const uint part = gl_LocalInvocationIndex % LANES;
    const uvec4 offs = expertTable[item.x];
    const uint blocks = pc.cols / BLOCK_ELEMENTS;
    const uint slices = blocks * SLICES_PER_BLOCK;
    const uint groups = pc.cols >> 4u;  // x groups an input row
    uint base[NR];
    [[unroll]] for (uint j = 0u; j < RPT; ++j) {
        const uint rowOff = min(row0 + j * PASS_ROWS, pc.O - 1u) * blocks * BLOCK_BYTES;
        base[j] = (GATEUP ? offs.x : offs.z) + rowOff;
        if (GATEUP) base[RPT + j] = offs.y + rowOff;
    }

    for (uint p0 = 0u; p0 < item.w; p0 += TOKENS) {
        const uint nt = min(TOKENS, item.w - p0);
        uint xrow[TOKENS];  // group index of each slot's input row
        [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
            const uint slot = pairs[item.z + p0 + min(k, nt - 1u)];
            xrow[k] = (GATEUP ? slot / K : slot) * groups;
        }
        float acc[NR][TOKENS];
        [[unroll]] for (uint m = 0u; m < NR; ++m) [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[m][k] = 0.0;
        uvec4 nq0[NR], nq1[NR];
        vec2 nd[NR], nmn[NR];
        if (PREFETCH && part < slices) {
            [[unroll]] for (uint m = 0u; m < NR; ++m)
                ggml_slice(FORMAT, base[m] + (part / SLICES_PER_BLOCK) * BLOCK_BYTES, part % SLICES_PER_BLOCK, nq0[m], nq1[m], nd[m], nmn[m]);
        }
        for (uint u = part; u < slices; u += LANES) {
            const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
            const uint g = (blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s)) >> 4u;
            uvec4 q0[NR], q1[NR];
            vec2 d[NR], mn[NR];
            if (PREFETCH) {
                [[unroll]] for (uint m = 0u; m < NR; ++m) { q0[m] = nq0[m]; q1[m] = nq1[m]; d[m] = nd[m]; mn[m] = nmn[m]; }
                const uint un = u + LANES;
                if (un < slices) {
                    [[unroll]] for (uint m = 0u; m < NR; ++m)
                        ggml_slice(FORMAT, base[m] + (un / SLICES_PER_BLOCK) * BLOCK_BYTES, un % SLICES_PER_BLOCK, nq0[m], nq1[m], nd[m], nmn[m]);
                }
            } else {
                [[unroll]] for (uint m = 0u; m < NR; ++m) ggml_slice(FORMAT, base[m] + blk * BLOCK_BYTES, s, q0[m], q1[m], d[m], mn[m]);
            }
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                if (k < nt) {  // uniform
                    const uint at = xrow[k] + g;
                    const uvec4 xa0 = xq[at], xa1 = xq[at + GAP];
                    const vec2 xs = vec2(xscale[at], xscale[at + GAP]);
                    const ivec2 xsm = ivec2(xsum[at], xsum[at + GAP]);
                    [[unroll]] for (uint m = 0u; m < NR; ++m) {
                        const int d0 = dot16(xa0, q0[m]) - OFF * xsm.x;
                        const int d1 = dot16(xa1, q1[m]) - OFF * xsm.y;
                        float a = acc[m][k];
                        a = fma(xs.x, fma(d[m].x, float(d0), mn[m].x * float(xsm.x)), a);
                        a = fma(xs.y, fma(d[m].y, float(d1), mn[m].y * float(xsm.y)), a);
                        acc[m][k] = a;
                    }
                }
            }
        }
        // the row's LANES partial sums (lanes of one row are consecutive, within a subgroup)
        [[unroll]] for (uint o = 1u; o < LANES; o <<= 1u)
            [[unroll]] for (uint m = 0u; m < NR; ++m)
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[m][k] += subgroupShuffleXor(acc[m][k], o);
        [[unroll]] for (uint j = 0u; j < RPT; ++j) {
            const uint row = row0 + j * PASS_ROWS;
            if (row < pc.O && part == 0u) {
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                    if (k < nt) {
                        const uint slot = pairs[item.z + p0 + k];
                        const float gv = acc[j][k];
                        if (GATEUP) yb[slot * pc.O + row] = gv / (1.0 + exp(-gv)) * acc[NR - RPT + j][k];
                        else yb[slot * pc.O + row] = slotWeight[slot] * gv;
                    }
                }
            }
        }
    }
}
