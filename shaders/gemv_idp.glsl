// gemv_idp.glsl: integer-dot-product GEMV body.  Activations were quantized per group by
// quantize_act.comp (int8, power-of-two scale, group sum); weights are q8 or q4.
//   y[s,o] = sum_g xscale(s,g) * wscale(o,g) * idot_g
// idot is exact int32: OpSDot (q8) / OpSUDot (signed activations x unsigned q4 nibbles,
// minus 8 * xsum per group).  The including .comp defines QBITS (4 or 8), and MOE / GATEUP /
// FUSED as gemv_float.glsl does; with FUSED each workgroup quantizes its token's x itself, into
// shared memory (quantizeToShared), and moe_fused.glsl supplies main().
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
#ifdef FUSED
const uint NT = 1u;  // one token per workgroup
#else
const uint NT = (TOKENS_ == 0u) ? TOKENS_AUTO : TOKENS_;
#endif

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
// quantize_act's row pitch: ceil(I/16)*4 words
uint xqRowVec() { return (pc.I + 15u) / 16u; }
#ifdef FUSED
// The fused call quantizes its token's x into shared memory (quantizeToShared, bit-identical to
// quantize_act), sized for X_COLS columns (the host sets it to D).
layout(constant_id = 9) const uint X_COLS = 2048u;
const uint X_WORDS = (X_COLS + 15u) / 16u * 4u;  // xq row words, padded to 16 columns
const uint X_GROUPS = (X_COLS + 31u) / 32u;       // groups of at least 32 columns
shared uvec4 xqS[X_WORDS / 4u];
shared float xscS[X_GROUPS];
shared int xsumS[X_GROUPS];
shared float gMaxS[X_GROUPS];
shared uint wordS[X_WORDS];  // per word: max |x| of its 4 columns (float bits), then the sum of its q
#define XQ_VEC(tok, i) xqS[(i) - (tok) * xqRow]  // one token in shared: its row
#define X_SCALE(tok, g) xscS[g]
#define X_SUM(tok, g) xsumS[g]
#else
layout(std430, binding = 0) readonly restrict buffer XQ { uvec4 xq[]; };
layout(std430, binding = 5) readonly restrict buffer XSC { float xscale[]; };
layout(std430, binding = 6) readonly restrict buffer XSU { int xsum[]; };
#endif
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

#ifndef FUSED
#define XQ_VEC(tok, i) xq[i]
#define X_SCALE(tok, g) xscale[(tok) * pc.groupsPerRow + (g)]
#define X_SUM(tok, g) xsum[(tok) * pc.groupsPerRow + (g)]
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
            const float xs = X_SCALE(tok, g);
#if QBITS == 8
            const uvec4 a = XQ_VEC(tok, tok * xqRow + c);
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                int d = sdot4x8(a.x, w[i].x, 0);
                d += sdot4x8(a.y, w[i].y, 0);
                d += sdot4x8(a.z, w[i].z, 0);
                d += sdot4x8(a.w, w[i].w, 0);
                acc[i][j] = fma(float(d), sc[i] * xs, acc[i][j]);
            }
#else
            const uvec4 a = XQ_VEC(tok, tok * xqRow + 2u * c);  // xq words 8c .. 8c+3
            const uvec4 b = hiValid ? XQ_VEC(tok, tok * xqRow + 2u * c + 1u) : uvec4(0u);
            const int corr = groupHead ? 8 * X_SUM(tok, g) : 0;
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

// Column steps c0, c0 + step, ... of the owned rows for the current token chunk (acc += ...).
// xq padding columns (>= I, inside the row) are 0, so every step but q4's second half of the last
// one is safe without a guard.
void columnLoop(uint c0, uint step) {
    const uint nVec = (pc.I + COLS_PER_VEC - 1u) / COLS_PER_VEC;
    const uint nFull = pc.I / COLS_PER_VEC;
    for (uint c = c0; c < nFull; c += step) colStep(c, false);
    if (nFull < nVec && (nFull % step) == c0) colStep(nFull, true);
}

