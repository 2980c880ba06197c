// moe_fused.glsl: the fused MoE call (moe.glsl, FUSED), included at the end of gemv_float.glsl or
// gemv_idp.glsl, which provide the gate+up column loop (columnLoop, acc) and, on the integer-dot
// path, quantizeToShared. Down is float on both paths (h is float).
// ---- the down half of a fused call --------------------------------------------------------
// The workgroup holds h for ROWS_PER_WG rows of I (hs), so it owns the same block of columns of
// every down row: D rows of BLOCK_VECS uvec4 each (contiguous across rows: down is stored by
// column blocks), DOWN_ROWS rows per thread per pass with every load issued before the arithmetic. h and its per-uvec4 sums live in registers (the same for
// every row). (Loading the first pass before gate+up, and gate+up's two column steps at once,
// measured no faster on the H200.)
const uint BLOCK_VECS = ROWS_PER_WG / COLS_PER_VEC;  // the host keeps ROWS_PER_WG a multiple of 32
const uint DOWN_ROWS = 4u;
float hr[ROWS_PER_WG];
float hsum[BLOCK_VECS];

// h . (one uvec4 of dequantized weights, before its scale), the uvec4 being the block's v-th.
float dotBlockVec(uvec4 w4, uint v) {
    const uint cb = v * COLS_PER_VEC;
#if QBITS == 4
    float p = 0.0;
    [[unroll]] for (uint wi = 0u; wi < 4u; ++wi) {
        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
            const uint lo = shiftTo19(w4[wi], j) & 0x00780000u;  // column 8wi + j
            const uint hi = shiftTo15(w4[wi], j) & 0x00780000u;  // column 8wi + 4 + j
            p = fma(hr[cb + 8u * wi + j], uintBitsToFloat(lo | 0x3F800000u), p);
            p = fma(hr[cb + 8u * wi + 4u + j], uintBitsToFloat(hi | 0x3F800000u), p);
        }
    }
    return fma(16.0, p - hsum[v], -8.0 * hsum[v]);  // see colStep: h.q = 16 (h.f - sum h) - 8 sum h
#else
    float p = 0.0;
    [[unroll]] for (uint wi = 0u; wi < 4u; ++wi) {
        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
            const uint m = shiftTo15(w4[wi], j) & 0x007F8000u;  // column 4wi + j
            p = fma(hr[cb + 4u * wi + j], uintBitsToFloat(m ^ 0x3FC00000u), p);
        }
    }
    return fma(256.0, p, -384.0 * hsum[v]);
#endif
}

// yacc[token][o] += w * (block of down row o) . h, for every down row o.
void downBlock(uint token, float w, uint rowBase) {
    const uint D = pc.I;
    const uint rowVec = pc.downRowWords >> 2u;
    const uint v0 = rowBase / COLS_PER_VEC;
    const uint nv = min(BLOCK_VECS, rowVec - v0);  // uvec4 of the block inside a row (uniform)
    [[unroll]] for (uint k = 0u; k < ROWS_PER_WG; ++k) hr[k] = hs[k];
    [[unroll]] for (uint v = 0u; v < BLOCK_VECS; ++v) {
        float s = 0.0;
        [[unroll]] for (uint k = 0u; k < COLS_PER_VEC; ++k) s += hr[v * COLS_PER_VEC + k];
        hsum[v] = s;
    }
    for (uint o0 = gl_LocalInvocationIndex; o0 < D; o0 += WG * DOWN_ROWS) {
        uvec4 wv[DOWN_ROWS][BLOCK_VECS];
        float sc[DOWN_ROWS][BLOCK_VECS];
        [[unroll]] for (uint r = 0u; r < DOWN_ROWS; ++r) {
            const uint o = min(o0 + r * WG, D - 1u);  // rows past D: loads clamped, results dropped
            [[unroll]] for (uint v = 0u; v < BLOCK_VECS; ++v) {
                const uint vv = min(v, nv - 1u);  // uvec4 past the row's end: clamped, skipped below
                // down is stored by column blocks (pool/expert-layout.ts): consecutive o, consecutive uvec4
                wv[r][v] = BLOB_V(pc.downWeightOffset + (v0 + vv) * D + o);
                sc[r][v] = BLOB_SCALE(pc.downScaleOffset, (((v0 + vv) * COLS_PER_VEC) / GROUP_SIZE) * D + o);
            }
        }
        [[unroll]] for (uint r = 0u; r < DOWN_ROWS; ++r) {
            const uint o = o0 + r * WG;
            if (o < D) {
                float total = 0.0;
                [[unroll]] for (uint v = 0u; v < BLOCK_VECS; ++v) {
                    if (v < nv) total = fma(sc[r][v], dotBlockVec(wv[r][v], v), total);
                }
                atomicAdd(yacc[token * D + o], w * total);
            }
        }
    }
}

