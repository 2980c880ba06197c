// moe_ggml_cm.glsl: the body of moe_ggml_cm.comp and moe_ggml_cm_emu.comp (the test variant: CM_EMULATE).
// moe_ggml_cm: moe_ggml_rows (a prompt chunk's experts, lists grouped by expert, GGML blocks as the
// file holds them) on the matrix cores. Why: the rows kernels pay every product on the ALUs and
// decode an expert's weights once per few slots, so their time grows with the slots; here a
// workgroup decodes a weight slice once for BN slots and the products are the matrix cores'.
//
// A workgroup: 128 threads (4 subgroups of 32: the device decision asks for subgroups of 32), a tile
// of BM = 128 weight rows x BN slots of one work item, steps of BK = 32 columns. GATEUP: the tile's
// rows are 64 gate rows then the same 64 up rows (one pass gives both, and the epilogue forms
// silu(gate) * up), so a workgroup owns 64 output rows; down: 128 output rows. Each step every
// thread decodes one row's 32-weight slice (ggml_blocks.glsl: GGML's weights, rounded to f16 for
// the products) and the threads convert the slots' 32 input columns to f16; the next step's loads
// are issued before this step's products, and the shared tiles are double-buffered, so a step has
// one barrier. Subgroup g computes weight rows 32g.. x all BN slots: 2 x BN/8 accumulators of the
// 16 x 8 x 16 f16 -> f32 shape. Items of more than BN slots are walked BN at a time.
//
// Same bindings, work list and outputs as moe_ggml_rows: GATEUP: h[slot][row] = silu(gate x) * (up x),
// x[token = slot / K]; else ypair[slot][row] = slot weight * (down h[slot]). Workgroup (x, y) = (row
// tile, work item y). Rows past O read row O - 1 and slots past the item's count read 0 (computed,
// not stored). Weights and x become f16 (the products' inputs; the sums are f32), as llama.cpp's
// matrix-core GEMM does: |x| past 65504 would overflow. CM_EMULATE replaces the matrix products
// with plain sums over the same tiles.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifndef CM_EMULATE
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_* of this mode's matrices
layout(constant_id = 1) const bool GATEUP = true;
layout(constant_id = 2) const uint BN = 8u;      // slots a tile: 8, 16, 32 or 64

layout(std430, binding = 0) readonly restrict buffer XV { vec4 xv[]; };  // x [S][D] or h [slots][I]
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) readonly restrict buffer PR { uint pairs[]; };
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; };  // h [slots][I] or ypair [slots][D]
layout(std430, binding = 4) readonly restrict buffer SW { float slotWeight[]; };
layout(std430, binding = 5) readonly restrict buffer EB { uint eb[]; };
layout(std430, binding = 5) readonly restrict buffer EV { uvec4 ev[]; };
layout(std430, binding = 6) readonly restrict buffer ET { uvec4 expertTable[]; };

layout(push_constant, std430) uniform PC {
    uint O;     // rows: I (gate+up) or D (down)
    uint cols;  // D (gate+up) or I (down); a multiple of the block's elements
} pc;

#define GGML_WORD(i) eb[i]
#define GGML_VEC4(i) ev[i]
#include "ggml_blocks.glsl"

const uint BM = 128u;                      // weight rows a tile
const uint OUT_ROWS = GATEUP ? 64u : 128u;  // output rows a tile
const uint BK = 32u;                       // columns a step
const uint LDS = BK + 8u;                  // f16 stride of a tile row: 80 bytes (16-byte multiple, staggers the banks)
const uint ROW_V = LDS / 8u;               // uvec4s a tile row
const uint W_TILE = BM * ROW_V;            // uvec4s of one weight tile
const uint X_TILE = BN * ROW_V;            // uvec4s of one x tile
const uint X_VECS = BN * 8u;               // vec4s of x a step (BN slots x 32 columns)
const uint X_PER_THREAD = (X_VECS + 127u) / 128u;
const uint CS = BM;                        // f32 stride of the C tile ([slot][row])
const uint C_TILE = BN * CS / 4u;          // uvec4s of the C tile
// Shared memory, uvec4s (cooperative loads need 16-byte aligned starts: NVIDIA's 580 driver placed
// an array of a smaller type 4 bytes off): two weight tiles, then two x tiles; the C tile reuses the
// weight tiles' space once the steps are done (sized for the larger of the two).
const uint W_SPACE = 2u * W_TILE > C_TILE ? 2u * W_TILE : C_TILE;
shared uvec4 tiles[W_SPACE + 2u * X_TILE];
const uint X_BASE = W_SPACE;
#define WORD(i) tiles[(i) >> 2u][(i) & 3u]
#define X2(buf, slot, k) WORD(4u * (X_BASE + (buf) * X_TILE) + ((slot) * LDS + (k)) / 2u)
#define CT(row, slot) uintBitsToFloat(WORD((slot) * CS + (row)))

