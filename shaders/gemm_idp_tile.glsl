// gemm_idp_tile.glsl: the tile of the integer-dot prompt-chunk GEMMs (dec_gemm_ggml_idp over GGML
// blocks, dec_gemm_quant_idp over the q4/q8 pool format): 128 threads, BM = 32 rows x BN = 64 tokens,
// walking the rows by 32-weight slices of two 16-column runs, STEP slices between two barriers, a
// 4 x 4 register tile a thread, the split-over-columns ending of gemm_split.glsl. See
// dec_gemm_ggml_idp.comp for the arithmetic. The includer declares the bindings and pc (O, I, S,
// yOffset, splits, splitCols), BM = 32 and BN = 64 (gemm_split.glsl's too), sudot4x8, STEP, and:
//   OFF, MINS, GAP        the runs' offset (unsigned weight bytes: value = q - OFF) or min, and the
//                         x groups from a slice's first run to its second
//   uint rowHandle(row)   what loadSlice needs to find a row (an address, or the row)
//   void loadSlice(handle, u, out q0, out q1, out d, out m)
//                         slice u of the row: the runs' 16 unsigned quant bytes each, d and m per run
//   uint sliceGroup(u)    the x group (16 columns) of slice u's first run within a token's row

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
        const bool live = u < uEnd;  // uniform
        nextQ0[k] = uvec4(0u), nextQ1[k] = uvec4(0u), nextD[k] = vec2(0.0), nextM[k] = vec2(0.0);
        if (dequantizer && live) loadSlice(rowAddr, u, nextQ0[k], nextQ1[k], nextD[k], nextM[k]);
        const uint at = tok * groups + sliceGroup(u) + run * GAP;
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
    const uint rowAddr = rowHandle(min(rowBase + t % BM, pc.O - 1u));
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
