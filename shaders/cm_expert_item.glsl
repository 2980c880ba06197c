// cm_expert_item.glsl: a work item of the prompt chunks' experts on cm_slice_tile.glsl's tiles
// (moe_ggml_cm, moe_pool_cm): the item's slots BN at a time, each tile's inputs (x[token = slot / K]
// for gate+up, h[slot] for down), its steps, and its outputs (GATEUP: h[slot][row] = the includer's
// cmSwiGLU(gate, up), the tile's rows being 64 gate rows then the same 64 up rows; down:
// ypair[slot][row] = slot weight * sum). The includer declares GATEUP, pairs[], slotWeight[], yb[]
// and slotRow[X_PER_THREAD] (its loaders' input rows), and defines float cmSwiGLU(float g, float u).
const uint OUT_ROWS = GATEUP ? 64u : 128u;  // output rows a tile
shared uint slotOf[64];                      // the tile's slots (pairs[]), past the item's count: NO_SLOT

float cmSwiGLU(float g, float u);

// item: (expert, -, first pair, pairs), as moe.glsl's work list; K slots a token; O output rows
// (rowBase the tile's first), cols the input rows' length; steps of the tile.
void cmExpertItem(uvec4 item, uint K, uint rowBase, uint O, uint cols, uint steps) {
    const uint t = gl_LocalInvocationIndex;
    for (uint p0 = 0u; p0 < item.w; p0 += BN) {
        if (p0 > 0u) barrier();  // the last tile's epilogue read slotOf and the C tile
        if (t < BN) slotOf[t] = p0 + t < item.w ? pairs[item.z + p0 + t] : NO_SLOT;
        barrier();
        [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
            const uint slot = xInput(m) < BN ? slotOf[xInput(m)] : NO_SLOT;
            slotRow[m] = slot == NO_SLOT ? NO_SLOT : (GATEUP ? slot / K : slot) * cols;
        }
        tileSteps(0u, steps);
        // value idx of the tile's OUT_ROWS x BN outputs: row idx % OUT_ROWS, slot idx / OUT_ROWS
        for (uint idx = t; idx < OUT_ROWS * BN; idx += 128u) {
            const uint r = idx % OUT_ROWS, n = idx / OUT_ROWS;
            const uint slot = slotOf[n];
            if (rowBase + r < O && slot != NO_SLOT) yb[slot * O + rowBase + r] = GATEUP ? cmSwiGLU(CT(r, n), CT(64u + r, n)) : slotWeight[slot] * CT(r, n);
        }
    }
}
