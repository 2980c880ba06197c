#version 450
// dec_route: the MoE router of S tokens (one workgroup each) as src/model/ops.ts routeTopK: softmax
// over the token's E logits in f32 (max-subtracted, exp, sum), the k largest probabilities,
// largest first, ties to the lowest expert id, weights = the probabilities, divided by their sum
// with NORMALIZE (flags bit 0). The selection ranks the unnormalised exp(x - max) (the same
// order as the probabilities); weights are e_j / sum(e) or e_j / (e_0 + ... + e_{k-1}), the
// latter summed in j order by every writer. Then writes the MoE layer's device tables for the
// call: the work list (header (S, K, S*K, seq) by workgroup 0; item 1 + u = (expert handle, u, 1)
// for slot u = t*K + j: one item per slot, pairs[u] = u), each slot's weight and expert handle,
// and the chosen expert ids at chosenOffset. The probabilities stay in shared memory (E <= MAX_E);
// each of the k rounds is a plain shared-memory (value, id) max-reduction, the winner marked -1.
// Logits must be finite (-Infinity: probability 0, still chosen after the nonzero ones by id;
// NaN: unspecified weights, id and handle words 0xFFFFFFFF where nothing compares, never a read
// outside the table).
layout(local_size_x = 128, local_size_x_id = 0) in;

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

shared float prob[MAX_E];  // the logits, then exp(x - max); -1 once chosen
shared float rv[WG];
shared uint ri[WG];
shared float pickValue[MAX_K];
shared uint pickId[MAX_K];

bool above(float va, uint ia, float vb, uint ib) { return va > vb || (va == vb && ia < ib); }

// Begins with a barrier so that every invocation has read the previous result first.
float workgroupMax(float v) {
    const uint t = gl_LocalInvocationIndex;
    barrier();
    rv[t] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) rv[t] = max(rv[t], rv[t + s]);
        barrier();
    }
    return rv[0];
}

float workgroupSum(float v) {
    const uint t = gl_LocalInvocationIndex;
    barrier();
    rv[t] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) rv[t] += rv[t + s];
        barrier();
    }
    return rv[0];
}

// The best (value, id) over the workgroup into rv[0], ri[0].
void workgroupBest(float v, uint id) {
    const uint t = gl_LocalInvocationIndex;
    barrier();
    rv[t] = v;
    ri[t] = id;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s && above(rv[t + s], ri[t + s], rv[t], ri[t])) { rv[t] = rv[t + s]; ri[t] = ri[t + s]; }
        barrier();
    }
}

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint token = gl_WorkGroupID.x;
    if (token >= pc.S) return;  // uniform per workgroup
    const uint E = min(pc.E, MAX_E);
    const uint K = min(pc.K, MAX_K);
    const uint lo = pc.logitsOffset + token * pc.E;

    // Every invocation owns the ids t, t + WG, ... of prob: only it reads or writes them until
    // the selection, which changes one entry per round by its owner.
    float m = NEG_INF;
    for (uint e = t; e < E; e += WG) {
        const float x = logits[lo + e];
        prob[e] = x;
        m = max(m, x);
    }
    const float mx = workgroupMax(m);
    float sum = 0.0;
    for (uint e = t; e < E; e += WG) {
        const float v = exp(prob[e] - mx);
        prob[e] = v;
        sum += v;
    }
    const float total = workgroupSum(sum);

    for (uint r = 0u; r < K; ++r) {
        float bv = -1.0;
        uint bi = NONE;
        for (uint e = t; e < E; e += WG) {
            const float v = prob[e];
            if (v > bv) { bv = v; bi = e; }  // ascending ids: the first of equal values
        }
        workgroupBest(bv, bi);
        const uint best = ri[0];
        if (t == 0u) {
            pickValue[r] = rv[0];
            pickId[r] = best;
        }
        if (best < E && best % WG == t) prob[best] = -1.0;  // its owner (NONE: NaN logits only)
    }
    barrier();

    if (token == 0u && t == 0u) work[0] = uvec4(pc.S, K, pc.S * K, pc.seq);
    if (t < K) {
        float denom = total;
        if ((pc.flags & 1u) != 0u) {
            denom = 0.0;
            for (uint j = 0u; j < K; ++j) denom += pickValue[j];
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
