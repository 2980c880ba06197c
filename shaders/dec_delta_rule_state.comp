#version 450
// dec_delta_rule_state: the state-carrying half of a long prompt's gated delta rule, after
// dec_delta_rule_prepare.comp (whose header has the notation). Workgroup (h, y) owns value head h's
// state columns y*SLICE .. y*SLICE+SLICE-1 and walks the call's chunks in order inside one dispatch,
// its state slice in registers throughout (read once, written once):
//   U = u - W S            (u read from out, where the prepare pass left it)
//   o_i = qFactor_i q_i S + sum_{j<=i} P_ij U_j                      -> out, over u
//   S = decay S + sum_j kFactor_j k_j^T U_j
// q and k are the raw conv outputs (their norms are in the factors). Invocation (col, tileRow) keeps
// state entry (tl*KT + tileRow, column) of each key tile tl, and the (token, column) entries
// tileRow + r*KT of U and o, as dec_delta_rule_chunked.comp does.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint KEY_DIM = 128;
layout(constant_id = 1) const uint VALUE_DIM = 128;
layout(constant_id = 2) const uint SLICE = 16;  // value columns per workgroup

const uint WG = 256;
const uint CHUNK = 64;
const uint KT = WG / SLICE;          // key rows a tile: one state entry per invocation
const uint TILES = (KEY_DIM + KT - 1) / KT;
const uint ROWS_PER = CHUNK / KT;    // token rows per invocation
const uint MAT_STRIDE = CHUNK + 1;
const uint TILE_STRIDE = KT + 1;
const uint F_STRIDE = 2 * CHUNK + 4;

layout(set = 0, binding = 0) readonly buffer QKV { float qkv[]; };
layout(set = 0, binding = 1) buffer State { float state[]; };
layout(set = 0, binding = 2) buffer Out { float outv[]; };
layout(set = 0, binding = 3) readonly buffer WScratch { float wIn[]; };
layout(set = 0, binding = 4) readonly buffer PScratch { float pIn[]; };
layout(set = 0, binding = 5) readonly buffer FScratch { float fIn[]; };

layout(push_constant) uniform Push {
    uint S;
    uint keyHeads;
    uint valueHeads;
    uint qOffset;
    uint kOffset;
    uint qkvStride;
    uint outOffset;
    uint outStride;
    uint stateOffset;   // floats: [valueHeads][KEY_DIM][VALUE_DIM]
    uint scratchHeads;
    uint headBase;
} pc;

shared float tileA[CHUNK * TILE_STRIDE];  // W's tile, then the scaled k tile
shared float tileB[CHUNK * TILE_STRIDE];  // q's tile
shared float stateTile[KT * SLICE];
shared float pmat[CHUNK * MAT_STRIDE];
shared float uv[CHUNK * SLICE];
shared float factors[F_STRIDE];

