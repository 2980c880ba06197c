#version 450
#extension GL_EXT_control_flow_attributes : require
// dec_topk: the k (<= K <= 64) best of V floats, best first, in the order of src/sampling/select.ts
// selectTopK (larger value first, the lower id on ties; -Infinity and NaN are never candidates),
// for sampling on the host from a few candidates instead of the whole vocabulary. One dispatch,
// as dec_argmax: each workgroup finds the k best of its PER_WG values (k rounds, each the best
// candidate ranked strictly below the previous pick: a workgroup reduction over values kept in
// registers) and writes them to scratch; the last workgroup to arrive (atomic counter) picks the
// k best of those G*K partials the same way, writes result[ro + j] = id, result[ro + K + j] =
// value bits (j < count), result[ro + 2K] = count (< k when fewer candidates exist), and resets
// the counter to 0 for the next replay.
// scratch: [0] arrival counter, [1..3] unused, then per workgroup g K entries of 2 words (value bits, id).
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const uint PER_WG = 4096u;  // values per workgroup: a multiple of WG
layout(constant_id = 2) const uint K = 64u;          // most candidates a dispatch may ask for

layout(set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(set = 0, binding = 1) coherent buffer Scratch { uint scratch[]; };
layout(set = 0, binding = 2) writeonly buffer Result { uint result[]; };

layout(push_constant) uniform Params {
    uint V;
    uint logitsOffset;  // floats
    uint resultOffset;  // words
    uint k;             // 1..K
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint PER_THREAD = PER_WG / WG;
const uint NONE = 0xFFFFFFFFu;
const float NEG_INF = -1.0 / 0.0;  // folded by glslang to -Infinity
shared float sv[WG];
shared uint si[WG];
shared bool lastToArrive;

bool above(float va, uint ia, float vb, uint ib) { return va > vb || (va == vb && ia < ib); }
// (v, id) is a candidate ranked strictly below the previous pick (tv, ti); any candidate when first.
bool eligible(float v, uint id, bool first, float tv, uint ti) { return v > NEG_INF && (first || v < tv || (v == tv && id > ti)); }

// Workgroup reduction of every invocation's (v, id); the winner in sv[0], si[0]. Begins with a
// barrier so that every invocation has read the previous winner before it is overwritten.
void reduceShared(float v, uint id) {
    const uint t = gl_LocalInvocationIndex;
    barrier();
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
    const uint k = min(pc.k, K);
    const uint start = wg * PER_WG;
    float x[PER_THREAD];
    [[unroll]] for (uint j = 0u; j < PER_THREAD; ++j) {
        const uint i = start + t + j * WG;
        x[j] = i < pc.V ? logits[pc.logitsOffset + i] : NEG_INF;
    }
    float tv = 0.0;
    uint ti = NONE;
    for (uint r = 0u; r < k; ++r) {
        float bv = NEG_INF;
        uint bi = NONE;
        [[unroll]] for (uint j = 0u; j < PER_THREAD; ++j) {
            const uint i = start + t + j * WG;
            if (eligible(x[j], i, r == 0u, tv, ti) && above(x[j], i, bv, bi)) { bv = x[j]; bi = i; }
        }
        reduceShared(bv, bi);
        tv = sv[0];
        ti = si[0];
        if (t == 0u) {
            scratch[4u + 2u * (wg * K + r)] = floatBitsToUint(tv);
            scratch[5u + 2u * (wg * K + r)] = ti;  // NONE (value -inf) once the block has no more
        }
    }
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) lastToArrive = atomicAdd(scratch[0], 1u) == groups - 1u;
    barrier();
    if (!lastToArrive) return;  // uniform
    memoryBarrierBuffer();
    uint count = 0u;
    for (uint r = 0u; r < k; ++r) {
        float bv = NEG_INF;
        uint bi = NONE;
        for (uint n = t; n < groups * k; n += WG) {
            const uint e = (n / k) * K + n % k;  // workgroup n / k's entry n % k
            const float v = uintBitsToFloat(scratch[4u + 2u * e]);
            const uint id = scratch[5u + 2u * e];
            if (eligible(v, id, r == 0u, tv, ti) && above(v, id, bv, bi)) { bv = v; bi = id; }
        }
        reduceShared(bv, bi);
        tv = sv[0];
        ti = si[0];
        if (ti == NONE) break;  // uniform: no candidate left
        if (t == 0u) {
            result[pc.resultOffset + r] = ti;
            result[pc.resultOffset + K + r] = floatBitsToUint(tv);
        }
        count = r + 1u;
    }
    if (t == 0u) {
        result[pc.resultOffset + 2u * K] = count;
        scratch[0] = 0u;
    }
}
