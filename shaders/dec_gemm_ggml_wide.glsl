// dec_gemm_ggml_wide.glsl: the body of dec_gemm_ggml_wide_cm.comp and dec_gemm_ggml_wide_cm_emu.comp
// (the test variant: CM_EMULATE).
// dec_gemm_ggml_wide_cm: dec_gemm_ggml (y[s, o] = sum_i W[o, i] * x[s, i], a prompt chunk straight
// from a GGML block tensor) for long chunks, on cm_slice_tile.glsl's tiles of 128 rows x BN tokens
// with cm_ggml_loader.glsl's loads: each step one 32-weight slice of every row (GGML's weights, then
// rounded to f16 for the products), x converted to f16 in the slice's column order once per 128
// rows. As dec_gemm_quant_wide: for chunks with tiles enough to fill the GPU, no split. I a multiple
// of the block's elements, xOffset % 4 == 0, rows past O read row O - 1 and tokens past S read x as
// 0 (computed, never stored). Grid: (row tiles, token tiles).
#extension GL_GOOGLE_include_directive : require
#include "cm_extensions.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_*
layout(constant_id = 1) const uint BN = 64u;     // tokens a tile: 32 or 64

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
} pc;

#define GGML_WORD(i) wb[i]
#define GGML_VEC4(i) wv[i]
#include "ggml_blocks.glsl"
#define CM_LOAD_AHEAD 2  // two steps of loads in flight (cm_slice_tile.glsl)
#include "cm_slice_tile.glsl"
#include "cm_ggml_loader.glsl"

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBytes = (pc.I / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint rowBase = gl_WorkGroupID.x * BM, s0 = gl_WorkGroupID.y * BN;
    rowAddr = pc.blockOffset + min(rowBase + t, pc.O - 1u) * rowBytes;
    [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
        const uint n = xInput(m);
        slotRow[m] = n < BN && s0 + n < pc.S ? pc.xOffset + (s0 + n) * pc.I : NO_SLOT;
    }
    tileSteps(0u, pc.I / BK);
    for (uint idx = t; idx < BM * BN; idx += 128u) {
        const uint row = rowBase + idx % BM, s = s0 + idx / BM;
        if (row < pc.O && s < pc.S) yb[pc.yOffset + s * pc.O + row] = CT(idx % BM, idx / BM);
    }
}
