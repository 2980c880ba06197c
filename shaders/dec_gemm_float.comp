#version 450
// dec_gemm_float: y[s, o] = sum_i W[o, i] * x[s, i] for a prompt chunk of any S tokens on float
// weights laid out as dec_gemv_half reads them: 16-bit floats (f16, or bf16 with flags bit 0)
// packed two per uint, element 2j of the flat array in the low half (with I odd, rows start
// mid-word), or with flags bit 1 f32, one element per uint (weightOffset then counts f32
// elements).  x f32 [S][I] at xOffset, y f32 [S][O] at yOffset, f32 sums.  dec_gemv_half takes at
// most 8 tokens a dispatch; this takes any S in one.
//
// A workgroup per NARROW_ROWS (1..4) rows x NT = 8 tokens, for matrices of few rows (the shared
// expert's 1-row gate), so the tokens spread over S / 8 workgroups.  Thread (g, k) = (t / 32, t % 32)
// takes the 4-column chunks k, k + 32, ... of tokens 2g, 2g + 1, each weight chunk (read from
// global memory: a few rows stay in cache) serving both tokens; the 32 partials of each output are
// then added in shared memory, in order.  Grid ceil(O / NARROW_ROWS) x ceil(S / 8).  Matrices of
// more rows (the routers) take dec_gemm_float_tile.
// Rows past O, tokens past S and columns past I compute zeros that are never stored (weights and
// x past I are read as 0, nothing past the matrix or x is read).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint NARROW_ROWS = 4u;  // rows a workgroup, 1..4

const uint WG = 128u;
const uint KS = 32u;  // threads over a token's columns
const uint TN = 2u;   // tokens per thread
const uint NT = (WG / KS) * TN;  // tokens per workgroup (8)
const uint MAX_NARROW = 4u;

layout(std430, binding = 0) readonly restrict buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly restrict buffer W1 { uint w1[]; };
layout(std430, binding = 1) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 1) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 2) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;
    uint S;
    uint weightOffset;  // uints (two halves each; f32 weights: one element each)
    uint xOffset;       // floats
    uint yOffset;       // floats
    uint flags;         // bit 0: bf16 (else f16); bit 1: f32 weights (bit 0 ignored)
} pc;

// each thread's partials [row][token of the thread][thread]
shared float red[MAX_NARROW * TN * WG];

#include "float_weights.glsl"

void narrowMain(bool xAligned) {
    const uint t = gl_LocalInvocationIndex;
    const uint R = NARROW_ROWS;
    const uint rowBase = gl_WorkGroupID.x * R;
    const uint g = t / KS, k = t % KS;
    const uint tokBase = gl_WorkGroupID.y * NT + g * TN;  // this thread's tokens tokBase, tokBase + 1
    float acc[MAX_NARROW][TN];
    [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++) [[unroll]] for (uint j = 0u; j < TN; j++) acc[r][j] = 0.0;

    for (uint col = 4u * k; col < pc.I; col += 4u * KS) {
        vec4 w[MAX_NARROW];
        [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++) {
            w[r] = vec4(0.0);
            if (r < R && rowBase + r < pc.O) w[r] = loadWeights4(rowBase + r, col);
        }
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            if (tokBase + j < pc.S) {
                const vec4 xc = loadX4(tokBase + j, col, xAligned);
                [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++) {
                    if (r < R) {
                        acc[r][j] = fma(w[r].x, xc.x, acc[r][j]);
                        acc[r][j] = fma(w[r].y, xc.y, acc[r][j]);
                        acc[r][j] = fma(w[r].z, xc.z, acc[r][j]);
                        acc[r][j] = fma(w[r].w, xc.w, acc[r][j]);
                    }
                }
            }
        }
    }
    [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++)
        [[unroll]] for (uint j = 0u; j < TN; j++) red[(r * TN + j) * WG + t] = acc[r][j];
    barrier();
    // thread o < R * NT adds the KS partials of output (row o / NT, token o % NT) in column order
    if (t < R * NT) {
        const uint r = t / NT, tok = t % NT;
        const uint gg = tok / TN, j = tok % TN;
        const uint s = gl_WorkGroupID.y * NT + tok, row = rowBase + r;
        float v = 0.0;
        for (uint kk = 0u; kk < KS; kk++) v += red[(r * TN + j) * WG + gg * KS + kk];
        if (s < pc.S && row < pc.O) yb[pc.yOffset + s * pc.O + row] = v;
    }
}

void main() {
    const bool xAligned = ((pc.xOffset | pc.I) & 3u) == 0u;
    narrowMain(xAligned);
}
