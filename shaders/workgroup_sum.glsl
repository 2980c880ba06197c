// workgroup_sum.glsl: the sum of a float over the workgroup (dec_linear_attention.glsl's kernels,
// dec_router_route's folded norm). The includer declares WG (its workgroup size) and USE_SUBGROUP,
// and enables the subgroup extensions.
#ifndef WORKGROUP_SUM_GLSL
#define WORKGROUP_SUM_GLSL

shared float partial[WG];

// Smallest power of two >= n (n >= 1).
uint ceilPow2(uint n) { return n <= 1u ? 1u : 1u << uint(findMSB(n - 1u) + 1); }

// Sum of v over the workgroup, the same value in every invocation (call in uniform control flow);
// invocations `count` and above must pass 0 (the shared-memory tree spans only the first `count`).
// With USE_SUBGROUP: subgroupAdd, then every subgroup adds the subgroups' sums; else a tree.
float workgroupSum(float v, uint count) {
    const uint li = gl_LocalInvocationIndex;
    if (USE_SUBGROUP) {
        v = subgroupAdd(v);
        const uint nsg = gl_NumSubgroups;
        if (nsg == 1u) return v;
        if (subgroupElect()) partial[gl_SubgroupID] = v;
        barrier();
        float t = 0.0;
        for (uint s = gl_SubgroupInvocationID; s < nsg; s += gl_SubgroupSize) t += partial[s];
        v = subgroupAdd(t);
    } else {
        partial[li] = v;
        barrier();
        for (uint s = ceilPow2(count) >> 1u; s > 0u; s >>= 1u) {
            if (li < s && li + s < count) partial[li] += partial[li + s];
            barrier();
        }
        v = partial[0];
    }
    // every invocation has read `partial` before anyone writes it again
    barrier();
    return v;
}

#endif  // WORKGROUP_SUM_GLSL
