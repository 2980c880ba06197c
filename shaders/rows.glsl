// rows.glsl: the rows a thread owns and their output, shared by gemv_float.glsl and gemv_idp.glsl.
// Included after the body's bindings and hooks: pc (O, rowWords, groupsPerRow, limit with GATEUP),
// storeOut(tok, row, v), GATE_WEIGHT_OFFSET / UP_WEIGHT_OFFSET (uvec4 units), W_GATE / S_GATE
// (/ W_UP / S_UP) and COLS_PER_VEC, rv (common.glsl).

uint wRow[NV];   // first uvec4 of each owned row: [mat*RPT + r]
uint sRow[RPT];  // first scale index of each owned row

// Rows rowBase + r*ROW_LANES + rg of row group rg; rows past O are clamped for loads (results
// discarded) to keep the column loop branch-free.
// COLUMN_BLOCKS (the MoE down matrix, pool/expert-layout.ts): uvec4 (row, c) at c * O + row and
// scale (row, g) at g * O + row, so lanes that own consecutive rows load consecutive uvec4.
void initRows(uint rowBase, uint rg) {
    const uint rowVec = pc.rowWords >> 2u;
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        const uint row = min(rowBase + r * ROW_LANES + rg, pc.O - 1u);
#ifdef COLUMN_BLOCKS
        wRow[r] = GATE_WEIGHT_OFFSET + row;
        sRow[r] = row;
#else
        wRow[r] = GATE_WEIGHT_OFFSET + row * rowVec;
        sRow[r] = row * pc.groupsPerRow;
#endif
#ifdef GATEUP
        wRow[RPT + r] = UP_WEIGHT_OFFSET + row * rowVec;
#endif
    }
}

// rv holds the reduced sums for row group rgo, token tok.
void storeRows(uint rowBase, uint rgo, uint tok) {
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        const uint row = rowBase + r * ROW_LANES + rgo;
        if (row < pc.O) {
#ifdef GATEUP
            storeOut(tok, row, siluGate(rv[r], rv[RPT + r], pc.limit));
#else
            storeOut(tok, row, rv[r]);
#endif
        }
    }
}

// Weights (uvec4 column c) and scales of every owned row, of every matrix: [mat*RPT + r]. (The
// outputs are not named wq: the dense integer-dot body's weight buffer is, and W_GATE reads it.)
void loadW(uint c, out uvec4 wOut[NV], out float scOut[NV]) {
    const uint g = (c * COLS_PER_VEC) / GROUP_SIZE;  // a uvec4 never straddles a group
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
#ifdef COLUMN_BLOCKS
        wOut[r] = W_GATE(wRow[r] + c * pc.O);
        scOut[r] = S_GATE(sRow[r] + g * pc.O);
#else
        wOut[r] = W_GATE(wRow[r] + c);
        scOut[r] = S_GATE(sRow[r] + g);
#endif
#ifdef GATEUP
        wOut[RPT + r] = W_UP(wRow[RPT + r] + c);
        scOut[RPT + r] = S_UP(sRow[r] + g);
#endif
    }
}
