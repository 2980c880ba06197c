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

#ifdef GATEUP
#define NMAT 2u
#else
#define NMAT 1u
#endif
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

#ifdef MOE
#define MOE_IDP
#include "moe.glsl"
layout(std430, binding = 0) readonly restrict buffer XQ { uvec4 xq[]; };
layout(std430, binding = 5) readonly restrict buffer XSC { float xscale[]; };
layout(std430, binding = 6) readonly restrict buffer XSU { int xsum[]; };
// quantize_act's row pitch: ceil(I/16)*4 words
uint xqRowVec() { return (pc.I + 15u) / 16u; }
#define GATE_WEIGHT_OFFSET pc.gateWeightOffset
#define UP_WEIGHT_OFFSET pc.upWeightOffset
#else
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
#define W_GATE(i) wq[i]
#define S_GATE(k) LOAD_SCALE(wscale, pc.scaleOffset, k)
#define GATE_WEIGHT_OFFSET pc.weightOffset
uint xqRowVec() { return pc.xqRowWords >> 2u; }
uint tokenOf(uint tok) { return tok; }
uint rowBlock() { return workgroupIndex(); }
uint tokenCount() { return pc.S; }
void storeOut(uint tok, uint row, float v) { yb[pc.yOffset + tok * pc.O + row] = v; }
#endif

float acc[NV][NT];  // [mat*RPT + r][token in chunk]
#include "rows.glsl"
uint tok0;
uint nt;

// One column step: uvec4 column c of every owned row (of every matrix), all tokens of the chunk.
// tail: last step (only matters for q4, whose second xq half may lie past the row).
void colStep(uint c, bool tail) {
    const uint g = (c * COLS_PER_VEC) / GROUP_SIZE;  // a uvec4 never straddles a group
    uvec4 w[NV];
    float sc[NV];
    loadW(c, w, sc);
#if QBITS == 4
    uvec4 lo[NV], hi[NV];
    [[unroll]] for (uint i = 0u; i < NV; ++i) {
        lo[i] = w[i] & 0x0F0F0F0Fu;          // cols 8k..8k+3 of word k, unsigned 0..15
        hi[i] = (w[i] >> 4u) & 0x0F0F0F0Fu;  // cols 8k+4..8k+7
    }
    // the first uvec4 of each group subtracts 8 * (sum of that group's activations)
    const bool groupHead = (c % (GROUP_SIZE / COLS_PER_VEC)) == 0u;
    const bool hiValid = !tail || (c * 32u + 16u < pc.I);
#endif
    const uint xqRow = xqRowVec();
    [[unroll]] for (uint j = 0u; j < NT; ++j) {
        if (j < nt) {
            const uint tok = tokenOf(tok0 + j);
            const float xs = xscale[tok * pc.groupsPerRow + g];
#if QBITS == 8
            const uvec4 a = xq[tok * xqRow + c];
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                int d = sdot4x8(a.x, w[i].x, 0);
                d += sdot4x8(a.y, w[i].y, 0);
                d += sdot4x8(a.z, w[i].z, 0);
                d += sdot4x8(a.w, w[i].w, 0);
                acc[i][j] = fma(float(d), sc[i] * xs, acc[i][j]);
            }
#else
            const uvec4 a = xq[tok * xqRow + 2u * c];  // xq words 8c .. 8c+3
            const uvec4 b = hiValid ? xq[tok * xqRow + 2u * c + 1u] : uvec4(0u);
            const int corr = groupHead ? 8 * xsum[tok * pc.groupsPerRow + g] : 0;
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                // weight word k covers xq words 2k (low nibbles) and 2k+1 (high nibbles)
                int d = sudot4x8(a.x, lo[i].x, 0);
                d += sudot4x8(a.y, hi[i].x, 0);
                d += sudot4x8(a.z, lo[i].y, 0);
                d += sudot4x8(a.w, hi[i].y, 0);
                d += sudot4x8(b.x, lo[i].z, 0);
                d += sudot4x8(b.y, hi[i].z, 0);
                d += sudot4x8(b.z, lo[i].w, 0);
                d += sudot4x8(b.w, hi[i].w, 0);
                acc[i][j] = fma(float(d - corr), sc[i] * xs, acc[i][j]);
            }
#endif
        }
    }
}

void main() {
#ifdef MOE
    if (!moeBegin()) return;  // a work item past the end of this call's list: uniform
#endif
    const uint rowBase = rowBlock() * ROWS_PER_WG;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform

    const uint t = logicalThread();
    const uint cl = t % COL_THREADS;
    const uint rg = (t / COL_THREADS) % ROW_LANES;
    const uint ks = t / (COL_THREADS * ROW_LANES);
    const uint c0 = ks * COL_THREADS + cl;

    initRows(rowBase, rg);

    // xq padding columns (>= I, inside the row) are 0, so every step but q4's second half of
    // the last one is safe without a guard
    const uint nVec = (pc.I + COLS_PER_VEC - 1u) / COLS_PER_VEC;
    const uint nFull = pc.I / COLS_PER_VEC;

    const uint S = tokenCount();
    for (tok0 = 0u; tok0 < S; tok0 += NT) {
        nt = min(NT, S - tok0);
        [[unroll]] for (uint i = 0u; i < NV; ++i)
            [[unroll]] for (uint j = 0u; j < NT; ++j) acc[i][j] = 0.0;

        for (uint c = c0; c < nFull; c += CSTEP) colStep(c, false);
        if (nFull < nVec && (nFull % CSTEP) == c0) colStep(nFull, true);

        [[unroll]] for (uint j = 0u; j < NT; ++j) {
            if (j < nt) {  // uniform
                [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = acc[i][j];
                uint rgo;
                if (reduceRows(t, rgo)) storeRows(rowBase, rgo, tok0 + j);
            }
        }
    }
}
