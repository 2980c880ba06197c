#version 450
// dec_delta_rule_prepare: the state-independent half of a long prompt's gated delta rule (the split
// form of FLA's chunk_gated_delta_rule; dec_delta_rule_state.comp is the other half). Workgroup
// (h, c) takes value head h's tokens 64c .. 64c + 63 (chunk c of the call) and forms, with the
// notation of dec_delta_rule_chunked.comp (G the chunk's cumulative log decay, k and q normalised,
// q scaled, T = (I + A)^-1):
//   u = T (beta v)                    (the deltas U of a zero state)    -> out, in place of o
//   W = T (beta exp(G) k)             (U = u - W S0 for a state S0)     -> the W scratch
//   P_ij = (q_i.k_j) exp(G_i - G_j)   (j <= i, else 0)                  -> the P scratch
//   qFactor_i = exp(G_i) / |q_i| / sqrt(KEY_DIM), kFactor_j = exp(G_last - G_j) / |k_j|,
//   decay = exp(G_last)                                                 -> the factors scratch
// so that chunk c's step from its state S0 is U = u - W S0, o_i = qFactor_i q_i S0 + sum_j P_ij U_j,
// S' = decay S0 + sum_j kFactor_j k_j^T U_j: small products only, the chunk's triangular solve and
// Gram matrices done once per head here for all chunks at once (dec_delta_rule_chunked recomputes
// them in each of its workgroups, one chunk a dispatch). G is the compensated sum of the chunked
// kernel, every decay exp of a difference.
//
// Phases: gates and G; the Gram blocks k.k^T and q.k^T over tiles of key rows (a 4x4 register block
// per invocation on a 16x16 grid, as the chunked kernel); A into shared memory, P and the factors out;
// then (I + A) x = r for the right-hand columns (beta v's VALUE_DIM, then beta exp(G) k's KEY_DIM),
// 32 at a time in shared memory, by blocks as dec_delta_rule_chunked solves its slice.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint KEY_DIM = 128;
layout(constant_id = 1) const uint VALUE_DIM = 128;

const uint WG = 256;
const bool USE_SUBGROUP = false;  // dec_linear_attention.glsl's reduction is unused here
const uint CHUNK = 64;
const uint KT = 16;               // key rows a Gram tile
const uint TILES = (KEY_DIM + KT - 1) / KT;
const uint MAT_STRIDE = CHUNK + 1;
const uint TILE_STRIDE = KT + 1;
const uint K_TILE = 0;
const uint Q_TILE = CHUNK * TILE_STRIDE;
const uint F_STRIDE = 2 * CHUNK + 4;  // qFactor[CHUNK], kFactor[CHUNK], decay, padding
const uint BLOCK = 16;                // diagonal blocks of the triangular solve
const uint GROUP = 32;                // right-hand columns solved at a time
const float L2_EPS = 1e-6;

#include "dec_linear_attention.glsl"

layout(set = 0, binding = 0) readonly buffer QKV { float qkv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };
layout(set = 0, binding = 2) readonly buffer B { float b[]; };
layout(set = 0, binding = 3) readonly buffer Params { float params[]; };
layout(set = 0, binding = 4) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 5) writeonly buffer WScratch { float wOut[]; };
layout(set = 0, binding = 6) writeonly buffer PScratch { float pOut[]; };
layout(set = 0, binding = 7) writeonly buffer FScratch { float fOut[]; };

layout(push_constant) uniform Push {
    uint S;
    uint keyHeads;
    uint valueHeads;
    uint qOffset;       // floats: token t's key head kh at qOffset + t * qkvStride + kh * KEY_DIM
    uint kOffset;
    uint vOffset;       // floats: value head h at vOffset + t * qkvStride + h * VALUE_DIM
    uint qkvStride;
    uint aOffset;       // floats: a (or g) of (t, h) at aOffset + t * aStride + h
    uint aStride;
    uint bOffset;
    uint bStride;
    uint outOffset;     // floats: u of (t, h) at outOffset + t * outStride + h * VALUE_DIM
    uint outStride;
    uint negAOffset;
    uint dtBiasOffset;
    uint flags;         // bit 1: a, b hold g and beta as they are
    uint scratchHeads;  // the scratch's heads: W of (t, h) at ((t * scratchHeads + headBase + h) * KEY_DIM),
    uint headBase;      // P of (c, h) at (c * scratchHeads + headBase + h) * CHUNK * CHUNK, factors * F_STRIDE
} pc;

