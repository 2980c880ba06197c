// gemm_coopmat_tile.glsl: the matrix-core tile of the prompt-chunk GEMMs dec_gemm_quant_cm and
// dec_gemm_ggml_cm (VK_NV_cooperative_matrix: glslang 12, Debian 12's, cannot emit the KHR
// extension). y[s, o] = sum_i W[o, i] x[s, i] as C = A B: A the weights (BM rows x BK columns, f16,
// row-major in wTile), B the chunk's x transposed (BK columns x BN tokens, f16, xTile holds it
// token-major: column-major B), C f32. One workgroup of 128 threads (4 subgroups of 32: the device
// decision asks for subgroups of 32) per tile of BM = 64 rows x BN = 64 tokens; subgroup g computes
// rows (g / 2) * 32.. and tokens (g % 2) * 32.. as 2 x 4 accumulators of 16 x 8 (the 16 x 8 x 16
// shape), each step of BK = 32 columns two k-steps of 16.
//
// The includer defines, before including this:
//   void cmLoad(uint u)  loads step u's weights and x into registers (the next step's, while this one
//                        computes: with a barrier per step, a load issued after it stalls every step)
//   void cmStore()       writes the weights as f16 pairs (packHalf2x16) into the words W2(row, k),
//                        k even, then cmStoreX() the x it loaded into nextX (below)
//   SPLIT_PART_BINDING, SPLIT_ARRIVED_BINDING  the split scratch's bindings (or CM_NO_SPLIT: none,
//                        and no cmLastSplit)
// and calls cmTile(uBegin, uEnd) with its run of steps, then cmLastSplit where split, then cmWrite.
// Weights and x become f16 here (the products' inputs; the sums are f32), as llama.cpp's matrix-core
// GEMM does: |x| past 65504 would overflow. CM_EMULATE (tests on devices without cooperative
// matrices) replaces the matrix products with plain sums over the same tiles.
#ifndef CM_EMULATE
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require

const uint BM = 64u;  // rows per workgroup
const uint BN = 64u;  // tokens per workgroup
const uint BK = 32u;  // columns per step
const uint LDS = BK + 8u;  // f16 stride of a tile row: 80 bytes, a 16-byte multiple that staggers the banks
const uint VALUES = BM * BN / 128u;  // C values a thread ends with (cmValue)

// f16 pairs in 32-bit words, [row][k / 2] and [token][k / 2], held in uvec4 arrays: a cooperative
// load or store needs its start 16-byte aligned in memory, and an array of a smaller type may be
// placed at any 4-byte offset of shared memory (NVIDIA's 580 driver put these 4 bytes off: every load
// then read its rows from 2 halves earlier, and columns 30, 31 of each 32-column step summed as
// zero). Element and stride of the cooperative loads are in uvec4s (8 halves).
shared uvec4 wTile[BM * LDS / 8u];
shared uvec4 xTile[BN * LDS / 8u];
#define WORD(tile, i) tile[(i) >> 2u][(i) & 3u]
#define W2(row, k) WORD(wTile, ((row) * LDS + (k)) / 2u)
#define X2(tok, k) WORD(xTile, ((tok) * LDS + (k)) / 2u)
const uint CS = BM;                // f32 stride of cTile
shared uvec4 cTile[BN * CS / 4u];  // f32 bits [token][row], once the loop is done (uvec4s: aligned as the tiles)
#define CT(row, tok) uintBitsToFloat(WORD(cTile, (tok) * CS + (row)))

#ifndef CM_NO_SPLIT
// [tile][split][BM * BN] partial tiles and a word per tile (0 between calls), as gemm_split.glsl
layout(std430, binding = SPLIT_PART_BINDING) coherent restrict buffer PT { float part[]; };
layout(std430, binding = SPLIT_ARRIVED_BINDING) coherent restrict buffer AR { uint arrived[]; };
shared bool lastToArrive;
#endif

#ifndef CM_EMULATE
// A and B must be distinct types (16 x 16 and 16 x 8): a driver may give the registers of a matrix
// type one layout, and a 16 x 16 type used as both A and B then computes wrong sums.
#define CM_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>  // M x K
#define CM_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>   // K x N
#define CM_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>   // M x N
#endif

float cmValues[VALUES];  // thread t's values: C element e * 128 + t of cTile ([token][row])

// The next step's x, loaded by cmLoad: vec4 m of thread t holds token (t + 128 m) / 8's columns
// ((t + 128 m) % 8) * 4 .. + 3 of the step (in the includer's column order), 0 past S.
vec4 nextX[4];

void cmStoreX() {
    const uint t = gl_LocalInvocationIndex;
    [[unroll]] for (uint m = 0u; m < 4u; m++) {
        const uint e = t + 128u * m;
        const uint tok = e / 8u, c = (e % 8u) * 4u;
        X2(tok, c) = packHalf2x16(nextX[m].xy);
        X2(tok, c + 2u) = packHalf2x16(nextX[m].zw);
    }
}

void cmLoad(uint u);
void cmStore();

