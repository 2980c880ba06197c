#version 450
// dec_delta_rule_chunked: S tokens (1..64) through the gated delta rule in its chunk-parallel form,
// as src/model/linear-attention.ts gatedDeltaRuleChunked (transformers' torch_chunk_gated_delta_rule)
// with the whole call one chunk. Same conventions as dec_delta_rule.comp (q/k L2 norms with eps 1e-6,
// q scaled by 1/sqrt(KEY_DIM), value head h reads key head h / (valueHeads / keyHeads), the gates
// from a/b unless flags bit 1); the gated RMSNorm is not fused (a head's output row spans several
// workgroups here): the host runs dec_gated_norm after.
//
// With G the cumulative log decay of the chunk, k and q normalised (q scaled), S0 the state:
//   A_ij = beta_i (k_i.k_j) exp(G_i - G_j)  (j < i)     P_ij = (q_i.k_j) exp(G_i - G_j)  (j <= i)
//   R_i  = beta_i (v_i - exp(G_i) k_i S0)               U = (I + A)^-1 R   (the tokens' deltas)
//   o_i  = exp(G_i) q_i S0 + sum_{j<=i} P_ij U_j
//   S'   = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j^T U_j
// which is the recurrent rule unrolled (delta_t + beta_t sum_{j<t} exp(G_t-G_j)(k_t.k_j) delta_j =
// beta_t (v_t - exp(G_t) k_t S0)). Every decay is formed as exp of a difference, never exp(G_i) /
// exp(G_j), so nothing overflows; G is kept as an unevaluated sum hi + lo (compensated running sum),
// so that G_i - G_j of nearby tokens keeps its digits where G itself is large (a fast-decaying head
// reaches G = -3000 over a chunk, where one f32 ulp of G is 2.4e-4: that much relative error in
// exp(G_i - G_j) measured 1e-10 state NMSE on the tiny fixture's layers, against 1e-14 compensated).
//
// Workgroup (h, y) owns value head h's columns y*SLICE .. y*SLICE+SLICE-1: the columns of the state,
// v, U and o are independent given the key side, so each workgroup recomputes the (cheap) 64x64 key
// side (A, P, the solve) for its slice and the real shape (32 heads of 128) runs 256 workgroups.
// Phases (about 2 * TILES * 2 + 12 barriers, against 2-4 a token in the recurrent form):
//  1 tiles of KT key rows: k, q (raw) and the state tile in shared memory; invocation
//    (blockRow, blockCol) accumulates a 4x4 block of k.k^T and q.k^T, invocation (col, tileRow)
//    the (token, column) entries k.S0 and q.S0; the norms come from the Gram diagonal;
//  2 A (shared), P (registers), R (shared);
//  3 (I + A) U = R: the 16x16 diagonal blocks inverted column by column (one invocation per
//    column, no barrier), then block forward substitution (2 barriers a block);
//  4 P into shared memory, o = exp(G) q S0 + P U;
//  5 the state update over tiles of key rows, each invocation one state entry a tile.
// The state [valueHeads][KEY_DIM][VALUE_DIM] is read once (invocation (col, tileRow) keeps entry
// (tl*KT + tileRow, column) of each tile tl in registers) and written once. KEY_DIM and VALUE_DIM
// need not be multiples of KT, SLICE: rows and columns past them read as zeros and are not written.
// Shared memory: 4 * (64*65 + 80*SLICE + 7*64) B (23.0 KiB with SLICE 16, 28.0 KiB with 32).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require

// 256 invocations: the 64x64 key-side matrices are 4x4 register blocks on a 16x16 grid
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint KEY_DIM = 128;
layout(constant_id = 1) const uint VALUE_DIM = 128;
layout(constant_id = 2) const uint SLICE = 16;  // value columns per workgroup: 16 or 32

const uint WG = 256;
// dec_linear_attention.glsl's workgroup reduction is unused here (its gates' functions are shared)
const bool USE_SUBGROUP = false;
const uint CHUNK = 64;
const uint BLOCK = 16;                          // diagonal blocks of the triangular solve
const uint KT = WG / SLICE;                     // key rows a tile: one state entry per invocation
const uint TILES = (KEY_DIM + KT - 1) / KT;
const uint ROWS_PER = CHUNK / KT;               // token rows of the (token, column) entries per invocation
const uint MAT_STRIDE = CHUNK + 1;
const uint TILE_STRIDE = KT + 1;
const uint K_TILE = 0;                          // phase 1 and 5 tiles inside `mat` (free then)
const uint Q_TILE = CHUNK * TILE_STRIDE;
const uint STATE_TILE = 2 * CHUNK * TILE_STRIDE;
const float L2_EPS = 1e-6;

