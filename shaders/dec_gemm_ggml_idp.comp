#version 450
// dec_gemm_ggml_idp: the integer-dot path of dec_gemm_ggml. y[s, o] = sum_i W[o, i] * x[s, i] for a
// prompt chunk of S tokens (any S: the grid's y covers ceil(S / 64) token tiles), W a [O][I] tensor
// of a GGML block type (FORMAT, GGML_FMT_*) in the file's own layout from byte blockOffset, x given
// as dec_gemv_ggml_idp takes it: quantize_act's output with GROUP_SIZE 16, int8 xq [S][I] (I/16
// uvec4 a row), f32 power-of-two scales and int sums of the q per 16 columns (xscale, xsum
// [S][I/16]); y f32 [S][O] at yOffset.
//
// dec_gemm_ggml's tiling: one workgroup of 128 threads per tile of BM = 32 rows x BN = 64 tokens
// walks the row by 32-weight slices (ggml_blocks.glsl: two runs of 16 columns, c0.. and c0 + GAP..).
// Threads 0..31 each read one row's slice (ggml_slice: the runs' unsigned quant bytes, d, m)
// into shared memory as it is, no weights formed; every thread reads one (token, run) of x: its 16
// int8 q, scale and sum. Each thread then accumulates a 4 x 4 (rows x tokens) register tile; per
// (row, token, run), exactly dec_gemv_ggml_idp's formula:
//   dot = 4 OpSUDot (signed x bytes, unsigned weight bytes, exact int32) - OFF * xsum
//   acc = fma(xs, fma(d, float(dot), m * float(xsum)), acc)
// OFF (Q5_0 16, Q6_K 32) and the min m (Q4_1, Q5_1, Q4_K, Q5_K) never occur together, so each
// format keeps one of the two terms (m == 0 makes the other d * float(dot), the same value). float(dot)
// costs no int->float conversion (a quarter-rate instruction on NVIDIA, one per 4 dot products here):
// the dot products accumulate onto the bits of 1.5 * 2^23 (minus OFF * xsum, formed once per token
// and run at staging), read back as a float minus 1.5 * 2^23, exact for |dot| < 2^22 (|dot| <= 16 *
// 127 * 63 + 32 * 2032 here).
//
// A step takes STEP slices (spec constant 1, default 1) between its two barriers; the next step's
// slice words and x are loaded into registers while the current step computes (as dec_gemm_ggml:
// with a barrier per step, a load issued only after it stalls every step). A step of one slice holds
// half the arithmetic of dec_gemm_ggml's between its barriers, and the grids of a 64-token chunk are
// at most about one workgroup an SM on a big GPU: STEP 2 or 4 gives the loads longer to arrive and
// halves or quarters the barriers (bench-gemv.ts --gemm-idp times each). Slices past the run's last
// read as zeros. Rows past O read row O-1 and tokens past S read x as 0 (q 0, scale 0): computed,
// never stored. I is a multiple of the block's elements; blockOffset as dec_gemv_ggml's (16 bytes of
// readable slack past the last block). Shared memory 4.5 KiB a slice of the step.
//
// Split over the columns (pc.splits > 1, grid z = splits), as dec_gemm_ggml: each tile's row is cut
// into runs of pc.splitCols columns (whole blocks), one workgroup each walking its run's slices by
// steps (the last step's surplus slices read as zeros), ended by gemm_split.glsl.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_spirv_intrinsics : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint FORMAT = 3u;  // GGML_FMT_*
layout(constant_id = 1) const uint STEP = 1u;    // slices a step (between two barriers), 1..4

const uint BM = 32u;  // rows per workgroup
const uint BN = 64u;  // tokens per workgroup

// OpSUDot (SPV_KHR_integer_dot_product) as gemv_idp.glsl declares it: capabilities DotProduct
// (6019), DotProductInput4x8BitPacked (6018); last operand PackedVectorFormat4x8Bit (0).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4x8(uint a, uint b, spirv_literal int packedFormat);  // signed a x unsigned b

layout(std430, binding = 0) readonly restrict buffer WB { uint wb[]; };
layout(std430, binding = 0) readonly restrict buffer WV { uvec4 wv[]; };
layout(std430, binding = 1) readonly restrict buffer XQ { uvec4 xq[]; };
layout(std430, binding = 2) readonly restrict buffer XSC { float xscale[]; };
layout(std430, binding = 3) readonly restrict buffer XSU { int xsum[]; };
layout(std430, binding = 4) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;            // a multiple of the block's elements
    uint S;
    uint blockOffset;  // bytes
    uint yOffset;      // floats
    uint splits;       // column runs a tile is split into (grid z); 1: no split
    uint splitCols;    // columns a run, a multiple of the block's elements
} pc;

#define GGML_WORD(i) wb[i]
#define GGML_VEC4(i) wv[i]
#include "ggml_blocks.glsl"
// split runs only: partial tiles and arrival words
#define SPLIT_PART_BINDING 5
#define SPLIT_ARRIVED_BINDING 6
#include "gemm_split.glsl"

const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT) / 16u;  // x groups from a slice's first run to its second
const int OFF = int(GGML_SLICE_OFFSET(FORMAT));
const bool MINS = OFF == 0;      // Q4_1, Q5_1, Q4_K, Q5_K: a min per run, no offset

// the tile's hooks (gemm_idp_tile.glsl): a row by its byte address, slice u in block u / SLICES_PER_BLOCK
uint rowHandle(uint row) { return pc.blockOffset + row * (pc.I / BLOCK_ELEMENTS) * BLOCK_BYTES; }
void loadSlice(uint rowAddr, uint u, out uvec4 q0, out uvec4 q1, out vec2 d, out vec2 m) {
    ggml_slice(FORMAT, rowAddr + (u / SLICES_PER_BLOCK) * BLOCK_BYTES, u % SLICES_PER_BLOCK, q0, q1, d, m);
}
uint sliceGroup(uint u) { return ((u / SLICES_PER_BLOCK) * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, u % SLICES_PER_BLOCK)) >> 4u; }

#include "gemm_idp_tile.glsl"