void main() {
    const uint h = gl_WorkGroupID.x;
    if (h >= pc.valueHeads) return;  // uniform per workgroup
    const uint S = pc.S;
    const uint li = gl_LocalInvocationIndex;
    const uint kh = h / (pc.valueHeads / pc.keyHeads);
    const uint col = li % SLICE, tileRow = li / SLICE;
    const uint column = gl_WorkGroupID.y * SLICE + col;
    const bool columnIn = column < VALUE_DIM;
    const uint keyAt = kh * KEY_DIM;
    const uint stateAt = pc.stateOffset + h * KEY_DIM * VALUE_DIM + column;  // + d * VALUE_DIM

    float s[TILES];
    for (uint tl = 0u; tl < TILES; tl++) {
        const uint d = tl * KT + tileRow;
        s[tl] = 0.0;
        if (columnIn && d < KEY_DIM) s[tl] = state[stateAt + d * VALUE_DIM];
    }

    const uint chunks = (S + CHUNK - 1u) / CHUNK;
    for (uint c = 0u; c < chunks; c++) {
        const uint t0 = c * CHUNK, n = min(CHUNK, S - t0);
        const uint scratchHead = c * pc.scratchHeads + pc.headBase + h;
        // P and the factors, read after the first tile's barrier (the last chunk's readers are behind its barriers)
        for (uint e = li; e < CHUNK * CHUNK; e += WG) pmat[(e / CHUNK) * MAT_STRIDE + e % CHUNK] = pIn[scratchHead * CHUNK * CHUNK + e];
        if (li < F_STRIDE) factors[li] = fIn[scratchHead * F_STRIDE + li];

        // ---- W S and q S over tiles of key rows
        float ws[ROWS_PER], qs[ROWS_PER];
        for (uint r = 0u; r < ROWS_PER; r++) {
            ws[r] = 0.0;
            qs[r] = 0.0;
        }
        for (uint tl = 0u; tl < TILES; tl++) {
            const uint d0 = tl * KT;
            for (uint e = li; e < CHUNK * KT; e += WG) {
                const uint i = e / KT, dd = e % KT, d = d0 + dd;
                float wv = 0.0, qv = 0.0;
                if (i < n && d < KEY_DIM) {
                    const uint t = t0 + i;
                    wv = wIn[(t * pc.scratchHeads + pc.headBase + h) * KEY_DIM + d];
                    qv = qkv[pc.qOffset + t * pc.qkvStride + keyAt + d];
                }
                tileA[i * TILE_STRIDE + dd] = wv;
                tileB[i * TILE_STRIDE + dd] = qv;
            }
            stateTile[tileRow * SLICE + col] = s[tl];
            barrier();
            for (uint r = 0u; r < ROWS_PER; r++) {
                const uint i = tileRow + r * KT;
                if (i < n) {
                    for (uint dd = 0u; dd < KT; dd++) {
                        const float sv = stateTile[dd * SLICE + col];
                        ws[r] += tileA[i * TILE_STRIDE + dd] * sv;
                        qs[r] += tileB[i * TILE_STRIDE + dd] * sv;
                    }
                }
            }
            barrier();
        }

        // ---- U = u - W S (shared); o = qFactor q S + P U (out, over u: the same invocation's entries)
        for (uint r = 0u; r < ROWS_PER; r++) {
            const uint i = tileRow + r * KT;
            float u = 0.0;
            if (i < n && columnIn) u = outv[pc.outOffset + (t0 + i) * pc.outStride + h * VALUE_DIM + column] - ws[r];
            uv[i * SLICE + col] = u;
        }
        barrier();
        for (uint r = 0u; r < ROWS_PER; r++) {
            const uint i = tileRow + r * KT;
            if (i < n && columnIn) {
                float o = factors[i] * qs[r];
                for (uint j = 0u; j <= i; j++) o += pmat[i * MAT_STRIDE + j] * uv[j * SLICE + col];
                outv[pc.outOffset + (t0 + i) * pc.outStride + h * VALUE_DIM + column] = o;
            }
        }

        // ---- S = decay S + sum_j (kFactor_j k_j)^T U_j
        const float decay = factors[2u * CHUNK];
        for (uint tl = 0u; tl < TILES; tl++) {
            const uint d0 = tl * KT;
            for (uint e = li; e < CHUNK * KT; e += WG) {
                const uint j = e / KT, dd = e % KT, d = d0 + dd;
                float kv = 0.0;
                if (j < n && d < KEY_DIM) kv = qkv[pc.kOffset + (t0 + j) * pc.qkvStride + keyAt + d] * factors[CHUNK + j];
                tileA[j * TILE_STRIDE + dd] = kv;
            }
            barrier();
            float sn = s[tl] * decay;
            for (uint j = 0u; j < n; j++) sn += tileA[j * TILE_STRIDE + tileRow] * uv[j * SLICE + col];
            s[tl] = sn;
            barrier();
        }
    }

    for (uint tl = 0u; tl < TILES; tl++) {
        const uint d = tl * KT + tileRow;
        if (columnIn && d < KEY_DIM) state[stateAt + d * VALUE_DIM] = s[tl];
    }
}
