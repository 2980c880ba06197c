// cm_split.glsl: the endings of cm_slice_tile.glsl's dense GEMMs (dec_gemm_ggml_cm, dec_gemm_quant_cm):
// the split over columns (gemm_split.glsl's, over the C tile, with the memory model's scopes) and
// the write of a tile's outputs. The includer declares part[] and arrived[] (the split scratch,
// [tile][split][BM * BN] and a word per tile, 0 between calls) and yb[] (y [S][O]).
shared bool lastToArrive;

// Stores this workgroup's partial tile; true in the tile's last workgroup to arrive, the C tile then
// the sum of every split's partial in split order (the same sum whichever workgroup is last). Each
// thread then holds in the C tile only its own elements idx = t + 128 e, which cmWriteTile reads.
bool lastSplit(uint splits) {
    const uint t = gl_LocalInvocationIndex;
    const uint tile = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint TILE = BM * BN;
    for (uint idx = t; idx < TILE; idx += 128u) part[(tile * splits + gl_WorkGroupID.z) * TILE + idx] = CT(idx % BM, idx / BM);
    // The Vulkan memory model (which cooperative matrices need) orders other threads' buffer stores
    // before thread 0's atomic only through a barrier with device scope and buffer semantics.
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
    if (t == 0u) lastToArrive = atomicAdd(arrived[tile], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease) == splits - 1u;
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
    if (!lastToArrive) return false;  // uniform
    for (uint idx = t; idx < TILE; idx += 128u) {
        float v = 0.0;
        for (uint z = 0u; z < splits; z++) v += part[(tile * splits + z) * TILE + idx];
        WORD((idx / BM) * CS + idx % BM) = floatBitsToUint(v);
    }
    if (t == 0u) arrived[tile] = 0u;
    return true;
}

// Writes the tile's sums to y[S][O] from yOffset (rows past O and tokens past S dropped): element
// idx = t + 128 e of the tile is row idx % BM, token idx / BM (rows contiguous).
void cmWriteTile(uint rowBase, uint s0, uint O, uint S, uint yOffset) {
    for (uint idx = gl_LocalInvocationIndex; idx < BM * BN; idx += 128u) {
        const uint row = rowBase + idx % BM, s = s0 + idx / BM;
        if (row < O && s < S) yb[yOffset + s * O + row] = CT(idx % BM, idx / BM);
    }
}