#ifdef FUSED
// x[token] -> xqS, xscS, xsumS, exactly as quantize_act.comp (per group: amax = max |x|; amax 0 ->
// scale 0, q 0; else frexp(amax) = m * 2^e, scale 2^(e-7), q = clamp(roundEven(x * 2^(7-e)),
// -127, 127); padding columns 0). Every thread of the workgroup, uniform control flow.
// This one takes each group's max and sum through shared memory (x read twice, four barriers).
void quantizeByWorkgroup(uint token) {
    const uint lid = gl_LocalInvocationIndex;
    const uint D = pc.I;
    const uint nWords = (D + 15u) / 16u * 4u;
    const uint TPG = GROUP_SIZE / 4u;
    const uint groups = pc.groupsPerRow;
    for (uint w = lid; w < nWords; w += WG) {
        float m = 0.0;
        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
            const uint col = 4u * w + j;
            m = max(m, abs(col < D ? X_SCALAR(token * D + col) : 0.0));
        }
        wordS[w] = floatBitsToUint(m);
    }
    barrier();
    for (uint g = lid; g < groups; g += WG) {
        float m = 0.0;
        for (uint k = 0u; k < TPG; ++k) {
            const uint w = g * TPG + k;
            if (w < nWords) m = max(m, uintBitsToFloat(wordS[w]));
        }
        gMaxS[g] = m;
        int e = 0;
        if (m > 0.0) frexp(m, e);
        xscS[g] = m > 0.0 ? ldexp(1.0, e - 7) : 0.0;
    }
    barrier();
    for (uint w = lid; w < nWords; w += WG) {
        const float amax = gMaxS[(4u * w) / GROUP_SIZE];
        int q[4] = int[4](0, 0, 0, 0);
        if (amax > 0.0) {
            int e;
            frexp(amax, e);
            [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                const uint col = 4u * w + j;
                const float v = col < D ? X_SCALAR(token * D + col) : 0.0;
                q[j] = int(clamp(roundEven(ldexp(v, 7 - e)), -127.0, 127.0));
            }
        }
        xqS[w >> 2u][w & 3u] = (uint(q[0]) & 0xFFu) | ((uint(q[1]) & 0xFFu) << 8u) | ((uint(q[2]) & 0xFFu) << 16u) | (uint(q[3]) << 24u);
        wordS[w] = uint(q[0] + q[1] + q[2] + q[3]);
    }
    barrier();
    for (uint g = lid; g < groups; g += WG) {
        int sum = 0;
        for (uint k = 0u; k < TPG; ++k) {
            const uint w = g * TPG + k;
            if (w < nWords) sum += int(wordS[w]);
        }
        xsumS[g] = sum;
    }
    barrier();
}

#ifndef NO_SUBGROUP_OPS
// The same, with each group's max and sum taken across the GROUP_SIZE/4 consecutive lanes that hold
// its words (shuffles): x read once, one barrier. It is the first thing a fused workgroup does, so
// it sits on every call's critical path. Needs GROUP_SIZE/4 <= the subgroup size.
void quantizeBySubgroup(uint token) {
    const uint t = logicalThread();  // lanes of one subgroup are consecutive
    const uint D = pc.I;
    const uint nWords = (D + 15u) / 16u * 4u;
    const uint TPG = GROUP_SIZE / 4u;
    const bool aligned = (D & 3u) == 0u;
    // A uniform trip count: every lane takes part in the shuffles (words past the row count 0).
    for (uint w0 = 0u; w0 < nWords; w0 += WG) {
        const uint w = w0 + t;
        vec4 v = vec4(0.0);
        if (4u * w < D) {
            if (aligned) {
                v = X_VEC4((token * D) / 4u + w);
            } else {
                [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                    const uint col = 4u * w + j;
                    v[j] = col < D ? X_SCALAR(token * D + col) : 0.0;
                }
            }
        }
        float m = max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w)));
        for (uint off = 1u; off < TPG; off <<= 1u) m = max(m, subgroupShuffleXor(m, off));
        int q[4] = int[4](0, 0, 0, 0);
        float scale = 0.0;
        if (m > 0.0) {
            int e;
            frexp(m, e);
            scale = ldexp(1.0, e - 7);
            [[unroll]] for (uint j = 0u; j < 4u; ++j) q[j] = int(clamp(roundEven(ldexp(v[j], 7 - e)), -127.0, 127.0));
        }
        int sum = (q[0] + q[1]) + (q[2] + q[3]);
        for (uint off = 1u; off < TPG; off <<= 1u) sum += subgroupShuffleXor(sum, off);
        if (w < nWords) {
            xqS[w >> 2u][w & 3u] = (uint(q[0]) & 0xFFu) | ((uint(q[1]) & 0xFFu) << 8u) | ((uint(q[2]) & 0xFFu) << 16u) | (uint(q[3]) << 24u);
            if ((t % TPG) == 0u) {
                xscS[w / TPG] = scale;
                xsumS[w / TPG] = sum;
            }
        }
    }
    barrier();
}
#endif

void quantizeToShared(uint token) {
#ifndef NO_SUBGROUP_OPS
    if (USE_SUBGROUP && gl_SubgroupSize >= GROUP_SIZE / 4u) {
        quantizeBySubgroup(token);
        return;
    }
#endif
    quantizeByWorkgroup(token);
}

#include "moe_fused.glsl"
#else
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

    const uint S = tokenCount();
    for (tok0 = 0u; tok0 < S; tok0 += NT) {
        nt = min(NT, S - tok0);
        [[unroll]] for (uint i = 0u; i < NV; ++i)
            [[unroll]] for (uint j = 0u; j < NT; ++j) acc[i][j] = 0.0;

        columnLoop(c0, CSTEP);

        [[unroll]] for (uint j = 0u; j < NT; ++j) {
            if (j < nt) {  // uniform
                [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = acc[i][j];
                uint rgo;
                if (reduceRows(t, rgo)) storeRows(rowBase, rgo, tok0 + j);
            }
        }
    }
}
#endif