shared uint slotOf[64];  // the tile's slots (pairs[]), past the item's count: NO_SLOT
const uint NO_SLOT = 0xffffffffu;

const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT);  // columns from a slice's first run to its second

// This thread's weight row (its address, the matrix's row start) and the next step's loads.
uint rowAddr;
uvec4 nextQ0, nextQ1;
vec2 nextD, nextM;
vec4 nextX[X_PER_THREAD];
uint xRow[X_PER_THREAD];  // first float of the slot's input row for x vec4 m of this thread, NO_SLOT: 0

void loadStep(uint u) {
    const uint t = gl_LocalInvocationIndex;
    const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
    ggml_slice(FORMAT, rowAddr + blk * BLOCK_BYTES, s, nextQ0, nextQ1, nextD, nextM);
    const uint c0 = blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s);
    [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
        const uint e = t + 128u * m, v = e % 8u;
        const uint col = c0 + (v / 4u) * GAP + (v % 4u) * 4u;
        nextX[m] = xRow[m] != NO_SLOT ? xv[(xRow[m] + col) >> 2u] : vec4(0.0);
    }
}

void storeStep(uint buf) {
    const uint t = gl_LocalInvocationIndex;
    float w[32];
    ggml_slice_weights(FORMAT, nextQ0, nextQ1, nextD, nextM, w);
    const uint at = buf * W_TILE + t * ROW_V;
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        tiles[at + j] = uvec4(packHalf2x16(vec2(w[8u * j], w[8u * j + 1u])), packHalf2x16(vec2(w[8u * j + 2u], w[8u * j + 3u])),
                              packHalf2x16(vec2(w[8u * j + 4u], w[8u * j + 5u])), packHalf2x16(vec2(w[8u * j + 6u], w[8u * j + 7u])));
    }
    [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
        const uint e = t + 128u * m;
        if (e < X_VECS) {
            const uint slot = e / 8u, k = (e % 8u) * 4u;
            X2(buf, slot, k) = packHalf2x16(nextX[m].xy);
            X2(buf, slot, k + 2u) = packHalf2x16(nextX[m].zw);
        }
    }
}

#ifdef CM_EMULATE
// Test hook: thread t's values are C elements t + 128 e ([slot][row] order), plain f32 sums of the
// f16 tiles.
const uint VALUES = BN;  // BM * BN / 128
float emu[VALUES];

