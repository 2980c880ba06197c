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
const int MAGIC = 0x4B400000;    // the bits of 1.5 * 2^23
const float MAGIC_F = 12582912.0;

// Indexed so that the compute loop's reads are conflict-free: row r = 4 ty + i at [i][ty], token
// s = 4 tx + j at [j][tx] (a subgroup's 16 tx read 16 consecutive uvec4; its ty are broadcasts).
shared uvec4 wQuant[STEP * 2u * BM];  // [slice][run][i][ty]: the run's 16 quant bytes
shared vec4 wScale[STEP * BM];        // [slice][i][ty]: (d0, d1, m0, m1)
shared uvec4 xQuant[STEP * 2u * BN];  // [slice][run][j][tx]: the run's 16 x bytes
shared uvec4 xScale[STEP * BN];       // [slice][j][tx]: bits of (xs0, xs1, e0, e1), e float(xsum) (MINS) or MAGIC - OFF * xsum

// The next step's inputs (threads 0..31: one row's slices; every thread: one token's run of x a slice)
uvec4 nextQ0[STEP], nextQ1[STEP];
vec2 nextD[STEP], nextM[STEP];
uvec4 nextX[STEP];
float nextXs[STEP];
int nextXsum[STEP];

// Slices uBegin + step * STEP ..; one at or past uEnd (the run's end) reads as zeros (weights 0, x 0: adds 0).
void loadStep(uint step, uint uBegin, uint uEnd, uint rowAddr, uint tok, uint run, uint groups, bool dequantizer) {
    [[unroll]] for (uint k = 0u; k < STEP; k++) {
        const uint u = uBegin + step * STEP + k;
        const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
        const bool live = u < uEnd;  // uniform
        nextQ0[k] = uvec4(0u), nextQ1[k] = uvec4(0u), nextD[k] = vec2(0.0), nextM[k] = vec2(0.0);
        if (dequantizer && live) ggml_slice(FORMAT, rowAddr + blk * BLOCK_BYTES, s, nextQ0[k], nextQ1[k], nextD[k], nextM[k]);
        const uint at = tok * groups + ((blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s)) >> 4u) + run * GAP;
        const bool x = live && tok < pc.S;
        nextX[k] = x ? xq[at] : uvec4(0u);
        nextXs[k] = x ? xscale[at] : 0.0;
        nextXsum[k] = x ? xsum[at] : 0;
    }
}

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBase = gl_WorkGroupID.x * BM;
    const uint tokBase = gl_WorkGroupID.y * BN;
    const uint ty = t / 16u, tx = t % 16u;  // this thread's rows ty*4.., tokens tx*4..
    const bool dequantizer = t < BM;         // thread t < 32 reads row rowBase + t's slices
    const uint rowBytes = (pc.I / BLOCK_ELEMENTS) * BLOCK_BYTES;
    const uint rowAddr = pc.blockOffset + min(rowBase + t % BM, pc.O - 1u) * rowBytes;
    // this workgroup's run of slices (all of them without a split)
    const uint uBegin = gl_WorkGroupID.z * (pc.splitCols / 32u);
    const uint uEnd = min(pc.I / 32u, uBegin + pc.splitCols / 32u);
    const uint steps = uBegin < uEnd ? (uEnd - uBegin + STEP - 1u) / STEP : 0u;
    const uint groups = pc.I / 16u;          // x groups a token (also its xq row in uvec4s)
    const uint xTok = t % BN, xRun = t / BN; // the (token, run) of x this thread stages
    const uint xSlot = (xTok % 4u) * (BN / 4u) + xTok / 4u;
    const uint wSlot = (t % 4u) * (BM / 4u) + (t % BM) / 4u;
    float acc[4][4];
    [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;

    if (steps > 0u) loadStep(0u, uBegin, uEnd, rowAddr, tokBase + xTok, xRun, groups, dequantizer);  // uniform
    for (uint step = 0u; step < steps; step++) {
        [[unroll]] for (uint k = 0u; k < STEP; k++) {
            if (dequantizer) {
                wQuant[(2u * k) * BM + wSlot] = nextQ0[k];
                wQuant[(2u * k + 1u) * BM + wSlot] = nextQ1[k];
                wScale[k * BM + wSlot] = vec4(nextD[k], nextM[k]);
            }
            xQuant[(2u * k + xRun) * BN + xSlot] = nextX[k];
            xScale[k * BN + xSlot][xRun] = floatBitsToUint(nextXs[k]);
            xScale[k * BN + xSlot][2u + xRun] = MINS ? floatBitsToUint(float(nextXsum[k])) : uint(MAGIC - OFF * nextXsum[k]);
        }
        barrier();
        if (step + 1u < steps) loadStep(step + 1u, uBegin, uEnd, rowAddr, tokBase + xTok, xRun, groups, dequantizer);
        // a thread whose 4 tokens all lie past S skips the products (as dec_gemm_ggml: a CPU device
        // runs invocations as SIMD lanes; a GPU loses nothing)
        if (tokBase + tx * 4u < pc.S) {
            [[unroll]] for (uint k = 0u; k < STEP; k++) {
                uvec4 xs[4];
                vec4 dm[4];
                [[unroll]] for (uint j = 0u; j < 4u; j++) xs[j] = xScale[k * BN + j * (BN / 4u) + tx];
                [[unroll]] for (uint i = 0u; i < 4u; i++) dm[i] = wScale[k * BM + i * (BM / 4u) + ty];
                [[unroll]] for (uint run = 0u; run < 2u; run++) {
                    uvec4 a[4];
                    [[unroll]] for (uint j = 0u; j < 4u; j++) a[j] = xQuant[(2u * k + run) * BN + j * (BN / 4u) + tx];
                    [[unroll]] for (uint i = 0u; i < 4u; i++) {
                        const uvec4 w = wQuant[(2u * k + run) * BM + i * (BM / 4u) + ty];
                        [[unroll]] for (uint j = 0u; j < 4u; j++) {
                            int c = MINS ? MAGIC : int(xs[j][2u + run]);
                            c += sudot4x8(a[j].x, w.x, 0);
                            c += sudot4x8(a[j].y, w.y, 0);
                            c += sudot4x8(a[j].z, w.z, 0);
                            c += sudot4x8(a[j].w, w.w, 0);
                            precise float dot = intBitsToFloat(c) - MAGIC_F;  // float(dot - OFF * xsum), exact
                            const float inner = MINS ? fma(dm[i][run], dot, dm[i][2u + run] * uintBitsToFloat(xs[j][2u + run])) : dm[i][run] * dot;
                            acc[i][j] = fma(uintBitsToFloat(xs[j][run]), inner, acc[i][j]);
                        }
                    }
                }
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
