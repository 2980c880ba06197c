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
// The algorithm is route.glsl's (a token per call), shared with dec_router_route.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require

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

#include "route.glsl"

void main() {
    const uint token = gl_WorkGroupID.x;
    if (token >= pc.S) return;  // uniform per workgroup
    routeToken(token, pc.E, pc.logitsOffset, (pc.flags & 1u) != 0u);
}