void tileSteps(uint steps) {
    const uint t = gl_LocalInvocationIndex;
    [[unroll]] for (uint e = 0u; e < VALUES; e++) emu[e] = 0.0;
    loadStep(0u);
    for (uint u = 0u; u < steps; u++) {
        const uint buf = u & 1u;
        storeStep(buf);
        barrier();
        if (u + 1u < steps) loadStep(u + 1u);
        for (uint e = 0u; e < VALUES; e++) {
            const uint idx = e * 128u + t, row = idx % BM, slot = idx / BM;
            float acc = 0.0;
            for (uint k = 0u; k < BK; k += 2u) {
                const vec2 w = unpackHalf2x16(WORD(4u * (buf * W_TILE) + (row * LDS + k) / 2u));
                const vec2 x = unpackHalf2x16(X2(buf, slot, k));
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
// be kept in memory): c<i><j> rows r0 + 16 i, slots 8 j; those past BN are never used (the
// specialization constant removes them).
#define CM_STEP_J(j) if (BN > 8u * j) { \
        CM_B b; coopMatLoadNV(b, tiles, xAt + (8u * j * LDS) / 8u, ROW_V, true); \
        c0##j = coopMatMulAddNV(a0, b, c0##j); c1##j = coopMatMulAddNV(a1, b, c1##j); }
#define CM_STORE_J(j) if (BN > 8u * j) { \
        coopMatStoreNV(c0##j, tiles, (8u * j * CS + r0) / 4u, CS / 4u, true); \
        coopMatStoreNV(c1##j, tiles, (8u * j * CS + r0 + 16u) / 4u, CS / 4u, true); }

void tileSteps(uint steps) {
    const uint r0 = gl_SubgroupID * 32u;
    CM_C c00 = CM_C(0.0), c01 = CM_C(0.0), c02 = CM_C(0.0), c03 = CM_C(0.0), c04 = CM_C(0.0), c05 = CM_C(0.0), c06 = CM_C(0.0), c07 = CM_C(0.0);
    CM_C c10 = CM_C(0.0), c11 = CM_C(0.0), c12 = CM_C(0.0), c13 = CM_C(0.0), c14 = CM_C(0.0), c15 = CM_C(0.0), c16 = CM_C(0.0), c17 = CM_C(0.0);
    loadStep(0u);
    for (uint u = 0u; u < steps; u++) {
        const uint buf = u & 1u;
        // The buffer written here was last read two steps ago, before the previous step's barrier.
        storeStep(buf);
        barrier();
        if (u + 1u < steps) loadStep(u + 1u);
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
            CM_A a0, a1;
            coopMatLoadNV(a0, tiles, buf * W_TILE + (r0 * LDS + kk) / 8u, ROW_V, false);
            coopMatLoadNV(a1, tiles, buf * W_TILE + ((r0 + 16u) * LDS + kk) / 8u, ROW_V, false);
            const uint xAt = X_BASE + buf * X_TILE + kk / 8u;
            CM_STEP_J(0) CM_STEP_J(1) CM_STEP_J(2) CM_STEP_J(3) CM_STEP_J(4) CM_STEP_J(5) CM_STEP_J(6) CM_STEP_J(7)
        }
    }
    barrier();  // the C tile reuses the weight tiles
    // C (rows x slots) column-major: element (row, slot) at slot * CS + row
    CM_STORE_J(0) CM_STORE_J(1) CM_STORE_J(2) CM_STORE_J(3) CM_STORE_J(4) CM_STORE_J(5) CM_STORE_J(6) CM_STORE_J(7)
    barrier();
}
#endif

void main() {
    const uint t = gl_LocalInvocationIndex;
    // The grid may cover more items than the list holds (sized before dec_group_experts counts them).
    if (gl_WorkGroupID.y >= work[0].z) return;  // uniform
    const uvec4 item = work[1u + gl_WorkGroupID.y];
    if (item.x >= uint(expertTable.length())) return;  // no expert (NaN logits): moe_sum skips its slots
    const uint K = work[0].y;
    const uint rowBase = gl_WorkGroupID.x * OUT_ROWS;
    const uvec4 offs = expertTable[item.x];
    // this thread's weight row: GATEUP threads 0..63 the gate rows, 64..127 the up rows
    const uint matrix = GATEUP ? (t < 64u ? offs.x : offs.y) : offs.z;
    const uint row = min(rowBase + (GATEUP ? t % 64u : t), pc.O - 1u);
    rowAddr = matrix + row * (pc.cols / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint steps = pc.cols / BK;
    for (uint p0 = 0u; p0 < item.w; p0 += BN) {
        if (p0 > 0u) barrier();  // the last tile's epilogue read slotOf and the C tile
        if (t < BN) slotOf[t] = p0 + t < item.w ? pairs[item.z + p0 + t] : NO_SLOT;
        barrier();
        [[unroll]] for (uint m = 0u; m < X_PER_THREAD; m++) {
            const uint e = t + 128u * m;
            const uint slot = e < X_VECS ? slotOf[e / 8u] : NO_SLOT;
            xRow[m] = slot == NO_SLOT ? NO_SLOT : (GATEUP ? slot / K : slot) * pc.cols;
        }
        tileSteps(steps);
        // value idx of the tile's OUT_ROWS x BN outputs: row idx % OUT_ROWS, slot idx / OUT_ROWS
        for (uint idx = t; idx < OUT_ROWS * BN; idx += 128u) {
            const uint r = idx % OUT_ROWS, n = idx / OUT_ROWS;
            const uint slot = slotOf[n];
            if (rowBase + r < pc.O && slot != NO_SLOT) {
                float v;
                if (GATEUP) {
                    const float g = CT(r, n);
                    v = g / (1.0 + exp(-g)) * CT(64u + r, n);
                } else {
                    v = slotWeight[slot] * CT(r, n);
                }
                yb[slot * pc.O + rowBase + r] = v;
            }
        }
    }
}
