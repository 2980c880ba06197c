#version 450
// dec_gemm_ggml: y[s, o] = sum_i W[o, i] * x[s, i] for a prompt chunk of S tokens (any S: the grid's
// y covers ceil(S / 64) token tiles), W a [O][I] tensor of a GGML block type (FORMAT: ggml_blocks.glsl's
// GGML_FMT_*, as dec_gemv_ggml) in the GGUF file's own layout from byte blockOffset; x f32 [S][I] at
// xOffset, y f32 [S][O] at yOffset. dec_gemm_quant's tiling for GGML blocks: one workgroup of 128
// threads per tile of BM = 32 rows x BN = 64 tokens walks the row one 32-weight slice at a time
// (ggml_blocks.glsl: 16 consecutive quant bytes, two runs of 16 columns c0.. and c0 + GAP..), the
// weight tile dequantized to f32 in shared memory once for all 64 tokens and the x tile (the slice's
// 32 columns, in the slice's order) once for all 32 rows; each thread then accumulates a 4 x 4
// (rows x tokens) register tile with f32 fma. Every row of the tile takes the same slice index per
// step, so one x tile serves them all. The GEMV reads each weight once per few tokens; this once per 64.
//
// Weights: ggml_slice + ggml_slice_weights as they are (`precise`: GGML's values bit for bit). Threads
// 0..31 (one subgroup on NVIDIA: no divergence) each dequantize one row's slice a step, all 128 load
// x; the extra dequant work is small next to 32 x 16 fma a thread a step, and other workgroups on the
// SM fill the wait at the barrier. The next step's block words and x are loaded into registers while
// the current step computes (as dec_gemm_quant: with a barrier per step, a load issued only after it
// stalls every step). Rows past O read row O-1 and tokens past S read x as 0: computed, never stored.
// I is a multiple of the block's elements (no column tail); xOffset % 4 == 0 (vec4 loads only, as
// dec_gemv_ggml); blockOffset as dec_gemv_ggml's (16 bytes of readable slack past the last block).
//
// Split over the columns (pc.splits > 1, grid z = splits), as dec_gemm_quant: a matrix of few rows
// (o_proj: 2048 rows, 64 tiles a chunk) leaves most of a GPU's cores idle, so each tile's row is cut
// into runs of pc.splitCols columns (whole blocks), one workgroup each, ended by gemm_split.glsl.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_*

const uint BM = 32u;  // rows per workgroup
const uint BN = 64u;  // tokens per workgroup
const uint BK = 32u;  // columns per step: one slice

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
    uint splits;       // column runs a tile is split into (grid z); 1: no split
    uint splitCols;    // columns a run, a multiple of the block's elements
} pc;

#define GGML_WORD(i) wb[i]
#define GGML_VEC4(i) wv[i]
#include "ggml_blocks.glsl"
// split runs only: partial tiles and arrival words
#define SPLIT_PART_BINDING 3
#define SPLIT_ARRIVED_BINDING 4
#include "gemm_split.glsl"

const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT);  // columns from a slice's first run to its second

// [slice column][row / 4] and [slice column][token / 4]: the compute loop reads one vec4 of each per column
shared vec4 wTile[BK][BM / 4u];
shared vec4 xTile[BK][BN / 4u];

// The next step's inputs (threads 0..31: one row's slice, quants and scales; every thread: 4 x vec4s)
uvec4 nextQ0, nextQ1;
vec2 nextD, nextM;
vec4 nextX[4];

void loadStep(uint u, uint rowAddr, uint tokBase, bool dequantizer) {
    const uint t = gl_LocalInvocationIndex;
    const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
    if (dequantizer) ggml_slice(FORMAT, rowAddr + blk * BLOCK_BYTES, s, nextQ0, nextQ1, nextD, nextM);
    const uint c0 = blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s);
    // x: 64 tokens x the slice's 32 columns (8 vec4s a token: 4 of run 0, then 4 of run 1), 4 a thread
    [[unroll]] for (uint m = 0u; m < 4u; m++) {
        const uint e = t + 128u * m;
        const uint tok = e / 8u, v = e % 8u;
        const uint col = c0 + (v / 4u) * GAP + (v % 4u) * 4u;
        const uint sIdx = tokBase + tok;
        nextX[m] = sIdx < pc.S ? xv[(pc.xOffset + sIdx * pc.I + col) >> 2u] : vec4(0.0);
    }
}

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBase = gl_WorkGroupID.x * BM;
    const uint tokBase = gl_WorkGroupID.y * BN;
    const uint ty = t / 16u, tx = t % 16u;  // this thread's rows ty*4.., tokens tx*4..
    const bool dequantizer = t < BM;         // thread t < 32 dequantizes row rowBase + t
    const uint rowBytes = (pc.I / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint rowAddr = pc.blockOffset + min(rowBase + t % BM, pc.O - 1u) * rowBytes;
    // this workgroup's run of slices (all of them without a split)
    const uint uBegin = gl_WorkGroupID.z * (pc.splitCols / 32u);
    const uint uEnd = min(pc.I / 32u, uBegin + pc.splitCols / 32u);
    float acc[4][4];
    [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;

    if (uBegin < uEnd) loadStep(uBegin, rowAddr, tokBase, dequantizer);  // uniform
    for (uint u = uBegin; u < uEnd; u++) {
        if (dequantizer) {
            float w[32];
            ggml_slice_weights(FORMAT, nextQ0, nextQ1, nextD, nextM, w);
            [[unroll]] for (uint k = 0u; k < BK; k++) wTile[k][t / 4u][t % 4u] = w[k];
        }
        [[unroll]] for (uint m = 0u; m < 4u; m++) {
            const uint e = t + 128u * m;
            const uint tok = e / 8u, c = (e % 8u) * 4u;
            [[unroll]] for (uint q = 0u; q < 4u; q++) xTile[c + q][tok / 4u][tok % 4u] = nextX[m][q];
        }
        barrier();
        if (u + 1u < uEnd) loadStep(u + 1u, rowAddr, tokBase, dequantizer);
        // a thread whose 4 tokens all lie past S skips the products: on a CPU device (SIMD across
        // invocations, 8 of them a vector) half the tile's lanes for S <= 32; a GPU loses nothing
        if (tokBase + tx * 4u < pc.S) {
            [[unroll]] for (uint k = 0u; k < BK; k++) {
                const vec4 a = wTile[k][ty];
                const vec4 b = xTile[k][tx];
                [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);
            }
        }
        barrier();
    }
    if (pc.splits > 1u) {  // uniform
        if (!lastSplit(acc, pc.splits)) return;
    }
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        const uint s = tokBase + tx * 4u + j;
        if (s >= pc.S) continue;
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            const uint row = rowBase + ty * 4u + i;
            if (row < pc.O) yb[pc.yOffset + s * pc.O + row] = acc[i][j];
        }
    }
}
