#version 450
// dec_argmax: greedy argmax over V floats in one dispatch, as src/sampling/select.ts argmax: the
// largest value, the lowest id on ties; -Infinity and NaN are never candidates (all of them:
// id 0xFFFFFFFF, value -Infinity). Each workgroup reduces its block of PER_WG values (coalesced,
// strided by WG) to one (value, id) in shared memory and writes it to scratch; the last workgroup
// to arrive (an atomic counter) reduces the partials, writes result[resultOffset + 0] = id,
// [+1] = value bits, and resets the counter to 0, so the same recorded dispatch can be replayed.
// One dispatch rather than two: in a recorded token graph it saves a barrier and a dispatch, and
// the partials are few (V / PER_WG).
// scratch: [0] arrival counter (0 between calls), [1..3] unused, then 2 words per workgroup.
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const uint PER_WG = 4096u;  // values per workgroup (a multiple of WG)

layout(set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(set = 0, binding = 1) coherent buffer Scratch { uint scratch[]; };
layout(set = 0, binding = 2) writeonly buffer Result { uint result[]; };

layout(push_constant) uniform Params {
    uint V;
    uint logitsOffset;  // floats
    uint resultOffset;  // words
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint NONE = 0xFFFFFFFFu;
const float NEG_INF = -1.0 / 0.0;  // folded by glslang to -Infinity
shared float sv[WG];
shared uint si[WG];
shared bool lastToArrive;

// Whether (va, ia) ranks above (vb, ib); candidates have values > -Infinity, non-candidates NONE.
bool above(float va, uint ia, float vb, uint ib) { return va > vb || (va == vb && ia < ib); }

// Workgroup reduction of every invocation's (v, id); the winner in sv[0], si[0].
void reduceShared(float v, uint id) {
    const uint t = gl_LocalInvocationIndex;
    sv[t] = v;
    si[t] = id;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s && above(sv[t + s], si[t + s], sv[t], si[t])) { sv[t] = sv[t + s]; si[t] = si[t + s]; }
        barrier();
    }
}

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint wg = gl_WorkGroupID.x;
    const uint groups = gl_NumWorkGroups.x;
    float bv = NEG_INF;
    uint bi = NONE;
    const uint start = wg * PER_WG;
    const uint end = min(start + PER_WG, pc.V);
    // ids ascend along each invocation's stride, so strict > keeps the lowest id on ties
    for (uint i = start + t; i < end; i += WG) {
        const float x = logits[pc.logitsOffset + i];
        if (x > bv) { bv = x; bi = i; }
    }
    reduceShared(bv, bi);
    if (t == 0u) {
        scratch[4u + 2u * wg] = floatBitsToUint(sv[0]);
        scratch[5u + 2u * wg] = si[0];
    }
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) lastToArrive = atomicAdd(scratch[0], 1u) == groups - 1u;
    barrier();
    if (!lastToArrive) return;  // uniform
    memoryBarrierBuffer();
    bv = NEG_INF;
    bi = NONE;
    for (uint g = t; g < groups; g += WG) {
        const float x = uintBitsToFloat(scratch[4u + 2u * g]);
        const uint id = scratch[5u + 2u * g];
        if (above(x, id, bv, bi)) { bv = x; bi = id; }
    }
    reduceShared(bv, bi);
    if (t == 0u) {
        result[pc.resultOffset] = si[0];
        result[pc.resultOffset + 1u] = floatBitsToUint(sv[0]);
        scratch[0] = 0u;
    }
}
