// ggml_cm_loader.glsl: gemm_coopmat_tile.glsl's cmLoad and cmStore over GGML block rows, for
// dec_gemm_ggml_cm (the experts' moe_ggml_cm has cm_slice_tile.glsl's, cm_ggml_loader.glsl).
// Threads 0..63 each dequantize row t's 32-weight slice of a step
// (ggml_blocks.glsl: GGML's weights, rounded to f16 here) from rowAddr, which the includer sets;
// every thread loads 4 x vec4s of x through the includer's statement macro
//   CM_LOAD_X(m, tok, col)  sets nextX[m], this thread's vec4 m: token (or slot) tok of the tile's
//                           64, columns col .. col + 3 (0 past the tile's count)
// Included after ggml_blocks.glsl and gemm_coopmat_tile.glsl, with FORMAT declared.
const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT);  // columns from a slice's first run to its second

uint rowAddr;
uvec4 nextQ0, nextQ1;
vec2 nextD, nextM;

void cmLoad(uint u) {
    const uint t = gl_LocalInvocationIndex;
    const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
    if (t < BM) ggml_slice(FORMAT, rowAddr + blk * BLOCK_BYTES, s, nextQ0, nextQ1, nextD, nextM);
    const uint c0 = blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s);
    // 64 tokens x the slice's 32 columns (8 vec4s a token: 4 of run 0, then 4 of run 1)
    [[unroll]] for (uint m = 0u; m < 4u; m++) {
        const uint e = t + 128u * m;
        const uint tok = e / 8u, v = e % 8u;
        const uint col = c0 + (v / 4u) * GAP + (v % 4u) * 4u;
        CM_LOAD_X(m, tok, col);
    }
}

void cmStore() {
    const uint t = gl_LocalInvocationIndex;
    if (t < BM) {
        float w[32];
        ggml_slice_weights(FORMAT, nextQ0, nextQ1, nextD, nextM, w);
        [[unroll]] for (uint k = 0u; k < BK; k += 2u) W2(t, k) = packHalf2x16(vec2(w[k], w[k + 1u]));
    }
    cmStoreX();
}
