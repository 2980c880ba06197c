// cm_ggml_loader.glsl: cm_slice_tile.glsl's loaders over GGML block rows (moe_ggml_cm):
// step u is 32-weight slice u of the row (ggml_blocks.glsl: GGML's weights), its columns in the
// slice's order (two runs of 16, GGML_SLICE_GAP apart), and x read as vec4s (I a multiple of the
// block's elements, input rows 16-byte aligned). The includer declares FORMAT (GGML_FMT_*) and the
// x buffer xv (vec4), includes ggml_blocks.glsl, cm_slice_tile.glsl and this, then sets rowAddr
// (byte address of this thread's row) and slotRow[m] (first float of input xInput(m)'s row, NO_SLOT:
// zeros).
const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT);  // columns from a slice's first run to its second

uint rowAddr;
uint slotRow[X_PER_THREAD];
uvec4 nextQ0[2], nextQ1[2];  // by register set (cm_slice_tile.glsl)
vec2 nextD[2], nextM[2];

void tileLoadW(uint u, uint p) {
    const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
    ggml_slice(FORMAT, rowAddr + blk * BLOCK_BYTES, s, nextQ0[p], nextQ1[p], nextD[p], nextM[p]);
}

void tileWeights(uint p, out float w[32]) { ggml_slice_weights(FORMAT, nextQ0[p], nextQ1[p], nextD[p], nextM[p], w); }

uint tileXCol(uint u, uint v) {
    const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
    return blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s) + (v / 4u) * GAP + (v % 4u) * 4u;
}

vec4 tileLoadX(uint m, uint col) { return slotRow[m] != NO_SLOT ? xv[(slotRow[m] + col) >> 2u] : vec4(0.0); }