#ifdef CM_EMULATE
// Test hook: the same tiles with plain f32 sums of the f16 tiles (no cooperative matrices), so that
// the loaders, the epilogue and the split run on a device without them.
void cmTile(uint uBegin, uint uEnd) {
    const uint t = gl_LocalInvocationIndex;
    [[unroll]] for (uint e = 0u; e < VALUES; e++) cmValues[e] = 0.0;
    if (uBegin < uEnd) cmLoad(uBegin);
    for (uint u = uBegin; u < uEnd; u++) {
        cmStore();
        barrier();
        if (u + 1u < uEnd) cmLoad(u + 1u);
        for (uint e = 0u; e < VALUES; e++) {
            const uint idx = e * 128u + t, row = idx % BM, tok = idx / BM;
            float acc = 0.0;
            for (uint k = 0u; k < BK; k += 2u) {
                const vec2 w = unpackHalf2x16(W2(row, k)), x = unpackHalf2x16(X2(tok, k));
                acc += w.x * x.x + w.y * x.y;
            }
            cmValues[e] += acc;
        }
        barrier();
    }
}
#else
// Runs steps uBegin .. uEnd - 1 (uniform), leaving this thread's C values in cmValues. The
// accumulators are named, not an array: an array of cooperative matrices indexed in a loop may be
// kept in memory rather than registers.
#define CM_LOAD_B(j) coopMatLoadNV(b##j, xTile, ((n0 + 8u * j) * LDS + kk) / 8u, LDS / 8u, true)
#define CM_MMA(i, j) c##i##j = coopMatMulAddNV(a##i, b##j, c##i##j)
#define CM_STORE(i, j) coopMatStoreNV(c##i##j, cTile, ((n0 + 8u * j) * CS + r0 + 16u * i) / 4u, CS / 4u, true)
void cmTile(uint uBegin, uint uEnd) {
    const uint g = gl_SubgroupID;
    const uint r0 = (g / 2u) * 32u, n0 = (g % 2u) * 32u;
    CM_C c00 = CM_C(0.0), c01 = CM_C(0.0), c02 = CM_C(0.0), c03 = CM_C(0.0);
    CM_C c10 = CM_C(0.0), c11 = CM_C(0.0), c12 = CM_C(0.0), c13 = CM_C(0.0);
    if (uBegin < uEnd) cmLoad(uBegin);
    for (uint u = uBegin; u < uEnd; u++) {
        cmStore();
        barrier();
        if (u + 1u < uEnd) cmLoad(u + 1u);
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
            CM_A a0, a1;
            CM_B b0, b1, b2, b3;
            coopMatLoadNV(a0, wTile, (r0 * LDS + kk) / 8u, LDS / 8u, false);
            coopMatLoadNV(a1, wTile, ((r0 + 16u) * LDS + kk) / 8u, LDS / 8u, false);
            CM_LOAD_B(0); CM_LOAD_B(1); CM_LOAD_B(2); CM_LOAD_B(3);
            CM_MMA(0, 0); CM_MMA(0, 1); CM_MMA(0, 2); CM_MMA(0, 3);
            CM_MMA(1, 0); CM_MMA(1, 1); CM_MMA(1, 2); CM_MMA(1, 3);
        }
        barrier();
    }
    // C (rows x tokens) column-major into cTile: element (row, token) at token * CS + row
    CM_STORE(0, 0); CM_STORE(0, 1); CM_STORE(0, 2); CM_STORE(0, 3);
    CM_STORE(1, 0); CM_STORE(1, 1); CM_STORE(1, 2); CM_STORE(1, 3);
    barrier();
    const uint t = gl_LocalInvocationIndex;
    [[unroll]] for (uint e = 0u; e < VALUES; e++) {
        const uint idx = e * 128u + t;
        cmValues[e] = CT(idx % BM, idx / BM);
    }
}
#endif

#ifndef CM_NO_SPLIT
// The split ending (gemm_split.glsl's, over cmValues, with the memory model's scopes): stores this
// workgroup's partial tile; true in the tile's last workgroup to arrive, cmValues then the sum of
// every split's partial in split order.
bool cmLastSplit(uint splits) {
    const uint t = gl_LocalInvocationIndex;
    const uint tile = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint TILE = BM * BN;
    [[unroll]] for (uint e = 0u; e < VALUES; e++) part[(tile * splits + gl_WorkGroupID.z) * TILE + e * 128u + t] = cmValues[e];
    // The Vulkan memory model (which cooperative matrices need) orders other threads' buffer stores
    // before thread 0's atomic only through a barrier with device scope and buffer semantics.
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
    if (t == 0u) lastToArrive = atomicAdd(arrived[tile], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease) == splits - 1u;
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
    if (!lastToArrive) return false;  // uniform
    [[unroll]] for (uint e = 0u; e < VALUES; e++) {
        float v = 0.0;
        for (uint z = 0u; z < splits; z++) v += part[(tile * splits + z) * TILE + e * 128u + t];
        cmValues[e] = v;
    }
    if (t == 0u) arrived[tile] = 0u;
    return true;
}
#endif

// Writes the tile's C values to y[S][O] from yOffset (tokens past S and rows past O dropped): value e
// of thread t is row (e * 128 + t) % BM, token (e * 128 + t) / BM of the tile (rows contiguous).
void cmWrite(uint O, uint S, uint yOffset) {
    const uint t = gl_LocalInvocationIndex;
    [[unroll]] for (uint e = 0u; e < VALUES; e++) {
        const uint idx = e * 128u + t;
        const uint row = gl_WorkGroupID.x * BM + idx % BM, s = gl_WorkGroupID.y * BN + idx / BM;
        if (row < O && s < S) yb[yOffset + s * O + row] = cmValues[e];
    }
}
