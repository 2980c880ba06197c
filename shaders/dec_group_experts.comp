#version 450
// dec_group_experts: regroups a routed call of S tokens by expert, for the grouped MoE kernels
// (moe_gateup / moe_down), so that each chosen expert's weights are read once for all the tokens
// that chose it rather than once per slot. Reads the chosen ids dec_route wrote (slot u = t*K + j)
// and rewrites the work list as one item per distinct expert, in id order: header (S, K, items,
// seq), item i = (expert handle, pairStart, pairCount), and pairs[pairStart ..] = that expert's
// slots. The order of slots within an item is not fixed (atomic fill), which changes nothing:
// every slot's h row and weighted down row are computed alone and summed per token in j order.
// A slot with no expert (NONE: NaN logits) gets weight 0, so the sum skips it.
// One workgroup.
layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Chosen { uint chosen[]; };
layout(set = 0, binding = 1) readonly buffer Table { uvec2 table[]; };
layout(set = 0, binding = 2) writeonly buffer Work { uvec4 work[]; };
layout(set = 0, binding = 3) writeonly buffer Pairs { uint pairs[]; };
layout(set = 0, binding = 4) buffer SlotWeight { float slotWeight[]; };

layout(push_constant) uniform Params {
    uint S;             // tokens
    uint E;             // experts, 1..MAX_E
    uint K;             // slots per token
    uint chosenOffset;  // uints: slot u's expert id at chosen[chosenOffset + u]
    uint tableOffset;   // uvec2: expert e's handle at table[tableOffset + e]
    uint seq;           // the work header's .w
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint MAX_E = 512u;

shared uint count[MAX_E];
shared uint start[MAX_E];
shared uint fill[MAX_E];

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint E = min(pc.E, MAX_E);
    const uint N = pc.S * pc.K;
    for (uint e = t; e < E; e += WG) { count[e] = 0u; fill[e] = 0u; }
    barrier();
    for (uint u = t; u < N; u += WG) {
        const uint id = chosen[pc.chosenOffset + u];
        if (id < E) atomicAdd(count[id], 1u);
    }
    barrier();
    if (t == 0u) {
        uint s = 0u, items = 0u;
        for (uint e = 0u; e < E; e++) {
            start[e] = s;
            const uint c = count[e];
            if (c > 0u) {
                work[1u + items] = uvec4(table[pc.tableOffset + e], s, c);
                items++;
                s += c;
            }
        }
        work[0] = uvec4(pc.S, pc.K, items, pc.seq);
    }
    barrier();
    for (uint u = t; u < N; u += WG) {
        const uint id = chosen[pc.chosenOffset + u];
        if (id < E) pairs[start[id] + atomicAdd(fill[id], 1u)] = u;
        else slotWeight[u] = 0.0;
    }
}
