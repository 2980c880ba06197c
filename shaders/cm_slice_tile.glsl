// cm_slice_tile.glsl: the matrix-core tile of the prompt chunks' experts (moe_ggml_cm, moe_pool_cm;
// the dense GEMMs keep gemm_coopmat_tile.glsl's 64 x 64 tiles: on the H100 this tile was 1.2-1.6x
// slower for them at 64 tokens, 2026-12-07). A workgroup of 128 threads (4 subgroups of 32: the
// device decision asks for subgroups of 32) computes C = W x^T over a tile of BM = 128 weight rows
// x BN tokens (or slots), in steps of BK = 32 columns. Each step every thread forms its row's 32 weights (rounded to f16 for the
// products) into the weight tile and the threads convert the BN inputs' 32 columns to f16 into the x
// tile; the next step's loads (or the one after it's: CM_LOAD_AHEAD) are issued before this step's
// products, and both tiles are double-buffered, so a step has one barrier. Subgroup g computes
// weight rows 32g.. x all BN columns: 2 x BN/8 accumulators of the 16 x 8 x 16 f16 -> f32 shape.
// Weights and x become f16 (the products' inputs; the sums are f32), as llama.cpp's matrix-core
// GEMM does: |x| past 65504 would overflow.
//
// The includer includes cm_extensions.glsl first (GLSL takes an #extension only before any
// declaration), declares BN (8, 16, 32 or 64), may define CM_LOAD_AHEAD (below), and defines,
// after including this (with CM_LOAD_AHEAD 2 the first two take the register set p too:
// tileLoadW(uint u, uint p), tileWeights(uint p, out float w[32])):
//   void tileLoadW(uint u)            loads step u's weights of this thread's row (tile row t) into its registers
//   void tileWeights(out float w[32]) the loaded step's 32 weights, in the step's column order
//   uint tileXCol(uint u, uint v)     the first column of x vec4 v (0..7) of step u, in that order
//   vec4 tileLoadX(uint m, uint col)  x vec4 m of this thread (input xInput(m) of the tile), columns col..col+3
// then calls tileSteps(uBegin, uEnd) and reads the tile's sums with CT(row, n) until its next
// barrier. CM_EMULATE (tests on devices without cooperative matrices) replaces the matrix products
// with plain sums over the same tiles.

const uint BM = 128u;                      // weight rows a tile
const uint BK = 32u;                       // columns a step
const uint LDS = BK + 8u;                  // f16 stride of a tile row: 80 bytes (16-byte multiple, staggers the banks)
const uint ROW_V = LDS / 8u;               // uvec4s a tile row
const uint W_TILE = BM * ROW_V;            // uvec4s of one weight tile
const uint X_TILE = BN * ROW_V;            // uvec4s of one x tile
const uint X_VECS = BN * 8u;               // vec4s of x a step (BN inputs x 32 columns)
const uint X_PER_THREAD = (X_VECS + 127u) / 128u;
const uint CS = BM;                        // f32 stride of the C tile ([n][row])
const uint C_TILE = BN * CS / 4u;          // uvec4s of the C tile
// Shared memory, uvec4s (cooperative loads need 16-byte aligned starts: NVIDIA's 580 driver placed
// an array of a smaller type 4 bytes off): two weight tiles, then two x tiles; the C tile reuses the
// weight tiles' space once the steps are done (sized for the larger of the two).
const uint W_SPACE = 2u * W_TILE > C_TILE ? 2u * W_TILE : C_TILE;
shared uvec4 tiles[W_SPACE + 2u * X_TILE];
const uint X_BASE = W_SPACE;
#define WORD(i) tiles[(i) >> 2u][(i) & 3u]
#define X2(buf, n, k) WORD(4u * (X_BASE + (buf) * X_TILE) + ((n) * LDS + (k)) / 2u)
#define CT(row, n) uintBitsToFloat(WORD((n) * CS + (row)))

