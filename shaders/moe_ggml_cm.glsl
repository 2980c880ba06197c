// moe_ggml_cm.glsl: the body of moe_ggml_cm.comp and moe_ggml_cm_emu.comp (the test variant: CM_EMULATE).
// moe_ggml_cm: moe_ggml_rows (a prompt chunk's experts, lists grouped by expert, GGML blocks as the
// file holds them) on the matrix cores: gemm_coopmat_tile.glsl's tiles of 64 rows x 64 slots, each
// step one 32-weight slice of the tile's rows (ggml_blocks.glsl: GGML's weights, rounded to f16 for
// the products, as dec_gemm_ggml_cm), the item's slots' input rows gathered through `pairs` and
// converted to f16. Why: the rows kernels pay every product on the ALUs, so their time grows with the
// slots (a 64-token chunk's experts took half its time); here an expert's weights are dequantized
// once per 64 slots and the products are the matrix cores'. At a 64-token chunk's few slots an
// expert it measured slower than moe_ggml_rows_idp (README), so it runs only where asked for.
//
// Same bindings, work list and outputs as moe_ggml_rows: GATEUP: h[slot][row] = silu(gate x) * (up x),
// x[token = slot / K]; else ypair[slot][row] = slot weight * (down h[slot]). Workgroup (x, y) = (row
// tile of 64, work item y); it walks the item's slots 64 at a time. Rows past O read row O - 1 and
// slots past the item's count read 0 (computed, not stored).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_* of this mode's matrices
layout(constant_id = 1) const bool GATEUP = true;

layout(std430, binding = 0) readonly restrict buffer XV { vec4 xv[]; };  // x [S][D] or h [slots][I]
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) readonly restrict buffer PR { uint pairs[]; };
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; };  // h [slots][I] or ypair [slots][D]
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
#define CM_NO_SPLIT
#include "gemm_coopmat_tile.glsl"

const uint NO_ROW = 0xffffffffu;
// The tile's slots' input rows: vec4 m of this thread reads from xRow[m] (the first float of the
// slot's row, NO_ROW past the item's count), set per slot tile by main.
uint xRow[4];
#define CM_LOAD_X(m, tok, col) nextX[m] = xRow[m] != NO_ROW ? xv[(xRow[m] + col) >> 2u] : vec4(0.0)
#include "ggml_cm_loader.glsl"

void main() {
    const uint t = gl_LocalInvocationIndex;
    // The grid may cover more items than the list holds (sized before dec_group_experts counts them).
    if (gl_WorkGroupID.y >= work[0].z) return;  // uniform
    const uvec4 item = work[1u + gl_WorkGroupID.y];
    if (item.x >= uint(expertTable.length())) return;  // no expert (NaN logits): moe_sum skips its slots
    const uint K = work[0].y;
    const uint rowBase = gl_WorkGroupID.x * BM;
    const uvec4 offs = expertTable[item.x];
    const uint rowOff = min(rowBase + t % BM, pc.O - 1u) * (pc.cols / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint steps = pc.cols / 32u;
    for (uint p0 = 0u; p0 < item.w; p0 += BN) {
        [[unroll]] for (uint m = 0u; m < 4u; m++) {
            const uint p = p0 + (t + 128u * m) / 8u;
            const uint slot = p < item.w ? pairs[item.z + p] : 0u;
            xRow[m] = p < item.w ? (GATEUP ? slot / K : slot) * pc.cols : NO_ROW;
        }
        rowAddr = (GATEUP ? offs.x : offs.z) + rowOff;
        cmTile(0u, steps);
        if (GATEUP) {
            float gate[VALUES];
            [[unroll]] for (uint e = 0u; e < VALUES; e++) gate[e] = cmValues[e];
            rowAddr = offs.y + rowOff;
            cmTile(0u, steps);
            [[unroll]] for (uint e = 0u; e < VALUES; e++) cmValues[e] *= gate[e] / (1.0 + exp(-gate[e]));
        }
        // value e of thread t: row (e * 128 + t) % BM, slot p0 + (e * 128 + t) / BM of the tile
        [[unroll]] for (uint e = 0u; e < VALUES; e++) {
            const uint idx = e * 128u + t;
            const uint row = rowBase + idx % BM, p = p0 + idx / BM;
            if (row < pc.O && p < item.w) {
                const uint slot = pairs[item.z + p];
                yb[slot * pc.O + row] = GATEUP ? cmValues[e] : slotWeight[slot] * cmValues[e];
            }
        }
    }
}
