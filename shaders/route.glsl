// route.glsl: dec_route's algorithm for one token (see dec_route.comp), shared with
// dec_router_route so that its tables are these bits.
//
// The includer declares the spec constant USE_SUBGROUP, WG (the workgroup size: a power of two
// >= MAX_K), the buffers logits[] (read), table[], work[], pairs[], slotWeight[], slotExpert[],
// chosen[] as dec_route's, and a push-constant block pc with S, K, tableOffset, chosenOffset and
// seq as dec_route's (E, logitsOffset and the normalize flag are arguments).

const uint MAX_E = 512u;
const uint MAX_K = 16u;
const uint NONE = 0xFFFFFFFFu;
const float NEG_INF = -1.0 / 0.0;  // folded by glslang to -Infinity

// The logits, then exp(x - max) (NaN and, with PER > 1, pad ids: -1). Ids < WG*PER < E + WG, and
// PER > 1 only where WG < E (WG <= MAX_E / 2): at most 768. 15.2 KiB in all at WG = 1024.
shared float prob[MAX_E + MAX_E / 2u];
shared vec4 groupMax4[WG / 4u];  // thread t's group maximum at [t / 4][t % 4]
shared vec4 partMax4[WG / 4u];   // per-thread (or per-subgroup) partials, read as vec4s
shared vec4 partSum4[WG / 4u];
shared uint topGroup[MAX_K];     // the group of rank j (stage 2)
shared float pickValue[MAX_K];
shared uint pickId[MAX_K];

bool above(float va, uint ia, float vb, uint ib) { return va > vb || (va == vb && ia < ib); }

// Token `token`'s routing (token < pc.S) from its `experts` logits at logitsOffset + token *
// experts, normalising the k weights when `normalize`. Called by the whole workgroup in uniform
// control flow; the caller separates two calls by a barrier (they share the shared arrays).
void routeToken(const uint token, const uint experts, const uint logitsOffset, const bool normalize) {
    const uint t = gl_LocalInvocationIndex;
    const uint E = min(experts, MAX_E);
    const uint K = min(pc.K, MAX_K);
    const uint lo = logitsOffset + token * experts;
    const uint PER = (E + WG - 1u) / WG;
    const uint first = t * PER;

    // Every invocation owns prob[first .. first + PER - 1]: only it writes them (before the
    // second barrier); stage 2 reads them all.
    float m = NEG_INF;
    for (uint i = 0u; i < PER; ++i) {
        const uint e = first + i;
        if (e < E) {
            const float x = logits[lo + e];
            prob[e] = x;
            m = max(m, x);
        }
    }
    float mx;
    if (USE_SUBGROUP) {
        m = subgroupMax(m);
        if (subgroupElect()) partMax4[gl_SubgroupID >> 2u][gl_SubgroupID & 3u] = m;
        barrier();
        mx = NEG_INF;
        for (uint s = 0u; s < gl_NumSubgroups; ++s) mx = max(mx, partMax4[s >> 2u][s & 3u]);
    } else {
        partMax4[t >> 2u][t & 3u] = m;
        barrier();
        vec4 m4 = vec4(NEG_INF);
        for (uint q = 0u; q < WG / 4u; ++q) m4 = max(m4, partMax4[q]);
        mx = max(max(m4.x, m4.y), max(m4.z, m4.w));
    }

    float sum = 0.0;
    float gmax = -1.0;
    for (uint i = 0u; i < PER; ++i) {
        const uint e = first + i;
        float r = -1.0;
        if (e < E) {
            const float v = exp(prob[e] - mx);
            sum += v;
            if (v >= 0.0) r = v;  // NaN: -1
        }
        if (PER > 1u) prob[e] = r;  // pad ids too; unread with PER = 1
        gmax = max(gmax, r);
    }
    groupMax4[t >> 2u][t & 3u] = gmax;
    if (USE_SUBGROUP) {
        sum = subgroupAdd(sum);
        if (subgroupElect()) partSum4[gl_SubgroupID >> 2u][gl_SubgroupID & 3u] = sum;
    } else {
        partSum4[t >> 2u][t & 3u] = sum;
    }
    barrier();

    // Stage 1: the rank of this group's maximum among all WG, ties to the lower thread:
    // u < t counts with >=, u > t with >, u = t not at all.
    {
        const uint tq = t >> 2u;
        const vec4 g = vec4(gmax);
        uvec4 c = uvec4(0u);
        for (uint q = 0u; q < tq; ++q) c += uvec4(greaterThanEqual(groupMax4[q], g));
        const vec4 mid = groupMax4[tq];
        const uvec4 lower = uvec4(lessThan(uvec4(0u, 1u, 2u, 3u), uvec4(t & 3u)));
        c += lower * uvec4(greaterThanEqual(mid, g)) + (uvec4(1u) - lower) * uvec4(greaterThan(mid, g));
        for (uint q = tq + 1u; q < WG / 4u; ++q) c += uvec4(greaterThan(groupMax4[q], g));
        const uint rank = c.x + c.y + c.z + c.w;  // a permutation of 0..WG-1 over the threads
        if (rank < K) {
            if (PER == 1u) {
                pickValue[rank] = gmax;
                pickId[rank] = gmax >= 0.0 ? t : NONE;
            } else {
                topGroup[rank] = t;
            }
        }
    }
    if (PER > 1u) {
        // Stage 2: the K*PER candidates (distinct ids, possibly pad ids of value -1) among themselves.
        barrier();
        const uint C = K * PER;
        for (uint c = t; c < C; c += WG) {
            const uint id = topGroup[c / PER] * PER + c % PER;
            const float v = prob[id];
            uint rank = 0u;
            for (uint j = 0u; j < K; ++j) {
                const uint base = topGroup[j] * PER;
                for (uint i = 0u; i < PER; ++i) rank += uint(above(prob[base + i], base + i, v, id));
            }
            if (rank < K) {
                pickValue[rank] = v;
                pickId[rank] = v >= 0.0 ? id : NONE;
            }
        }
    }
    barrier();

    if (token == 0u && t == 0u) work[0] = uvec4(pc.S, K, pc.S * K, pc.seq);
    if (t < K) {
        float denom = 0.0;
        if (normalize) {
            for (uint j = 0u; j < K; ++j) denom += pickValue[j];
        } else if (USE_SUBGROUP) {
            for (uint s = 0u; s < gl_NumSubgroups; ++s) denom += partSum4[s >> 2u][s & 3u];
        } else {
            vec4 s4 = vec4(0.0);
            for (uint q = 0u; q < WG / 4u; ++q) s4 += partSum4[q];
            denom = (s4.x + s4.y) + (s4.z + s4.w);
        }
        const uint id = pickId[t];
        const uint u = token * K + t;
        const uvec2 handle = id < E ? table[pc.tableOffset + id] : uvec2(NONE);  // NONE: NaN logits only
        work[1u + u] = uvec4(handle, u, 1u);
        pairs[u] = u;
        slotWeight[u] = pickValue[t] / denom;
        slotExpert[u] = handle;
        chosen[pc.chosenOffset + u] = id;
    }
}
