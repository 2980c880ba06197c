#version 450
// dec_route: the MoE router of S tokens (one workgroup each) as src/model/ops.ts routeTopK: softmax
// over the token's E logits in f32 (max-subtracted, exp, sum), the k largest probabilities,
// largest first, ties to the lowest expert id, weights = the probabilities, divided by their sum
// with NORMALIZE (flags bit 0). The selection ranks the unnormalised exp(x - max) (the same
// order as the probabilities); weights are e_j / sum(e) or e_j / (e_0 + ... + e_{k-1}), the
// latter summed in j order by every writer. Then writes the MoE layer's device tables for the
// call: the work list (header (S, K, S*K, seq) by workgroup 0; item 1 + u = (expert handle, u, 1)
// for slot u = t*K + j: one item per slot, pairs[u] = u), each slot's weight and expert handle,
// and the chosen expert ids at chosenOffset.
//
// No rounds: the selection is by rank (the number of values above, ties to the lower id), and
// the element of rank j < K is pick j. Thread t owns the PER = ceil(E / WG) contiguous ids
// t*PER .. t*PER + PER - 1 (so any id of group t is below any of group t + 1), keeps their
// exp(x - max) in shared memory and publishes its group's maximum. Each thread ranks its group
// maximum among the WG group maxima (ties to the lower thread, which is the lower id): with
// PER = 1 these are the elements themselves and that rank is the pick. Otherwise the k best
// elements all lie in the groups ranked below k (a group ranked j has j groups above it, whose
// maxima are j distinct elements above any of its own), so stage 2 ranks the K*PER elements of
// those groups among themselves, which is their rank among all E for the k best. Barriers: the
// max, the exp values, stage 2's group list (PER > 1), the picks. The max and the sum reduce
// with subgroupMax/subgroupAdd then shared memory across subgroups (USE_SUBGROUP), or every
// thread reads all WG partials from shared memory; the sum is read by the K writers only.
//
// Logits must be finite (-Infinity: probability 0, still chosen after the nonzero ones by id;
// NaN: unspecified weights, id and handle words 0xFFFFFFFF where nothing compares, never a read
// outside the table): a NaN probability ranks as -1 (below every other, ties by id), as do the
// pad ids E .. WG*PER - 1; a pick of value -1 gets id NONE.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 2) const bool USE_SUBGROUP = true;

layout(set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(set = 0, binding = 1) readonly buffer Table { uvec2 table[]; };
layout(set = 0, binding = 2) writeonly buffer Work { uvec4 work[]; };
layout(set = 0, binding = 3) writeonly buffer Pairs { uint pairs[]; };
layout(set = 0, binding = 4) writeonly buffer SlotWeight { float slotWeight[]; };
layout(set = 0, binding = 5) writeonly buffer SlotExpert { uvec2 slotExpert[]; };
layout(set = 0, binding = 6) writeonly buffer Chosen { uint chosen[]; };

layout(push_constant) uniform Params {
    uint S;             // tokens (workgroups past S exit)
    uint E;             // experts, 1..MAX_E
    uint K;             // experts per token, 1..min(MAX_K, E)
    uint logitsOffset;  // floats: token t's logits at logitsOffset + t*E
    uint tableOffset;   // uvec2: expert e's handle at table[tableOffset + e]
    uint chosenOffset;  // uints
    uint seq;           // the call's sequence number (work header .w)
    uint flags;         // bit 0: normalize the k weights to sum 1
} pc;

const uint WG = gl_WorkGroupSize.x;  // a power of two >= MAX_K
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

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint token = gl_WorkGroupID.x;
    if (token >= pc.S) return;  // uniform per workgroup
    const uint E = min(pc.E, MAX_E);
    const uint K = min(pc.K, MAX_K);
    const uint lo = pc.logitsOffset + token * pc.E;
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
        if ((pc.flags & 1u) != 0u) {
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
