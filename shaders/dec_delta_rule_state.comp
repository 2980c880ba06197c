#version 450
// dec_delta_rule_state: the state-carrying half of a long prompt's gated delta rule, after
// dec_delta_rule_prepare.comp (whose header has the notation). Workgroup (h, y) owns value head h's
// state columns y*SLICE .. y*SLICE+SLICE-1 and walks the call's chunks in order inside one dispatch,
// its state slice in registers throughout (read once, written once):
//   U = u - W S            (u read from out, where the prepare pass left it)
//   o_i = qFactor_i q_i S + sum_{j<=i} P_ij U_j                      -> out, over u
//   S = decay S + sum_j kFactor_j k_j^T U_j
// q and k are the raw conv outputs (their norms are in the factors). Invocation (col, part) keeps
// state rows part*D_PER .. part*D_PER+D_PER-1 of its column and the (token, column) entries
// part + r*PARTS of U and o. Only the state slice (once a chunk) and U go through shared memory: W,
// q, k and P are read from memory by the invocations that use them (the 16 columns of a row read the
// same words), so a chunk takes two barriers, not a pair per key tile.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint KEY_DIM = 128;
layout(constant_id = 1) const uint VALUE_DIM = 128;
layout(constant_id = 2) const uint SLICE = 16;  // value columns per workgroup

const uint WG = 256;
const uint CHUNK = 64;
const uint PARTS = WG / SLICE;                   // invocations per column
const uint D_PER = (KEY_DIM + PARTS - 1) / PARTS;  // state rows per invocation
const uint ROWS_PER = CHUNK / PARTS;             // token rows per invocation
const uint F_STRIDE = 2 * CHUNK + 4;
const bool KEY_VEC4 = KEY_DIM % 4 == 0;         // W rows are vec4s, and with flags bit 0 q and k rows too
const bool STATE_VEC4 = KEY_VEC4 && D_PER % 4 == 0;  // an invocation's state rows are whole vec4s of k
const uint K_VECS = D_PER / 4 > 0 ? D_PER / 4 : 1;   // vec4s of k an invocation reads a token (an array size: never 0)

layout(set = 0, binding = 0) readonly buffer QKV { float qkv[]; };
layout(set = 0, binding = 0) readonly buffer QKV4 { vec4 qkv4[]; };
layout(set = 0, binding = 1) buffer State { float state[]; };
layout(set = 0, binding = 2) buffer Out { float outv[]; };
layout(set = 0, binding = 3) readonly buffer WScratch { float wIn[]; };
layout(set = 0, binding = 3) readonly buffer WScratch4 { vec4 wIn4[]; };
layout(set = 0, binding = 4) readonly buffer PScratch4 { vec4 pIn4[]; };
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
    uint flags;         // bit 0: q and k rows start on 16-byte boundaries (qOffset, kOffset, qkvStride, KEY_DIM multiples of 4)
} pc;

shared float stateS[PARTS * D_PER * SLICE];  // the slice at the chunk's start, [d][col]
shared float uv[CHUNK * SLICE];              // U
shared float factors[2 * F_STRIDE];          // by chunk parity: a chunk's are read until its end