#include "dec_linear_attention.glsl"

layout(set = 0, binding = 0) readonly buffer QKV { float qkv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };
layout(set = 0, binding = 2) readonly buffer B { float b[]; };
layout(set = 0, binding = 3) readonly buffer Params { float params[]; };
layout(set = 0, binding = 4) buffer State { float state[]; };
layout(set = 0, binding = 5) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform Push {
    uint S;
    uint keyHeads;
    uint valueHeads;
    uint qOffset;       // floats: token t's key head kh at qOffset + t * qkvStride + kh * KEY_DIM
    uint kOffset;       // likewise
    uint vOffset;       // floats: value head h at vOffset + t * qkvStride + h * VALUE_DIM
    uint qkvStride;
    uint aOffset;       // floats: a (or g) of (t, h) at aOffset + t * aStride + h
    uint aStride;
    uint bOffset;       // floats: b (or beta) likewise
    uint bStride;
    uint outOffset;     // floats: (t, h) at outOffset + t * outStride + h * VALUE_DIM
    uint outStride;
    uint stateOffset;   // floats: [valueHeads][KEY_DIM][VALUE_DIM]
    uint negAOffset;    // floats in params (unless flags bit 1)
    uint dtBiasOffset;  // floats in params (unless flags bit 1)
    uint flags;         // bit 1: a, b hold g and beta as they are
} pc;

// Phase 1: k, q and state tiles; 2-3: A (strictly lower) with the inverted diagonal blocks stored
// transposed in their upper triangles; 4: P; 5: the scaled k tiles.
shared float mat[CHUNK * MAT_STRIDE];
shared float uv[CHUNK * SLICE];      // R, then U (v_new)
shared float yBlock[BLOCK * SLICE];  // a block's right-hand side during the substitution
shared float gLog[CHUNK];
shared float gHi[CHUNK];             // G = gHi + gLo
shared float gLo[CHUNK];
shared float betaS[CHUNK];
shared float kSq[CHUNK];             // raw sums of squares, for the L2 norms
shared float qSq[CHUNK];
shared float kWeight[CHUNK];         // exp(G_last - G_j) / |k_j|: the state update's key scale

// G_i - G_j, rounded once
float logDecay(uint i, uint j) {
    precise float d = (gHi[i] - gHi[j]) + (gLo[i] - gLo[j]);
    return d;
}