// gate+up of the workgroup's ROWS_PER_WG rows of I for one token (int8 x on the integer-dot path,
// already in shared memory), h into hs.
void gateUpBlock(uint token, uint rowBase) {
    const uint t = logicalThread();
    const uint cl = t % COL_THREADS;
    const uint rg = (t / COL_THREADS) % ROW_LANES;
    const uint ks = t / (COL_THREADS * ROW_LANES);
    initRows(rowBase, rg);
    tok0 = token;
    nt = 1u;
    [[unroll]] for (uint i = 0u; i < NV; ++i) acc[i][0] = 0.0;
    columnLoop(ks * COL_THREADS + cl, CSTEP);
    [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = acc[i][0];
    uint rgo;
    if (reduceRows(t, rgo)) storeRows(rowBase, rgo, token);
}

#ifdef SHARED_SLOT
// sigmoid(x[token] . the shared_expert_gate row), the same value in every thread (a tree sum in
// shared memory; ends with a barrier). As dec_gating's: the sigmoid rounded to f32.
shared float gateSum[WG];
float sharedSlotWeight(uint token) {
    const uint D = pc.I;  // gate+up's columns
    float part = 0.0;
    for (uint i = gl_LocalInvocationIndex; i < D; i += WG) part = fma(X_SCALAR(xRow(token) + i), sharedGateRow[pc.sharedGateOffset + i], part);
    gateSum[gl_LocalInvocationIndex] = part;
    barrier();
    [[unroll]] for (uint n = WG / 2u; n > 0u; n >>= 1u) {
        if (gl_LocalInvocationIndex < n) gateSum[gl_LocalInvocationIndex] += gateSum[gl_LocalInvocationIndex + n];
        barrier();
    }
    return 1.0 / (1.0 + exp(-gateSum[0]));
}
#endif

// ---- pre-launch ----------------------------------------------------------------------------
// PRELAUNCHED: the kernel is submitted before its call's inputs exist, and waits for the host's
// doorbell (gate[1] == gate[0]), so the launch and the GPU's wake-up are off the call's critical
// path. Thread 0 of each workgroup polls; the first to see the doorbell, the cancel value or its
// poll limit (GATE_POLLS, so a kernel nobody rings ends by itself) records the decision in
// arrived[1] with a compare-and-swap, and every workgroup follows that one decision.
layout(constant_id = 11) const uint GATE_POLLS = 4096u;  // (PRELAUNCHED: moe.glsl)
const uint GATE_GO = 1u;
const uint GATE_STOP = 2u;
const uint GATE_CANCEL = 0xFFFFFFFFu;  // doorbell value: stop now (matches gpu-layer.ts)
shared uint gateDecision;

bool waitForDoorbell(uint want) {
    // Every invocation runs the loop (a barrier per poll): one invocation looping while the others
    // wait at a barrier is not reliable (Lavapipe mixes the decisions up).
    uint decision = 0u;
    // Cleared first, so that no invocation can take leftover shared memory for a decision. (The
    // kernels Lavapipe seemed to stop before their doorbell were stale completion words on the
    // host side, not this: gpu-layer.ts now zeroes them.)
    if (gl_LocalInvocationIndex == 0u) gateDecision = 0u;
    barrier();
    for (uint i = 0u; decision == 0u; ++i) {
        if (gl_LocalInvocationIndex == 0u) {
            // The doorbell and the decision already taken (0: none yet), read together; a
            // decision of ours is recorded only if it is the first (compare-and-swap).
            const uint bell = gate[1];
            uint d = atomicOr(arrived[1], 0u);
            const uint mine = bell == want ? GATE_GO : (bell == GATE_CANCEL || i >= GATE_POLLS) ? GATE_STOP : 0u;
            if (d == 0u && mine != 0u) {
                const uint prev = atomicCompSwap(arrived[1], 0u, mine);
                d = prev != 0u ? prev : mine;
            }
            gateDecision = d;
        }
        barrier();
        decision = gateDecision;
        barrier();
    }
    memoryBarrierBuffer();  // the inputs were written before the doorbell
    return decision == GATE_GO;
}

// One workgroup per (block of rows of I, slot): gate+up for the block (gateUpBlock: one
// token), h to shared memory, then the block's share of down for every output row.
// The grid is (row blocks, slots per token, S), so the workgroup knows its token and slot without
// reading anything: its first loads (slot weight, expert address, x, the header) are independent
// and in flight together, one memory latency instead of three in a row.
void main() {
    const uint token = gl_WorkGroupID.z;
    const uint rowBase = gl_WorkGroupID.x * ROWS_PER_WG;
    uint seq;  // the call's sequence number, for the completion word
    if (PRELAUNCHED) {
        seq = gate[0];
        if (!waitForDoorbell(seq)) {
            arriveFused(seq, gl_NumWorkGroups.z, false);
            return;  // uniform
        }
    } else {
        seq = work[0].w;
    }
#ifdef SHARED_SLOT
    // the router's slots per token, then the shared expert's: routed slot j of token t at t * routed + j
    const uint routed = gl_NumWorkGroups.y - 1u;
    const bool sharedSlot = gl_WorkGroupID.y == routed;  // uniform
    const uint routedSlot = token * routed + gl_WorkGroupID.y;
    float w = sharedSlot ? 1.0 : slotWeight[routedSlot];
    const uvec2 expert = sharedSlot ? uvec2(pc.sharedExpertLo, pc.sharedExpertHi) : slotExpert[routedSlot];
#else
    const uint slot = token * gl_NumWorkGroups.y + gl_WorkGroupID.y;
    const float w = slotWeight[slot];
    const uvec2 expert = slotExpert[slot];
#endif
    for (uint k = gl_LocalInvocationIndex; k < ROWS_PER_WG; k += WG) hs[k] = 0.0;
#ifdef MOE_IDP
    // Every workgroup, even one with nothing to do below: x does not wait for the slot weight.
    quantizeToShared(token);  // ends with a barrier
#else
    barrier();
#endif
    // w == 0: its expert ran on the CPU (or the router gave it 0). Uniform; no return: every
    // thread reaches arriveFused().
    if (w != 0.0 && rowBase < pc.O) {
        blockBase = rowBase;
        setBlob(expert);
        gateUpBlock(token, rowBase);
        barrier();
#ifdef SHARED_SLOT
        if (sharedSlot) w = sharedSlotWeight(token);
#endif
        downBlock(token, w, rowBase);
    }
    arriveFused(seq, gl_NumWorkGroups.z, true);
}
