// dec_gemm_ggml_cm.glsl: the body of dec_gemm_ggml_cm.comp and dec_gemm_ggml_cm_emu.comp (the test variant: CM_EMULATE).
// dec_gemm_ggml_cm: dec_gemm_ggml (y[s, o] = sum_i W[o, i] * x[s, i], a prompt chunk straight from a
// GGML block tensor) on the matrix cores: cm_slice_tile.glsl's tiles of 128 rows x BN tokens, each
// step one 32-weight slice of every row (GGML's weights, then rounded to f16 for the products), x
// converted to f16 in the slice's column order once per 128 rows. Bindings, push constants and rules
// are dec_gemm_ggml's (GgmlGemmKernel records both): I a multiple of the block's elements,
// xOffset % 4 == 0, rows past O read row O - 1 and tokens past S read x as 0 (computed, never
// stored), splits over the columns in runs of whole blocks with the same scratch (here tiles of
// 128 rows x BN tokens: [tile][split][128 * BN]). Grid: (row tiles, token tiles, splits).
#extension GL_GOOGLE_include_directive : require
// cm_slice_tile.glsl's extensions
#extension GL_EXT_control_flow_attributes : require
#ifndef CM_EMULATE
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_*
layout(constant_id = 1) const uint BN = 32u;     // tokens a tile: 32 or 64

layout(std430, binding = 0) readonly restrict buffer WB { uint wb[]; };
layout(std430, binding = 0) readonly restrict buffer WV { uvec4 wv[]; };
layout(std430, binding = 1) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 2) writeonly restrict buffer YB { float yb[]; };
// [tile][split][BM * BN] partial tiles and a word per tile (0 between calls), as gemm_split.glsl
layout(std430, binding = 3) coherent restrict buffer PT { float part[]; };
layout(std430, binding = 4) coherent restrict buffer AR { uint arrived[]; };

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
#include "cm_slice_tile.glsl"
#include "cm_ggml_loader.glsl"
#include "cm_split.glsl"

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBytes = (pc.I / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint rowBase = gl_WorkGroupID.x * BM, s0 = gl_WorkGroupID.y * BN;
    rowAddr = pc.blockOffset + min(rowBase + t, pc.O - 1u) * rowBytes;
    [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
        const uint n = xInput(m);
        xRow[m] = n < BN && s0 + n < pc.S ? pc.xOffset + (s0 + n) * pc.I : NO_SLOT;
    }
    const uint uBegin = gl_WorkGroupID.z * (pc.splitCols / BK);
    const uint uEnd = min(pc.I / BK, uBegin + pc.splitCols / BK);
    tileSteps(uBegin, uEnd);
    if (pc.splits > 1u) {  // uniform
        if (!lastSplit(pc.splits)) return;
    }
    cmWriteTile(rowBase, s0, pc.O, pc.S, pc.yOffset);
}
