// moe_ggml_cm.glsl: the body of moe_ggml_cm.comp and moe_ggml_cm_emu.comp (the test variant: CM_EMULATE).
// moe_ggml_cm: moe_ggml_rows (a prompt chunk's experts, lists grouped by expert, GGML blocks as the
// file holds them) on the matrix cores. Why: the rows kernels pay every product on the ALUs and
// decode an expert's weights once per few slots, so their time grows with the slots; here a
// workgroup decodes a weight slice once for BN slots and the products are the matrix cores'.
//
// A workgroup: cm_slice_tile.glsl's tile (128 weight rows x BN slots, 32 columns a step) with
// cm_ggml_loader.glsl's loads, walking its work item BN slots at a time (cm_expert_item.glsl). GATEUP:
// the tile's rows are 64 gate rows then the same 64 up rows (one pass gives both, and the epilogue
// forms silu(gate) * up), so a workgroup owns 64 output rows; down: 128 output rows.
//
// Same bindings, work list and outputs as moe_ggml_rows: GATEUP: h[slot][row] = silu(gate x) * (up x),
// x[token = slot / K]; else ypair[slot][row] = slot weight * (down h[slot]). Workgroup (x, y) = (row
// tile, work item y). Rows past O read row O - 1 and slots past the item's count read 0 (computed,
// not stored).
#extension GL_GOOGLE_include_directive : require
#include "cm_extensions.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_* of this mode's matrices
layout(constant_id = 1) const bool GATEUP = true;
layout(constant_id = 2) const uint BN = 8u;      // slots a tile: 8, 16, 32 or 64

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

#define CM_LOAD_AHEAD 2  // two steps of loads in flight (cm_slice_tile.glsl)
#include "cm_slice_tile.glsl"
#include "cm_ggml_loader.glsl"

#include "cm_expert_item.glsl"

float cmSwiGLU(float g, float u) { return g / (1.0 + exp(-g)) * u; }

void main() {
    const uint t = gl_LocalInvocationIndex;
    // The grid may cover more items than the list holds (sized before dec_group_experts counts them).
    if (gl_WorkGroupID.y >= work[0].z) return;  // uniform
    const uvec4 item = work[1u + gl_WorkGroupID.y];
    if (item.x >= uint(expertTable.length())) return;  // no expert (NaN logits): moe_sum skips its slots
    const uint K = work[0].y;
    const uint rowBase = gl_WorkGroupID.x * OUT_ROWS;
    const uvec4 offs = expertTable[item.x];
    // this thread's weight row: GATEUP threads 0..63 the gate rows, 64..127 the up rows
    const uint matrix = GATEUP ? (t < 64u ? offs.x : offs.y) : offs.z;
    const uint row = min(rowBase + (GATEUP ? t % 64u : t), pc.O - 1u);
    rowAddr = matrix + row * (pc.cols / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint steps = pc.cols / BK;
    cmExpertItem(item, K, rowBase, pc.O, pc.cols, steps);
}