const uint NO_SLOT = 0xffffffffu;  // an input the tile does not have (its x reads as zeros)
// x vec4 m of this thread is input n = (t + 128 m) / 8 of the tile, the step's vec4 (t + 128 m) % 8
uint xInput(uint m) { return (gl_LocalInvocationIndex + 128u * m) / 8u; }
// CM_LOAD_AHEAD (the includer's #define, before this file; 1 if not): steps of loads in flight. At
// 2 there are two register sets p = 0, 1 of loaded steps, and a step's loads are issued two steps
// before its store, so each has two steps' products to arrive in: GGML blocks' 512-token experts 5%
// faster on an H100, q4/q8 ones 7-9% slower (2026-12-07), so the GGML loaders take 2, the others 1.
// CM_SET indexes the set; CM_P_ARG / CM_P declare and pass it last, CM_P_FIRST_ARG / CM_P_FIRST first.
#ifndef CM_LOAD_AHEAD
#define CM_LOAD_AHEAD 1
#endif
#if CM_LOAD_AHEAD == 2
#define CM_SET [p]
#define CM_P_ARG , uint p
#define CM_P , p
#define CM_P_FIRST p,
#define CM_P_FIRST_ARG uint p,
#define CM_PASS(P) , P
vec4 nextX[2][X_PER_THREAD];  // set p's x
#else
#define CM_SET
#define CM_P_ARG
#define CM_P
#define CM_P_FIRST
#define CM_P_FIRST_ARG
#define CM_PASS(P)
vec4 nextX[X_PER_THREAD];  // the next step's x
#endif

void tileLoadW(uint u CM_P_ARG);
void tileWeights(CM_P_FIRST_ARG out float w[32]);
uint tileXCol(uint u, uint v);
vec4 tileLoadX(uint m, uint col);

void loadStep(uint u CM_P_ARG) {
    const uint t = gl_LocalInvocationIndex;
    tileLoadW(u CM_P);
    [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
        if (t + 128u * m < X_VECS) nextX CM_SET [m] = tileLoadX(m, tileXCol(u, (t + 128u * m) % 8u));
    }
}

void storeStep(uint buf CM_P_ARG) {
    const uint t = gl_LocalInvocationIndex;
    float w[32];
    tileWeights(CM_P_FIRST w);
    const uint at = buf * W_TILE + t * ROW_V;
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        tiles[at + j] = uvec4(packHalf2x16(vec2(w[8u * j], w[8u * j + 1u])), packHalf2x16(vec2(w[8u * j + 2u], w[8u * j + 3u])),
                              packHalf2x16(vec2(w[8u * j + 4u], w[8u * j + 5u])), packHalf2x16(vec2(w[8u * j + 6u], w[8u * j + 7u])));
    }
    [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
        const uint e = t + 128u * m;
        if (e < X_VECS) {
            const uint n = e / 8u, k = (e % 8u) * 4u;
            X2(buf, n, k) = packHalf2x16(nextX CM_SET [m].xy);
            X2(buf, n, k + 2u) = packHalf2x16(nextX CM_SET [m].zw);
        }
    }
}

#ifdef CM_EMULATE
// Test hook: thread t's values are C elements t + 128 e ([n][row] order), plain f32 sums of the f16 tiles.
const uint VALUES = BN;  // BM * BN / 128
float emu[VALUES];