void main() {
    const uint h = gl_WorkGroupID.x;
    if (h >= pc.valueHeads) return;  // uniform per workgroup
    const uint S = pc.S;
    const uint li = gl_LocalInvocationIndex;
    const uint kh = h / (pc.valueHeads / pc.keyHeads);
    const bool gatesGiven = (pc.flags & 2u) != 0u;
    const float qScale = 1.0 / sqrt(float(KEY_DIM));
    const uint col = li % SLICE, tileRow = li / SLICE;
    const uint column = gl_WorkGroupID.y * SLICE + col;
    const bool columnIn = column < VALUE_DIM;
    const uint blockRow = li / 16u, blockCol = li % 16u;
    const uint keyAt = kh * KEY_DIM;

    if (li < CHUNK) {
        float g = 0.0, beta = 0.0;  // padded tokens change nothing
        if (li < S) {
            const float ga = a[pc.aOffset + li * pc.aStride + h];
            const float gb = b[pc.bOffset + li * pc.bStride + h];
            g = gatesGiven ? ga : params[pc.negAOffset + h] * softplus(ga + params[pc.dtBiasOffset + h]);
            beta = gatesGiven ? gb : sigmoid(gb);
        }
        gLog[li] = g;
        betaS[li] = beta;
    }
    const uint stateAt = pc.stateOffset + h * KEY_DIM * VALUE_DIM + column;  // + d * VALUE_DIM
    float s[TILES];
    for (uint tl = 0u; tl < TILES; tl++) {
        const uint d = tl * KT + tileRow;
        s[tl] = 0.0;
        if (columnIn && d < KEY_DIM) s[tl] = state[stateAt + d * VALUE_DIM];
    }
    barrier();
    if (li < CHUNK) {
        // G_li in token order, each addition's rounding error (TwoSum) carried in lo
        precise float hi = 0.0, lo = 0.0;
        for (uint t = 0u; t <= li; t++) {
            precise float x = gLog[t];
            precise float sum = hi + x;
            precise float bb = sum - hi;
            lo += (hi - (sum - bb)) + (x - bb);
            hi = sum;
        }
        gHi[li] = hi;  // read after the tile loop's barriers
        gLo[li] = lo;
    }

    // ---- 1: Gram blocks and k.S0, q.S0 over tiles of key rows (all raw: the norms are scalars applied after)
    float kk[16], qk[16];            // [4x + y]: k_i.k_j and q_i.k_j, i = 4 blockRow + x, j = 4 blockCol + y
    float ks[ROWS_PER], qs[ROWS_PER];  // k_i.S0[:, column] and q_i.S0[:, column], i = tileRow + r KT
    for (uint e = 0u; e < 16u; e++) {
        kk[e] = 0.0;
        qk[e] = 0.0;
    }
    for (uint r = 0u; r < ROWS_PER; r++) {
        ks[r] = 0.0;
        qs[r] = 0.0;
    }
    float qq = 0.0;
    const bool gramLive = blockRow >= blockCol && 4u * blockRow < S;  // blocks with some j <= i < S
    for (uint tl = 0u; tl < TILES; tl++) {
        const uint d0 = tl * KT;
        for (uint e = li; e < CHUNK * KT; e += WG) {
            const uint i = e / KT, dd = e % KT, d = d0 + dd;
            float kv = 0.0, qv = 0.0;
            if (i < S && d < KEY_DIM) {
                const uint at = i * pc.qkvStride + keyAt + d;
                kv = qkv[pc.kOffset + at];
                qv = qkv[pc.qOffset + at];
            }
            mat[K_TILE + i * TILE_STRIDE + dd] = kv;
            mat[Q_TILE + i * TILE_STRIDE + dd] = qv;
        }
        mat[STATE_TILE + tileRow * SLICE + col] = s[tl];
        barrier();
        if (gramLive) {
            for (uint dd = 0u; dd < KT; dd++) {
                float kr[4], qr[4], kc[4];
                for (uint x = 0u; x < 4u; x++) {
                    kr[x] = mat[K_TILE + (4u * blockRow + x) * TILE_STRIDE + dd];
                    qr[x] = mat[Q_TILE + (4u * blockRow + x) * TILE_STRIDE + dd];
                    kc[x] = mat[K_TILE + (4u * blockCol + x) * TILE_STRIDE + dd];
                }
                for (uint x = 0u; x < 4u; x++) {
                    for (uint y = 0u; y < 4u; y++) {
                        kk[4u * x + y] += kr[x] * kc[y];
                        qk[4u * x + y] += qr[x] * kc[y];
                    }
                }
            }
        }
        if (li < S) {
            for (uint dd = 0u; dd < KT; dd++) {
                const float qv = mat[Q_TILE + li * TILE_STRIDE + dd];
                qq += qv * qv;
            }
        }
        for (uint r = 0u; r < ROWS_PER; r++) {
            const uint i = tileRow + r * KT;
            if (i < S) {
                for (uint dd = 0u; dd < KT; dd++) {
                    const float sv = mat[STATE_TILE + dd * SLICE + col];
                    ks[r] += mat[K_TILE + i * TILE_STRIDE + dd] * sv;
                    qs[r] += mat[Q_TILE + i * TILE_STRIDE + dd] * sv;
                }
            }
        }
        barrier();
    }

    // ---- 2: the norms, A, P, R
    if (blockRow == blockCol) {
        for (uint x = 0u; x < 4u; x++) kSq[4u * blockRow + x] = kk[5u * x];
    }
    if (li < CHUNK) qSq[li] = qq;
    barrier();
    float p[16];
    for (uint x = 0u; x < 4u; x++) {
        const uint i = 4u * blockRow + x;
        for (uint y = 0u; y < 4u; y++) {
            const uint j = 4u * blockCol + y;
            float aij = 0.0, pij = 0.0;
            if (i < S && j <= i) {
                const float ikj = 1.0 / sqrt(kSq[j] + L2_EPS);
                const float decay = exp(logDecay(i, j));
                if (j < i) aij = betaS[i] * (kk[4u * x + y] * (1.0 / sqrt(kSq[i] + L2_EPS)) * ikj) * decay;
                pij = (qk[4u * x + y] * (qScale / sqrt(qSq[i] + L2_EPS)) * ikj) * decay;
            }
            mat[i * MAT_STRIDE + j] = aij;
            p[4u * x + y] = pij;
        }
    }
    for (uint r = 0u; r < ROWS_PER; r++) {
        const uint i = tileRow + r * KT;
        float rv = 0.0;
        if (i < S && columnIn) {
            const float v = qkv[pc.vOffset + i * pc.qkvStride + h * VALUE_DIM + column];
            const float eG = exp(gHi[i] + gLo[i]);
            rv = betaS[i] * (v - eG * (ks[r] * (1.0 / sqrt(kSq[i] + L2_EPS))));
            qs[r] = eG * (qs[r] * (qScale / sqrt(qSq[i] + L2_EPS)));
        }
        uv[i * SLICE + col] = rv;
    }
    if (li < CHUNK) kWeight[li] = li < S ? exp(logDecay(S - 1u, li)) / sqrt(kSq[li] + L2_EPS) : 0.0;
    barrier();

    // ---- 3: (I + A) U = R
    const uint blocks = (S + BLOCK - 1u) / BLOCK;
    if (li < blocks * BLOCK) {
        // column m of the diagonal block's inverse: x_m = 1, x_i = -sum_{m <= j < i} A_ij x_j, x_i at
        // mat[base + m][base + i] (the upper triangle, which A leaves unread); reads only its own writes
        const uint base = (li / BLOCK) * BLOCK, m = li % BLOCK;
        const uint colAt = (base + m) * MAT_STRIDE + base;
        for (uint i = m + 1u; i < BLOCK; i++) {
            const uint rowAt = (base + i) * MAT_STRIDE + base;
            float acc = mat[rowAt + m];
            for (uint j = m + 1u; j < i; j++) acc += mat[rowAt + j] * mat[colAt + j];
            mat[colAt + i] = -acc;
        }
    }
    barrier();
    for (uint bk = 0u; bk < blocks; bk++) {
        const uint base = bk * BLOCK;
        // y = R_b - A_b,<b U_<b
        for (uint e = li; e < BLOCK * SLICE; e += WG) {
            const uint i = base + e / SLICE, c = e % SLICE;
            float y = uv[i * SLICE + c];
            for (uint j = 0u; j < base; j++) y -= mat[i * MAT_STRIDE + j] * uv[j * SLICE + c];
            yBlock[e] = y;
        }
        barrier();
        // U_b = (I + A_bb)^-1 y
        for (uint e = li; e < BLOCK * SLICE; e += WG) {
            const uint il = e / SLICE, c = e % SLICE;
            float u = yBlock[e];
            for (uint m = 0u; m < il; m++) u += mat[(base + m) * MAT_STRIDE + base + il] * yBlock[m * SLICE + c];
            uv[(base + il) * SLICE + c] = u;
        }
        barrier();
    }

    // ---- 4: o = exp(G) q S0 + P U
    for (uint x = 0u; x < 4u; x++) {
        for (uint y = 0u; y < 4u; y++) mat[(4u * blockRow + x) * MAT_STRIDE + 4u * blockCol + y] = p[4u * x + y];
    }
    barrier();
    for (uint r = 0u; r < ROWS_PER; r++) {
        const uint i = tileRow + r * KT;
        if (i < S && columnIn) {
            float o = qs[r];
            for (uint j = 0u; j <= i; j++) o += mat[i * MAT_STRIDE + j] * uv[j * SLICE + col];
            outv[pc.outOffset + i * pc.outStride + h * VALUE_DIM + column] = o;
        }
    }
    barrier();

    // ---- 5: S' = exp(G_last) S0 + sum_j (exp(G_last - G_j) k_j)^T U_j
    const float lastDecay = exp(gHi[S - 1u] + gLo[S - 1u]);
    for (uint tl = 0u; tl < TILES; tl++) {
        const uint d0 = tl * KT;
        for (uint e = li; e < CHUNK * KT; e += WG) {
            const uint j = e / KT, dd = e % KT, d = d0 + dd;
            float kv = 0.0;
            if (j < S && d < KEY_DIM) kv = qkv[pc.kOffset + j * pc.qkvStride + keyAt + d] * kWeight[j];
            mat[K_TILE + j * TILE_STRIDE + dd] = kv;
        }
        barrier();
        const uint d = d0 + tileRow;
        float sn = s[tl] * lastDecay;
        for (uint j = 0u; j < S; j++) sn += mat[K_TILE + j * TILE_STRIDE + tileRow] * uv[j * SLICE + col];
        if (columnIn && d < KEY_DIM) state[stateAt + d * VALUE_DIM] = sn;
        barrier();
    }
}
