// gemv_half.glsl: dec_gemv_half's arithmetic (see dec_gemv_half.comp for the layout and the
// loads), shared with dec_router_route so that its router logits are these bits.
//
// The includer declares the spec constants ROWS_PER_WG and USE_SUBGROUP, WG (the workgroup
// size), the buffers W4 / W1 (weights, binding 0), XS / XV (x) and yb[] (y, written), and a
// push-constant block pc with O, I, S, weightOffset, xOffset, yOffset and flags as
// dec_gemv_half's.

const uint R = ROWS_PER_WG;
const uint MAX_S = 8u;

// Where x is read (the includer may define them first: dec_router_route reads its own normed x from
// shared memory): element i, 16-byte element i (x as vec4s), and the offset of token 0's row.
#ifndef GEMV_HALF_X
#define GEMV_HALF_X(i) xs[i]
#define GEMV_HALF_X4(i) xv[i]
#define GEMV_HALF_X_OFFSET pc.xOffset
#endif

shared float red[WG * R];

#include "half_words.glsl"

// Element (row, col) of W as a float, any dtype (the tail).
float loadWeight(uint row, uint col) {
    if (f32w()) return uintBitsToFloat(w1[pc.weightOffset + row * pc.I + col]);
    return loadHalf(2u * pc.weightOffset + row * pc.I + col);
}

float acc[R][MAX_S];

