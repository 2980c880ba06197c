// gemm_split.glsl: the split-over-columns ending of the prompt-chunk GEMMs (dec_gemm_quant,
// dec_gemm_ggml, dec_gemm_ggml_idp). A tile's columns are cut into `splits`
// runs (grid z), one workgroup each; each stores its partial tile to `part`, then counts itself in
// the tile's `arrived` word; the last to arrive adds the tile's partials in split order (the same
// sum whichever workgroup is last) and sets the word back to 0 for the next call on the scratch.
//
// The includer defines SPLIT_PART_BINDING and SPLIT_ARRIVED_BINDING, runs 128 threads a workgroup
// over tiles of BM x BN = 32 x 64 (each thread's 4 x 4 register tile acc[i][j], stored at
// (i * 4 + j) * 128 + t: a workgroup's stores and loads are contiguous), grid x the row tiles.

// [tile][split][BM * BN] partial tiles, and a word per tile (0 between calls)
layout(std430, binding = SPLIT_PART_BINDING) coherent restrict buffer PT { float part[]; };
layout(std430, binding = SPLIT_ARRIVED_BINDING) coherent restrict buffer AR { uint arrived[]; };

shared bool lastToArrive;

// Stores this workgroup's partial tile; true in the tile's last workgroup to arrive, with acc then
// holding the sum of every split's partial, added in split order. Called in uniform control flow.
bool lastSplit(inout float acc[4][4], uint splits) {
    const uint t = gl_LocalInvocationIndex;
    const uint tile = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint TILE = BM * BN;
    [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++)
        part[(tile * splits + gl_WorkGroupID.z) * TILE + (i * 4u + j) * 128u + t] = acc[i][j];
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) lastToArrive = atomicAdd(arrived[tile], 1u) == splits - 1u;
    barrier();
    if (!lastToArrive) return false;  // uniform
    memoryBarrierBuffer();
    [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) {
        float v = 0.0;
        for (uint z = 0u; z < splits; z++) v += part[(tile * splits + z) * TILE + (i * 4u + j) * 128u + t];
        acc[i][j] = v;
    }
    if (t == 0u) arrived[tile] = 0u;
    return true;
}
