// dec_gemm_ggml_cm.glsl: the body of dec_gemm_ggml_cm.comp and dec_gemm_ggml_cm_emu.comp (the test variant: CM_EMULATE).
// dec_gemm_ggml_cm: dec_gemm_ggml (y[s, o] = sum_i W[o, i] * x[s, i], a prompt chunk straight from a
// GGML block tensor) on the matrix cores: gemm_coopmat_tile.glsl's 64 x 64 tiles, each step one
// 32-weight slice of every row (ggml_blocks.glsl: GGML's weights, then rounded to f16 for the
// products), x converted to f16 in the slice's column order once per 64 rows. Bindings, push
// constants and rules are dec_gemm_ggml's (GgmlGemmKernel records both): I a multiple of the block's
// elements, xOffset % 4 == 0, rows past O read row O - 1 and tokens past S read x as 0 (computed,
// never stored), splits over the columns in runs of whole blocks with the same scratch (64-row tiles).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_*

layout(std430, binding = 0) readonly restrict buffer WB { uint wb[]; };
layout(std430, binding = 0) readonly restrict buffer WV { uvec4 wv[]; };
layout(std430, binding = 1) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 2) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;            // a multiple of the block's elements
    uint S;
    uint blockOffset;  // bytes
    uint xOffset;      // floats, a multiple of 4
    uint yOffset;      // floats
    uint splits;       // column runs a tile is split into (grid z); 1: no split
    uint splitCols;    // columns a run, a multiple of the block's elements
} pc;

#define GGML_WORD(i) wb[i]
#define GGML_VEC4(i) wv[i]
#include "ggml_blocks.glsl"
#define SPLIT_PART_BINDING 3
#define SPLIT_ARRIVED_BINDING 4
#include "gemm_coopmat_tile.glsl"

#define CM_LOAD_X(m, tok, col) { \
    const uint sIdx = gl_WorkGroupID.y * BN + tok; \
    nextX[m] = sIdx < pc.S ? xv[(pc.xOffset + sIdx * pc.I + col) >> 2u] : vec4(0.0); }
#include "ggml_cm_loader.glsl"

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBytes = (pc.I / BLOCK_ELEMENTS) * BLOCK_BYTES;
    rowAddr = pc.blockOffset + min(gl_WorkGroupID.x * BM + t % BM, pc.O - 1u) * rowBytes;
    const uint uBegin = gl_WorkGroupID.z * (pc.splitCols / 32u);
    const uint uEnd = min(pc.I / 32u, uBegin + pc.splitCols / 32u);
    cmTile(uBegin, uEnd);
    if (pc.splits > 1u) {  // uniform
        if (!cmLastSplit(pc.splits)) return;
    }
    cmWrite(pc.O, pc.S, pc.yOffset);
}
