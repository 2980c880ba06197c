// gemv_float.glsl: float-path quantized GEMV body (y = x * dequant(W)^T), and the fused
// gate/up variant (h = silu(x*Wg^T) * (x*Wu^T)).  The including .comp defines:
//   QBITS  4 or 8
//   GATEUP (optional) fused gate+up: two matrices, SiLU product, optional clamp limit
//   MOE    (optional) grouped MoE variant (moe.glsl): one expert per workgroup row (y), tokens
//          gathered through a pair list, weights located by the work list; with ADDR_BDA
//          through a 64-bit buffer device address, else (slab index, offset) into a slab array
//   FUSED  (optional, with MOE and GATEUP) the whole layer call in one dispatch (moe.glsl)
//
// Tokens are processed in chunks of TOKENS (registers: TOKENS accumulators per owned row);
// each weight uvec4 is read once per chunk and used for every token of it.
#extension GL_EXT_control_flow_attributes : require

#if QBITS == 4
const uint COLS_PER_VEC = 32u;  // one uvec4 = 4 words = 32 q4 columns
const uint COLS_PER_WORD = 8u;
#elif QBITS == 8
const uint COLS_PER_VEC = 16u;  // one uvec4 = 4 words = 16 q8 columns
const uint COLS_PER_WORD = 4u;
#else
#error "QBITS must be 4 or 8"
#endif

#ifdef GATEUP
#define NMAT 2u
#else
#define NMAT 1u
#endif

#include "common.glsl"


// Tokens per register chunk: 0 (default) = min(8, max(1, 16 / (rows per thread * matrices))),
// so the accumulators take about 16 registers.  1 = leanest for S == 1.
layout(constant_id = 7) const uint TOKENS_ = 0u;
const uint TOKENS_AUTO = (NV >= 16u) ? 1u : ((NV >= 2u) ? (16u / NV) : 8u);
#ifdef FUSED
const uint TOKENS = 1u;  // each slot has its own expert: one input row per weight load
#else
const uint TOKENS = (TOKENS_ == 0u) ? TOKENS_AUTO : TOKENS_;
#endif

#ifdef MOE
#include "moe.glsl"
#elif defined(GATEUP)
layout(std430, binding = 0) readonly restrict buffer WG0 { uvec4 wGate[]; };
layout(std430, binding = 1) readonly restrict buffer SG0 { uint sGate[]; };
layout(std430, binding = 2) readonly restrict buffer WU0 { uvec4 wUp[]; };
layout(std430, binding = 3) readonly restrict buffer SU0 { uint sUp[]; };
layout(std430, binding = 4) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 4) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 5) writeonly restrict buffer YB { float yb[]; };
layout(push_constant, std430) uniform PC {
    uint O;
    uint I;
    uint S;
    uint rowWords;
    uint groupsPerRow;
    uint gateWeightOffset;  // uvec4 units
    uint gateScaleOffset;   // words
    uint upWeightOffset;    // uvec4 units
    uint upScaleOffset;     // words
    uint xOffset;           // floats
    uint yOffset;           // floats (hOffset)
    float limit;            // <= 0: none
} pc;
#else
layout(std430, binding = 0) readonly restrict buffer WG0 { uvec4 wGate[]; };
layout(std430, binding = 1) readonly restrict buffer SG0 { uint sGate[]; };
layout(std430, binding = 2) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 2) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; };
layout(push_constant, std430) uniform PC {
    uint O;
    uint I;
    uint S;
    uint rowWords;
    uint groupsPerRow;
    uint gateWeightOffset;  // weightOffset, uvec4 units
    uint gateScaleOffset;   // scaleOffset, words
    uint xOffset;           // floats
    uint yOffset;           // floats
} pc;
#endif

#ifndef MOE
#define X_SCALAR(i) xs[i]
#define X_VEC4(i) xv[i]
// Dense addressing: weights and scales in bound buffers, x row tok at xOffset + tok * I.
#define W_GATE(i) wGate[i]
#define W_UP(i) wUp[i]
#define S_GATE(k) LOAD_SCALE(sGate, pc.gateScaleOffset, k)
#define S_UP(k) LOAD_SCALE(sUp, pc.upScaleOffset, k)
uint xRow(uint tok) { return pc.xOffset + tok * pc.I; }
uint rowBlock() { return workgroupIndex(); }
uint tokenCount() { return pc.S; }
bool xAligned() { return ((pc.xOffset | pc.I) & 3u) == 0u; }
void storeOut(uint tok, uint row, float v) { yb[pc.yOffset + tok * pc.O + row] = v; }
#endif

// x load modes of one column step
const uint XM_VEC4 = 0u;    // full step, x rows 16-byte aligned: vec4 loads
const uint XM_SCALAR = 1u;  // full step, unaligned x: scalar loads
const uint XM_TAIL = 2u;    // last, partial step: scalar loads guarded by col < I

#define GATE_WEIGHT_OFFSET pc.gateWeightOffset
#define UP_WEIGHT_OFFSET pc.upWeightOffset
#include "rows.glsl"

// ---- loads -------------------------------------------------------------------------------
// 4 x values of token `tok` starting at column col (a multiple of 4).
vec4 loadX4(uint mode, uint tok, uint col) {
    const uint xb = xRow(tok) + col;
    if (mode == XM_VEC4) return X_VEC4(xb >> 2u);
    if (mode == XM_SCALAR) return vec4(X_SCALAR(xb), X_SCALAR(xb + 1u), X_SCALAR(xb + 2u), X_SCALAR(xb + 3u));
    vec4 v;
    [[unroll]] for (uint k = 0u; k < 4u; ++k) v[k] = (col + k < pc.I) ? X_SCALAR(xb + k) : 0.0;
    return v;
}