void main() {
    const uint h = gl_WorkGroupID.x;
    if (h >= pc.valueHeads) return;  // uniform per workgroup
    const uint S = pc.S;
    const uint li = gl_LocalInvocationIndex;
    const uint kh = h / (pc.valueHeads / pc.keyHeads);
    const uint col = li % SLICE, part = li / SLICE;
    const uint column = gl_WorkGroupID.y * SLICE + col;
    const bool columnIn = column < VALUE_DIM;
    const uint keyAt = kh * KEY_DIM;
    const uint d0 = part * D_PER;
    const uint stateAt = pc.stateOffset + h * KEY_DIM * VALUE_DIM + column;  // + d * VALUE_DIM
    const bool vecRows = (pc.flags & 1u) != 0u;

    float s[D_PER];
    for (uint e = 0u; e < D_PER; e++) {
        const uint d = d0 + e;
        s[e] = 0.0;
        if (columnIn && d < KEY_DIM) s[e] = state[stateAt + d * VALUE_DIM];
    }

    const uint chunks = (S + CHUNK - 1u) / CHUNK;
    for (uint c = 0u; c < chunks; c++) {
        const uint t0 = c * CHUNK, n = min(CHUNK, S - t0);
        const uint scratchHead = c * pc.scratchHeads + pc.headBase + h;
        const uint fAt = (c & 1u) * F_STRIDE;
        for (uint e = 0u; e < D_PER; e++) stateS[(d0 + e) * SLICE + col] = s[e];
        if (li < F_STRIDE) factors[fAt + li] = fIn[scratchHead * F_STRIDE + li];
        barrier();

        // ---- W S and q S: this invocation's token rows, the slice from shared memory (vec4 rows: the rows
        // inside the loop over key columns, so that each step has all their loads in flight at once)
        float ws[ROWS_PER], qs[ROWS_PER];
        for (uint r = 0u; r < ROWS_PER; r++) {
            ws[r] = 0.0;
            qs[r] = 0.0;
        }
        if (KEY_VEC4 && vecRows) {
            uint wRow[ROWS_PER], qRow[ROWS_PER];
            for (uint r = 0u; r < ROWS_PER; r++) {
                const uint t = t0 + min(part + r * PARTS, n - 1u);  // rows past n read row n - 1 (their sums unused)
                wRow[r] = (t * pc.scratchHeads + pc.headBase + h) * (KEY_DIM / 4u);
                qRow[r] = (pc.qOffset + t * pc.qkvStride + keyAt) / 4u;
            }
            for (uint d4 = 0u; d4 < KEY_DIM / 4u; d4++) {
                const uint d = 4u * d4;
                const vec4 sv = vec4(stateS[d * SLICE + col], stateS[(d + 1u) * SLICE + col], stateS[(d + 2u) * SLICE + col], stateS[(d + 3u) * SLICE + col]);
                for (uint r = 0u; r < ROWS_PER; r++) {
                    const vec4 w = wIn4[wRow[r] + d4], q = qkv4[qRow[r] + d4];
                    ws[r] += w.x * sv.x; ws[r] += w.y * sv.y; ws[r] += w.z * sv.z; ws[r] += w.w * sv.w;
                    qs[r] += q.x * sv.x; qs[r] += q.y * sv.y; qs[r] += q.z * sv.z; qs[r] += q.w * sv.w;
                }
            }
        } else {
            for (uint r = 0u; r < ROWS_PER; r++) {
                const uint i = part + r * PARTS;
                if (i < n) {
                    const uint t = t0 + i;
                    const uint wAt = (t * pc.scratchHeads + pc.headBase + h) * KEY_DIM;
                    const uint qAt = pc.qOffset + t * pc.qkvStride + keyAt;
                    for (uint d = 0u; d < KEY_DIM; d++) {
                        const float sv = stateS[d * SLICE + col];
                        ws[r] += wIn[wAt + d] * sv;
                        qs[r] += qkv[qAt + d] * sv;
                    }
                }
            }
        }

        // ---- U = u - W S (shared); o = qFactor q S + P U (out, over u: the same invocation's entries)
        for (uint r = 0u; r < ROWS_PER; r++) {
            const uint i = part + r * PARTS;
            float u = 0.0;
            if (i < n && columnIn) u = outv[pc.outOffset + (t0 + i) * pc.outStride + h * VALUE_DIM + column] - ws[r];
            uv[i * SLICE + col] = u;
        }
        barrier();
        const uint pAt = scratchHead * CHUNK * CHUNK;
        for (uint r = 0u; r < ROWS_PER; r++) {
            const uint i = part + r * PARTS;
            if (i < n && columnIn) {
                float o = factors[fAt + i] * qs[r];
                const uint rowAt = (pAt + i * CHUNK) / 4u;
                for (uint j4 = 0u; 4u * j4 <= i; j4++) {
                    const vec4 pv = pIn4[rowAt + j4];  // P_ij is 0 past the diagonal
                    const uint j = 4u * j4;
                    o += pv.x * uv[j * SLICE + col];
                    o += pv.y * uv[(j + 1u) * SLICE + col];
                    o += pv.z * uv[(j + 2u) * SLICE + col];
                    o += pv.w * uv[(j + 3u) * SLICE + col];
                }
                outv[pc.outOffset + (t0 + i) * pc.outStride + h * VALUE_DIM + column] = o;
            }
        }

        // ---- S = decay S + sum_j (kFactor_j k_j)^T U_j (U and the factors read until the next chunk's first barrier)
        const float decay = factors[fAt + 2u * CHUNK];
        for (uint e = 0u; e < D_PER; e++) s[e] *= decay;
        uint j = 0u;
        if (STATE_VEC4 && vecRows) {
            // four tokens' k rows loaded before any is added (the sums in token order as below)
            for (; j + 4u <= n; j += 4u) {
                vec4 kv[4][K_VECS];
                float uj[4];
                for (uint jj = 0u; jj < 4u; jj++) {
                    const uint kAt = (pc.kOffset + (t0 + j + jj) * pc.qkvStride + keyAt + d0) / 4u;
                    for (uint e4 = 0u; e4 < D_PER / 4u; e4++) kv[jj][e4] = qkv4[kAt + e4];
                    uj[jj] = uv[(j + jj) * SLICE + col] * factors[fAt + CHUNK + j + jj];
                }
                for (uint jj = 0u; jj < 4u; jj++) {
                    for (uint e4 = 0u; e4 < D_PER / 4u; e4++) {
                        s[4u * e4] += kv[jj][e4].x * uj[jj];
                        s[4u * e4 + 1u] += kv[jj][e4].y * uj[jj];
                        s[4u * e4 + 2u] += kv[jj][e4].z * uj[jj];
                        s[4u * e4 + 3u] += kv[jj][e4].w * uj[jj];
                    }
                }
            }
        }
        for (; j < n; j++) {
            const float uj = uv[j * SLICE + col] * factors[fAt + CHUNK + j];
            const uint kAt = pc.kOffset + (t0 + j) * pc.qkvStride + keyAt + d0;
            if (STATE_VEC4 && vecRows) {
                for (uint e4 = 0u; e4 < D_PER / 4u; e4++) {
                    const vec4 kv = qkv4[kAt / 4u + e4];
                    s[4u * e4] += kv.x * uj;
                    s[4u * e4 + 1u] += kv.y * uj;
                    s[4u * e4 + 2u] += kv.z * uj;
                    s[4u * e4 + 3u] += kv.w * uj;
                }
            } else {
                for (uint e = 0u; e < D_PER; e++) {
                    if (d0 + e < KEY_DIM) s[e] += qkv[kAt + e] * uj;
                }
            }
        }
    }

    for (uint e = 0u; e < D_PER; e++) {
        const uint d = d0 + e;
        if (columnIn && d < KEY_DIM) state[stateAt + d * VALUE_DIM] = s[e];
    }
}