// Rows rowBase .. rowBase + R - 1 (those below O) of y for the S tokens. rowBase < O; called by
// the whole workgroup in uniform control flow.
void gemvHalfRows(const uint rowBase) {
    const uint t = gl_LocalInvocationIndex;
    const uint I = pc.I;
    const uint S = pc.S;

    [[unroll]] for (uint r = 0u; r < R; ++r)
        [[unroll]] for (uint s = 0u; s < MAX_S; ++s) acc[r][s] = 0.0;

    const uint nFull = I >> 3u;  // chunks of 8 columns all < I
    const bool vecW = ((I & 7u) | (pc.weightOffset & 3u)) == 0u;
    const bool evenI = (I & 1u) == 0u;
    const uint xOffset = GEMV_HALF_X_OFFSET;
    const bool vecX = ((I | xOffset) & 3u) == 0u;
    const bool f32W = f32w();
    const bool vecW32 = ((I | pc.weightOffset) & 3u) == 0u;

    for (uint c = t; c < nFull; c += WG) {
        vec4 wlo[R], whi[R];  // columns 8c + 0..3 and 8c + 4..7 of each row
        [[unroll]] for (uint r = 0u; r < R; ++r) {
            const uint row = min(rowBase + r, pc.O - 1u);  // rows past O: read row O-1, not stored
            uvec4 q;
            if (f32W) {
                const uint b = pc.weightOffset + row * I + 8u * c;
                if (vecW32) {
                    wlo[r] = uintBitsToFloat(w4[b >> 2u]);
                    whi[r] = uintBitsToFloat(w4[(b >> 2u) + 1u]);
                } else {
                    wlo[r] = uintBitsToFloat(uvec4(w1[b], w1[b + 1u], w1[b + 2u], w1[b + 3u]));
                    whi[r] = uintBitsToFloat(uvec4(w1[b + 4u], w1[b + 5u], w1[b + 6u], w1[b + 7u]));
                }
                continue;
            } else if (vecW) {
                q = w4[(pc.weightOffset >> 2u) + row * (I >> 3u) + c];
            } else if (evenI) {
                const uint b = pc.weightOffset + row * (I >> 1u) + 4u * c;
                q = uvec4(w1[b], w1[b + 1u], w1[b + 2u], w1[b + 3u]);
            } else {
                const uint h = 2u * pc.weightOffset + row * I + 8u * c;
                [[unroll]] for (uint k = 0u; k < 4u; ++k) {
                    wlo[r][k] = loadHalf(h + k);
                    whi[r][k] = loadHalf(h + 4u + k);
                }
                continue;
            }
            const vec2 a = decode2(q.x), b = decode2(q.y), d = decode2(q.z), e = decode2(q.w);
            wlo[r] = vec4(a, b);
            whi[r] = vec4(d, e);
        }
        [[unroll]] for (uint s = 0u; s < MAX_S; ++s) {
            if (s < S) {  // uniform
                const uint xb = xOffset + s * I + 8u * c;
                vec4 xa, xc;
                if (vecX) {
                    xa = GEMV_HALF_X4(xb >> 2u);
                    xc = GEMV_HALF_X4((xb >> 2u) + 1u);
                } else {
                    xa = vec4(GEMV_HALF_X(xb), GEMV_HALF_X(xb + 1u), GEMV_HALF_X(xb + 2u), GEMV_HALF_X(xb + 3u));
                    xc = vec4(GEMV_HALF_X(xb + 4u), GEMV_HALF_X(xb + 5u), GEMV_HALF_X(xb + 6u), GEMV_HALF_X(xb + 7u));
                }
                [[unroll]] for (uint r = 0u; r < R; ++r) {
                    acc[r][s] = fma(wlo[r].x, xa.x, acc[r][s]);
                    acc[r][s] = fma(wlo[r].y, xa.y, acc[r][s]);
                    acc[r][s] = fma(wlo[r].z, xa.z, acc[r][s]);
                    acc[r][s] = fma(wlo[r].w, xa.w, acc[r][s]);
                    acc[r][s] = fma(whi[r].x, xc.x, acc[r][s]);
                    acc[r][s] = fma(whi[r].y, xc.y, acc[r][s]);
                    acc[r][s] = fma(whi[r].z, xc.z, acc[r][s]);
                    acc[r][s] = fma(whi[r].w, xc.w, acc[r][s]);
                }
            }
        }
    }

    // tail: columns 8 nFull .. I-1 (fewer than 8), half by half, on the thread that owns chunk nFull
    if ((I & 7u) != 0u && (nFull % WG) == t) {
        const uint n = I & 7u;
        for (uint k = 0u; k < n; ++k) {
            const uint col = 8u * nFull + k;
            [[unroll]] for (uint r = 0u; r < R; ++r) {
                const uint row = min(rowBase + r, pc.O - 1u);
                const float wv = loadWeight(row, col);
                [[unroll]] for (uint s = 0u; s < MAX_S; ++s) {
                    if (s < S) acc[r][s] = fma(wv, GEMV_HALF_X(xOffset + s * I + col), acc[r][s]);
                }
            }
        }
    }

    // ---- reduction over the workgroup, one token at a time ----
    [[unroll]] for (uint s = 0u; s < MAX_S; ++s) {
        if (s < S) {  // uniform
            if (USE_SUBGROUP) {
                const uint nsg = gl_NumSubgroups;
                [[unroll]] for (uint r = 0u; r < R; ++r) {
                    const float v = subgroupAdd(acc[r][s]);
                    if (subgroupElect()) red[gl_SubgroupID * R + r] = v;
                }
                barrier();
                if (t < R) {
                    float v = 0.0;
                    for (uint g = 0u; g < nsg; ++g) v += red[g * R + t];
                    if (rowBase + t < pc.O) yb[pc.yOffset + s * pc.O + rowBase + t] = v;
                }
                barrier();
            } else {
                [[unroll]] for (uint r = 0u; r < R; ++r) red[t * R + r] = acc[r][s];
                barrier();
                for (uint h = WG / 2u; h > 0u; h >>= 1u) {
                    if (t < h) {
                        [[unroll]] for (uint r = 0u; r < R; ++r) red[t * R + r] += red[(t + h) * R + r];
                    }
                    barrier();
                }
                if (t < R && rowBase + t < pc.O) yb[pc.yOffset + s * pc.O + rowBase + t] = red[t];
                barrier();
            }
        }
    }
}