// ---- column step -------------------------------------------------------------------------
// A weight becomes a float by OR-ing its bits into the mantissa of 1.0: no int->float
// conversion, 3 instructions per weight including the FMA (shift, and-or, fma):
//   q4: u = q + 8 (a nibble) moved to mantissa bits 19..22: f = 1 + u/16 exactly, and
//       x.q = x.(16 (f - 1) - 8) = 16 (x.f - x) - 8 x        (summed over a step)
//   q8: b ^ 0x80 = q + 128 moved to mantissa bits 15..22: f = 1 + (q + 128)/256 exactly, and
//       x.q = 256 x.f - 384 x
// The sums of x are per token and shared by all rows of the thread.  The products x.f keep
// f32 precision (f in [1, 2)); the extra error, from the cancellation in 16 (x.f - x), is a few
// ulps of |x| per column.
float acc[NV][TOKENS];  // per-thread partial sums: [mat*RPT + r][token in chunk]
uint tok0;              // first token of the chunk
uint nt;                // tokens in the chunk (<= TOKENS)

void colStep(uint c, uint mode) {
    uvec4 wq[NV];
    float sc[NV];
    loadW(c, wq, sc);
    [[unroll]] for (uint jt = 0u; jt < TOKENS; ++jt) {
        if (jt < nt) {  // uniform
            const uint tok = tok0 + jt;
#if QBITS == 4
            float pl[NV], ph[NV];
            [[unroll]] for (uint i = 0u; i < NV; ++i) { pl[i] = 0.0; ph[i] = 0.0; }
            float sl = 0.0, sh = 0.0;
            [[unroll]] for (uint wi = 0u; wi < 4u; ++wi) {
                const uint col = c * 32u + wi * 8u;
                const vec4 a = loadX4(mode, tok, col);       // columns 8wi + 0..3 (low nibbles)
                const vec4 b = loadX4(mode, tok, col + 4u);  // columns 8wi + 4..7 (high nibbles)
                sl += (a.x + a.y) + (a.z + a.w);
                sh += (b.x + b.y) + (b.z + b.w);
                [[unroll]] for (uint i = 0u; i < NV; ++i) {
                    const uint w = wq[i][wi];
                    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                        // byte j: column j in its low nibble (bit 8j), column j+4 in its high
                        // nibble (bit 8j+4); move each to mantissa bits 19..22
                        const uint lo = shiftTo19(w, j) & 0x00780000u;
                        const uint hi = shiftTo15(w, j) & 0x00780000u;
                        pl[i] = fma(a[j], uintBitsToFloat(lo | 0x3F800000u), pl[i]);
                        ph[i] = fma(b[j], uintBitsToFloat(hi | 0x3F800000u), ph[i]);
                    }
                }
            }
            const float s8 = 8.0 * (sl + sh);
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                const float d = fma(16.0, (pl[i] - sl) + (ph[i] - sh), -s8);
                acc[i][jt] = fma(sc[i], d, acc[i][jt]);
            }
#else
            float p[NV];
            [[unroll]] for (uint i = 0u; i < NV; ++i) p[i] = 0.0;
            float s = 0.0;
            [[unroll]] for (uint wi = 0u; wi < 4u; ++wi) {
                const vec4 a = loadX4(mode, tok, c * 16u + wi * 4u);
                s += (a.x + a.y) + (a.z + a.w);
                [[unroll]] for (uint i = 0u; i < NV; ++i) {
                    const uint w = wq[i][wi];
                    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                        // byte j (bit 8j) to mantissa bits 15..22; the xor flips its top bit
                        // (b ^ 0x80 = q + 128) and sets the exponent of 1.0
                        const uint m = shiftTo15(w, j) & 0x007F8000u;
                        p[i] = fma(a[j], uintBitsToFloat(m ^ 0x3FC00000u), p[i]);
                    }
                }
            }
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                acc[i][jt] = fma(sc[i], fma(256.0, p[i], -384.0 * s), acc[i][jt]);
            }
#endif
        }
    }
}

// Column steps c0, c0 + step, ... of the owned rows for the current token chunk (acc += ...).
void columnLoop(uint c0, uint step) {
    const uint nFull = pc.I / COLS_PER_VEC;  // steps with every column < I
    const bool hasTail = nFull * COLS_PER_VEC < pc.I;
    if (xAligned()) {
        for (uint c = c0; c < nFull; c += step) colStep(c, XM_VEC4);
    } else {
        for (uint c = c0; c < nFull; c += step) colStep(c, XM_SCALAR);
    }
    if (hasTail && (nFull % step) == c0) colStep(nFull, XM_TAIL);  // the step c == nFull is mine
}

#ifdef FUSED
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
    for (tok0 = 0u; tok0 < S; tok0 += TOKENS) {
        nt = min(TOKENS, S - tok0);
        [[unroll]] for (uint i = 0u; i < NV; ++i)
            [[unroll]] for (uint j = 0u; j < TOKENS; ++j) acc[i][j] = 0.0;

        columnLoop(c0, CSTEP);

        [[unroll]] for (uint j = 0u; j < TOKENS; ++j) {
            if (j < nt) {  // uniform
                [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = acc[i][j];
                uint rgo;
                if (reduceRows(t, rgo)) storeRows(rowBase, rgo, tok0 + j);
            }
        }
    }
}
#endif