void tileSteps(uint uBegin, uint uEnd) {
    const uint t = gl_LocalInvocationIndex;
    [[unroll]] for (uint e = 0u; e < VALUES; e++) emu[e] = 0.0;
#if CM_LOAD_AHEAD == 2
    if (uBegin < uEnd) loadStep(uBegin, 0u);
    if (uBegin + 1u < uEnd) loadStep(uBegin + 1u, 1u);
    for (uint u = uBegin; u < uEnd; u++) {
        const uint buf = u & 1u, p = (u - uBegin) & 1u;
        storeStep(buf, p);
        barrier();
        if (u + 2u < uEnd) loadStep(u + 2u, p);
#else
    if (uBegin < uEnd) loadStep(uBegin);
    for (uint u = uBegin; u < uEnd; u++) {
        const uint buf = u & 1u;
        storeStep(buf);
        barrier();
        if (u + 1u < uEnd) loadStep(u + 1u);
#endif
        for (uint e = 0u; e < VALUES; e++) {
            const uint idx = e * 128u + t, row = idx % BM, n = idx / BM;
            float acc = 0.0;
            for (uint k = 0u; k < BK; k += 2u) {
                const vec2 w = unpackHalf2x16(WORD(4u * (buf * W_TILE) + (row * LDS + k) / 2u));
                const vec2 x = unpackHalf2x16(X2(buf, n, k));
                acc += w.x * x.x + w.y * x.y;
            }
            emu[e] += acc;
        }
    }
    barrier();  // the C tile reuses the weight tiles
    [[unroll]] for (uint e = 0u; e < VALUES; e++) {
        const uint idx = e * 128u + t;
        WORD((idx / BM) * CS + idx % BM) = floatBitsToUint(emu[e]);
    }
    barrier();
}
#else
// A and B must be distinct types (16 x 16 and 16 x 8): a driver may give the registers of a matrix
// type one layout, and a 16 x 16 type used as both A and B then computes wrong sums.
#define CM_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>  // M x K
#define CM_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>   // K x N
#define CM_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>   // M x N
// The accumulators are named, not an array (an array of cooperative matrices indexed in a loop may
// be kept in memory): c<i><j> rows r0 + 16 i, columns 8 j; those past BN are never used (the
// specialization constant removes them).
#define CM_STEP_J(j) if (BN > 8u * j) { \
        CM_B b; coopMatLoadNV(b, tiles, xAt + (8u * j * LDS) / 8u, ROW_V, true); \
        c0##j = coopMatMulAddNV(a0, b, c0##j); c1##j = coopMatMulAddNV(a1, b, c1##j); }
#define CM_STORE_J(j) if (BN > 8u * j) { \
        coopMatStoreNV(c0##j, tiles, (8u * j * CS + r0) / 4u, CS / 4u, true); \
        coopMatStoreNV(c1##j, tiles, (8u * j * CS + r0 + 16u) / 4u, CS / 4u, true); }

void tileSteps(uint uBegin, uint uEnd) {
    const uint r0 = gl_SubgroupID * 32u;
    CM_C c00 = CM_C(0.0), c01 = CM_C(0.0), c02 = CM_C(0.0), c03 = CM_C(0.0), c04 = CM_C(0.0), c05 = CM_C(0.0), c06 = CM_C(0.0), c07 = CM_C(0.0);
    CM_C c10 = CM_C(0.0), c11 = CM_C(0.0), c12 = CM_C(0.0), c13 = CM_C(0.0), c14 = CM_C(0.0), c15 = CM_C(0.0), c16 = CM_C(0.0), c17 = CM_C(0.0);
    // The buffer a step writes was last read two steps ago, before the previous step's barrier.
#define CM_TILE_STEP(U, P) { \
        const uint buf = (U) & 1u; \
        storeStep(buf CM_PASS(P)); \
        barrier(); \
        if ((U) + uint(CM_LOAD_AHEAD) < uEnd) loadStep((U) + uint(CM_LOAD_AHEAD) CM_PASS(P)); \
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) { \
            CM_A a0, a1; \
            coopMatLoadNV(a0, tiles, buf * W_TILE + (r0 * LDS + kk) / 8u, ROW_V, false); \
            coopMatLoadNV(a1, tiles, buf * W_TILE + ((r0 + 16u) * LDS + kk) / 8u, ROW_V, false); \
            const uint xAt = X_BASE + buf * X_TILE + kk / 8u; \
            CM_STEP_J(0) CM_STEP_J(1) CM_STEP_J(2) CM_STEP_J(3) CM_STEP_J(4) CM_STEP_J(5) CM_STEP_J(6) CM_STEP_J(7) \
        } }
#if CM_LOAD_AHEAD == 2
    // Steps two at a time, so that each uses its register set by a constant index (kept in registers).
    if (uBegin < uEnd) loadStep(uBegin, 0u);
    if (uBegin + 1u < uEnd) loadStep(uBegin + 1u, 1u);
    for (uint u = uBegin; u < uEnd; u += 2u) {
        CM_TILE_STEP(u, 0u)
        if (u + 1u < uEnd) CM_TILE_STEP(u + 1u, 1u)  // uniform
    }
#else
    if (uBegin < uEnd) loadStep(uBegin);
    for (uint u = uBegin; u < uEnd; u++) CM_TILE_STEP(u, 0u)
#endif
    barrier();  // the C tile reuses the weight tiles
    // C (rows x n) column-major: element (row, n) at n * CS + row
    CM_STORE_J(0) CM_STORE_J(1) CM_STORE_J(2) CM_STORE_J(3) CM_STORE_J(4) CM_STORE_J(5) CM_STORE_J(6) CM_STORE_J(7)
    barrier();
}
#endif
