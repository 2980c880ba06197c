#version 450
// dec_group_experts: regroups a routed call of S tokens by expert, for the grouped MoE kernels
// (moe_gateup / moe_down), so that each chosen expert's weights are read once for all the tokens
// that chose it rather than once per slot. Reads the chosen ids dec_route wrote (slot u = t*K + j)
// and rewrites the work list as one item per distinct expert, in id order: header (S, K, items,
// seq), item i = (expert handle, pairStart, pairCount), and pairs[pairStart ..] = that expert's
// slots. The order of slots within an item is not fixed (atomic fill), which changes nothing:
// every slot's h row and weighted down row are computed alone and summed per token in j order.
// A slot with no expert (NONE: NaN logits) gets weight 0, so the sum skips it.
// maxSlots > 0 splits an expert of more slots into items of at most maxSlots each (consecutive runs
// of its pairs): a workgroup per item, so an expert many tokens chose is not one long tail of the
// dispatch (its weights are then read once per item, mostly from L2).
// One workgroup. The item list is laid out by a prefix sum over the experts (each thread owns
// ceil(MAX_E / WG) consecutive ids), so every table load and item store is issued in parallel:
// a single thread walking 256 experts took ~35 µs a call on the H200.
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
    uint maxSlots;      // slots an item at most; 0: one item per expert
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint MAX_E = 512u;
const uint PER_THREAD = (MAX_E + WG - 1u) / WG;  // consecutive expert ids a thread lays out

shared uint count[MAX_E];
shared uint start[MAX_E];
shared uint fill[MAX_E];
// per thread: its experts' slots and items, then (the scan) the sums over threads 0..t
shared uint slotScan[WG];
shared uint itemScan[WG];

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
    const uint first = t * PER_THREAD;
    uint slots = 0u, items = 0u;
    for (uint k = 0u; k < PER_THREAD; k++) {
        const uint e = first + k;
        const uint c = e < E ? count[e] : 0u;
        slots += c;
        items += pc.maxSlots > 0u ? (c + pc.maxSlots - 1u) / pc.maxSlots : (c > 0u ? 1u : 0u);
    }
    slotScan[t] = slots;
    itemScan[t] = items;
    barrier();
    // inclusive scan (Hillis-Steele): read both partners, then write after a barrier
    for (uint offset = 1u; offset < WG; offset <<= 1u) {
        const uint a = t >= offset ? slotScan[t - offset] : 0u;
        const uint b = t >= offset ? itemScan[t - offset] : 0u;
        barrier();
        slotScan[t] += a;
        itemScan[t] += b;
        barrier();
    }
    // this thread's first slot and item: the sums over the threads before it
    uint s = slotScan[t] - slots, item = itemScan[t] - items;
    for (uint k = 0u; k < PER_THREAD; k++) {
        const uint e = first + k;
        if (e >= E) break;
        start[e] = s;
        const uint c = count[e];
        const uint run = pc.maxSlots > 0u ? pc.maxSlots : max(c, 1u);
        for (uint j = 0u; j < c; j += run) {
            work[1u + item] = uvec4(table[pc.tableOffset + e], s + j, min(run, c - j));
            item++;
        }
        s += c;
    }
    if (t == WG - 1u) work[0] = uvec4(pc.S, pc.K, itemScan[WG - 1u], pc.seq);
    barrier();
    for (uint u = t; u < N; u += WG) {
        const uint id = chosen[pc.chosenOffset + u];
        if (id < E) pairs[start[id] + atomicAdd(fill[id], 1u)] = u;
        else slotWeight[u] = 0.0;
    }
}