shared float mat[CHUNK * MAT_STRIDE];  // the k and q tiles, then A (strictly lower) and the diagonal blocks' inverses
shared float rhs[CHUNK * GROUP];       // a group of right-hand columns, then their solutions
shared float yBlock[BLOCK * GROUP];
shared float gLog[CHUNK];
shared float gHi[CHUNK];               // G = gHi + gLo
shared float gLo[CHUNK];
shared float betaS[CHUNK];
shared float kSq[CHUNK];
shared float qSq[CHUNK];

float logDecay(uint i, uint j) {
    precise float d = (gHi[i] - gHi[j]) + (gLo[i] - gLo[j]);
    return d;
}

void main() {
    const uint h = gl_WorkGroupID.x, c = gl_WorkGroupID.y;
    const uint t0 = c * CHUNK;
    if (h >= pc.valueHeads || t0 >= pc.S) return;  // uniform per workgroup
    const uint n = min(CHUNK, pc.S - t0);
    const uint li = gl_LocalInvocationIndex;
    const uint kh = h / (pc.valueHeads / pc.keyHeads);
    const bool gatesGiven = (pc.flags & 2u) != 0u;
    const float qScale = 1.0 / sqrt(float(KEY_DIM));
    const uint blockRow = li / 16u, blockCol = li % 16u;
    const uint keyAt = kh * KEY_DIM;
    const uint scratchHead = c * pc.scratchHeads + pc.headBase + h;

    if (li < CHUNK) {
        float g = 0.0, beta = 0.0;  // padded tokens change nothing
        if (li < n) {
            const uint t = t0 + li;
            const float ga = a[pc.aOffset + t * pc.aStride + h];
            const float gb = b[pc.bOffset + t * pc.bStride + h];
            g = gatesGiven ? ga : params[pc.negAOffset + h] * softplus(ga + params[pc.dtBiasOffset + h]);
            beta = gatesGiven ? gb : sigmoid(gb);
        }
        gLog[li] = g;
        betaS[li] = beta;
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

    // ---- the Gram blocks over tiles of key rows (raw: the norms are scalars applied after)
    float kk[16], qk[16];  // [4x + y]: k_i.k_j and q_i.k_j, i = 4 blockRow + x, j = 4 blockCol + y
    for (uint e = 0u; e < 16u; e++) {
        kk[e] = 0.0;
        qk[e] = 0.0;
    }
    float qq = 0.0;
    const bool gramLive = blockRow >= blockCol && 4u * blockRow < n;
    for (uint tl = 0u; tl < TILES; tl++) {
        const uint d0 = tl * KT;
        for (uint e = li; e < CHUNK * KT; e += WG) {
            const uint i = e / KT, dd = e % KT, d = d0 + dd;
            float kv = 0.0, qv = 0.0;
            if (i < n && d < KEY_DIM) {
                const uint at = (t0 + i) * pc.qkvStride + keyAt + d;
                kv = qkv[pc.kOffset + at];
                qv = qkv[pc.qOffset + at];
            }
            mat[K_TILE + i * TILE_STRIDE + dd] = kv;
            mat[Q_TILE + i * TILE_STRIDE + dd] = qv;
        }
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
        if (li < n) {
            for (uint dd = 0u; dd < KT; dd++) {
                const float qv = mat[Q_TILE + li * TILE_STRIDE + dd];
                qq += qv * qv;
            }
        }
        barrier();
    }

    // ---- the norms, A (shared), P and the factors (out)
    if (blockRow == blockCol) {
        for (uint x = 0u; x < 4u; x++) kSq[4u * blockRow + x] = kk[5u * x];
    }
    if (li < CHUNK) qSq[li] = qq;
    barrier();
    const uint pAt = scratchHead * CHUNK * CHUNK;
    for (uint x = 0u; x < 4u; x++) {
        const uint i = 4u * blockRow + x;
        for (uint y = 0u; y < 4u; y++) {
            const uint j = 4u * blockCol + y;
            float aij = 0.0, pij = 0.0;
            if (i < n && j <= i) {
                const float ikj = 1.0 / sqrt(kSq[j] + L2_EPS);
                const float decay = exp(logDecay(i, j));
                if (j < i) aij = betaS[i] * (kk[4u * x + y] * (1.0 / sqrt(kSq[i] + L2_EPS)) * ikj) * decay;
                pij = (qk[4u * x + y] * (qScale / sqrt(qSq[i] + L2_EPS)) * ikj) * decay;
            }
            mat[i * MAT_STRIDE + j] = aij;
            pOut[pAt + i * CHUNK + j] = pij;
        }
    }
    const uint fAt = scratchHead * F_STRIDE;
    if (li < CHUNK) {
        const bool live = li < n;
        fOut[fAt + li] = live ? exp(gHi[li] + gLo[li]) * (qScale / sqrt(qSq[li] + L2_EPS)) : 0.0;
        fOut[fAt + CHUNK + li] = live ? exp(logDecay(n - 1u, li)) / sqrt(kSq[li] + L2_EPS) : 0.0;
    } else if (li >= 2u * CHUNK && li < F_STRIDE) {
        fOut[fAt + li] = li == 2u * CHUNK ? exp(gHi[n - 1u] + gLo[n - 1u]) : 0.0;
    }
    barrier();

    // ---- (I + A) x = r over the right-hand columns (beta v's VALUE_DIM, then beta exp(G) k's KEY_DIM), GROUP
    // at a time in shared memory: the 16 x 16 diagonal blocks inverted once (column m of a block's inverse
    // at mat[base + m][base + i], the upper triangle A leaves unread), then per group block forward
    // substitution as dec_delta_rule_chunked's (y = r_b - A_b,<b x_<b, x_b = inv(I + A_bb) y)
    const uint blocks = (n + BLOCK - 1u) / BLOCK;
    if (li < blocks * BLOCK) {
        const uint base = (li / BLOCK) * BLOCK, m = li % BLOCK;
        const uint colAt = (base + m) * MAT_STRIDE + base;
        for (uint i = m + 1u; i < BLOCK; i++) {
            const uint rowAt = (base + i) * MAT_STRIDE + base;
            float acc = mat[rowAt + m];
            for (uint j = m + 1u; j < i; j++) acc += mat[rowAt + j] * mat[colAt + j];
            mat[colAt + i] = -acc;
        }
    }
    for (uint g0 = 0u; g0 < VALUE_DIM + KEY_DIM; g0 += GROUP) {
        for (uint e = li; e < CHUNK * GROUP; e += WG) {
            const uint i = e / GROUP, col = g0 + e % GROUP;
            float v = 0.0;
            if (i < n && col < VALUE_DIM + KEY_DIM) {
                const uint t = t0 + i;
                if (col < VALUE_DIM) v = betaS[i] * qkv[pc.vOffset + t * pc.qkvStride + h * VALUE_DIM + col];
                else v = betaS[i] * exp(gHi[i] + gLo[i]) * (qkv[pc.kOffset + t * pc.qkvStride + keyAt + col - VALUE_DIM] * (1.0 / sqrt(kSq[i] + L2_EPS)));
            }
            rhs[e] = v;
        }
        barrier();  // also orders the block inverses above before their first reads
        for (uint bk = 0u; bk < blocks; bk++) {
            const uint base = bk * BLOCK;
            for (uint e = li; e < BLOCK * GROUP; e += WG) {
                const uint i = base + e / GROUP, c = e % GROUP;
                float y = rhs[i * GROUP + c];
                for (uint j = 0u; j < base; j++) y -= mat[i * MAT_STRIDE + j] * rhs[j * GROUP + c];
                yBlock[e] = y;
            }
            barrier();
            for (uint e = li; e < BLOCK * GROUP; e += WG) {
                const uint il = e / GROUP, c = e % GROUP;
                float u = yBlock[e];
                for (uint m = 0u; m < il; m++) u += mat[(base + m) * MAT_STRIDE + base + il] * yBlock[m * GROUP + c];
                rhs[(base + il) * GROUP + c] = u;
            }
            barrier();
        }
        for (uint e = li; e < n * GROUP; e += WG) {
            const uint i = e / GROUP, col = g0 + e % GROUP, t = t0 + i;
            if (col < VALUE_DIM) outv[pc.outOffset + t * pc.outStride + h * VALUE_DIM + col] = rhs[e];
            else if (col < VALUE_DIM + KEY_DIM) wOut[(t * pc.scratchHeads + pc.headBase + h) * KEY_DIM + col - VALUE_DIM] = rhs[e];
        }
        barrier();  // the group's rows read before the next group's are written
    }
}
