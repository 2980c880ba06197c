// gemv_idp.glsl: integer-dot-product GEMV body.  Activations were quantized per group by
// quantize_act.comp (int8, power-of-two scale, group sum); weights are q8 or q4.
//   y[s,o] = sum_g xscale(s,g) * wscale(o,g) * idot_g
// idot is exact int32: OpSDot (q8) / OpSUDot (signed activations x unsigned q4 nibbles,
// minus 8 * xsum per group).  The including .comp defines QBITS (4 or 8).
#extension GL_EXT_spirv_intrinsics : require
#extension GL_EXT_control_flow_attributes : require

#if QBITS == 4
const uint COLS_PER_VEC = 32u;
#elif QBITS == 8
const uint COLS_PER_VEC = 16u;
#else
#error "QBITS must be 4 or 8"
#endif

#define NMAT 1u
#include "common.glsl"

// Tokens per register chunk: 0 (default) = min(8, max(1, 16 / rows per thread)).
layout(constant_id = 7) const uint TOKENS_ = 0u;
const uint TOKENS_AUTO = (NV >= 16u) ? 1u : ((NV >= 2u) ? (16u / NV) : 8u);
const uint NT = (TOKENS_ == 0u) ? TOKENS_AUTO : TOKENS_;

// SPV_KHR_integer_dot_product through GL_EXT_spirv_intrinsics (glslang 12 has no
// GL_EXT_integer_dot_product).  Capabilities: DotProduct (6019), DotProductInput4x8BitPacked
// (6018).  Last operand: PackedVectorFormat4x8Bit (0).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packedFormat);   // OpSDot: signed x signed
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4x8(uint a, uint b, spirv_literal int packedFormat);  // OpSUDot: signed a x unsigned b

layout(std430, binding = 0) readonly restrict buffer WB { uvec4 wq[]; };
layout(std430, binding = 1) readonly restrict buffer WS { uint wscale[]; };
layout(std430, binding = 2) readonly restrict buffer XQ { uvec4 xq[]; };
layout(std430, binding = 3) readonly restrict buffer XSC { float xscale[]; };
layout(std430, binding = 4) readonly restrict buffer XSU { int xsum[]; };
layout(std430, binding = 5) writeonly restrict buffer YB { float yb[]; };
layout(push_constant, std430) uniform PC {
    uint O;
    uint I;
    uint S;
    uint rowWords;
    uint groupsPerRow;
    uint weightOffset;  // uvec4 units
    uint scaleOffset;   // words
    uint xqRowWords;    // words per token row of xq (multiple of 4)
    uint yOffset;       // floats
} pc;

float acc[NV][NT];
uint wRow[RPT];
uint sRow[RPT];
uint tok0;
uint nt;

// One column step: uvec4 column c of every owned row, all tokens of the chunk.
// tail: last step (only matters for q4, whose second xq half may lie past the row).
void colStep(uint c, bool tail) {
    const uint g = (c * COLS_PER_VEC) / GROUP_SIZE;  // a uvec4 never straddles a group
    uvec4 w[RPT];
    float sc[RPT];
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        w[r] = wq[wRow[r] + c];
        sc[r] = LOAD_SCALE(wscale, pc.scaleOffset, sRow[r] + g);
    }
#if QBITS == 4
    uvec4 lo[RPT], hi[RPT];
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        lo[r] = w[r] & 0x0F0F0F0Fu;          // cols 8k..8k+3 of word k, unsigned 0..15
        hi[r] = (w[r] >> 4u) & 0x0F0F0F0Fu;  // cols 8k+4..8k+7
    }
    // the first uvec4 of each group subtracts 8 * (sum of that group's activations)
    const bool groupHead = (c % (GROUP_SIZE / COLS_PER_VEC)) == 0u;
    const bool hiValid = !tail || (c * 32u + 16u < pc.I);
#endif
    const uint xqRowVec = pc.xqRowWords >> 2u;
    [[unroll]] for (uint j = 0u; j < NT; ++j) {
        if (j < nt) {
            const uint tok = tok0 + j;
            const float xs = xscale[tok * pc.groupsPerRow + g];
#if QBITS == 8
            const uvec4 a = xq[tok * xqRowVec + c];
            [[unroll]] for (uint r = 0u; r < RPT; ++r) {
                int d = sdot4x8(a.x, w[r].x, 0);
                d += sdot4x8(a.y, w[r].y, 0);
                d += sdot4x8(a.z, w[r].z, 0);
                d += sdot4x8(a.w, w[r].w, 0);
                acc[r][j] = fma(float(d), sc[r] * xs, acc[r][j]);
            }
#else
            const uvec4 a = xq[tok * xqRowVec + 2u * c];  // xq words 8c .. 8c+3
            const uvec4 b = hiValid ? xq[tok * xqRowVec + 2u * c + 1u] : uvec4(0u);
            const int corr = groupHead ? 8 * xsum[tok * pc.groupsPerRow + g] : 0;
            [[unroll]] for (uint r = 0u; r < RPT; ++r) {
                // weight word k covers xq words 2k (low nibbles) and 2k+1 (high nibbles)
                int d = sudot4x8(a.x, lo[r].x, 0);
                d += sudot4x8(a.y, hi[r].x, 0);
                d += sudot4x8(a.z, lo[r].y, 0);
                d += sudot4x8(a.w, hi[r].y, 0);
                d += sudot4x8(b.x, lo[r].z, 0);
                d += sudot4x8(b.y, hi[r].z, 0);
                d += sudot4x8(b.z, lo[r].w, 0);
                d += sudot4x8(b.w, hi[r].w, 0);
                acc[r][j] = fma(float(d - corr), sc[r] * xs, acc[r][j]);
            }
#endif
        }
    }
}

void main() {
    const uint rowBase = workgroupIndex() * ROWS_PER_WG;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform

    const uint t = logicalThread();
    const uint cl = t % COL_THREADS;
    const uint rg = (t / COL_THREADS) % ROW_LANES;
    const uint ks = t / (COL_THREADS * ROW_LANES);
    const uint c0 = ks * COL_THREADS + cl;

    const uint rowVec = pc.rowWords >> 2u;
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        const uint row = min(rowBase + r * ROW_LANES + rg, pc.O - 1u);
        wRow[r] = pc.weightOffset + row * rowVec;
        sRow[r] = row * pc.groupsPerRow;
    }

    // xq padding columns (>= I, inside the row) are 0, so every step but q4's second half of
    // the last one is safe without a guard
    const uint nVec = (pc.I + COLS_PER_VEC - 1u) / COLS_PER_VEC;
    const uint nFull = pc.I / COLS_PER_VEC;

    for (tok0 = 0u; tok0 < pc.S; tok0 += NT) {
        nt = min(NT, pc.S - tok0);
        [[unroll]] for (uint i = 0u; i < NV; ++i)
            [[unroll]] for (uint j = 0u; j < NT; ++j) acc[i][j] = 0.0;

        for (uint c = c0; c < nFull; c += CSTEP) colStep(c, false);
        if (nFull < nVec && (nFull % CSTEP) == c0) colStep(nFull, true);

        [[unroll]] for (uint j = 0u; j < NT; ++j) {
            if (j < nt) {  // uniform
                [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = acc[i][j];
                uint rgo;
                if (reduceRows(t, rgo)) {
                    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
                        const uint row = rowBase + r * ROW_LANES + rgo;
                        if (row < pc.O) yb[pc.yOffset + (tok0 + j) * pc.O + row] = rv[r];
                    }
                }
            }
        }
    }
}
