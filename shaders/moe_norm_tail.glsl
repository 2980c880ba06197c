// moe_norm_tail.glsl: the next layer's input norm done by the last workgroup of a decode MoE call
// (moe_ggml's down-with-sum mode with NORM_TAIL), so that norm needs no dispatch and barrier of its
// own. For token s: h += y (the residual, written back), xn = RMSNorm(h) * w and, with `quantize`,
// xn quantized for the integer-dot GEMVs that read it (quantize_group16.glsl):
// dec_rmsnorm_quant's formulas, its sum of squares over this workgroup's lanes (equal to rounding).
// A lane owns whole groups of 16 columns, so it reads back only what it wrote itself.
//
// The includer defines WG, USE_SUBGROUP and the buffers: tailRes (vec4, the residual, read and
// written), tailY (vec4, y as the call wrote it: coherent, other workgroups' writes), tailW (vec4,
// the norm's weights), tailXn (vec4), tailXq (uvec4), tailXscale (float), tailXsum (int); and
// includes quantize_group16.glsl first.

shared float tailRed[WG];

// The workgroup's sum of one value a lane: subgroup sums, then the subgroups' in order (or a tree).
float tailTotal(float v) {
    const uint t = gl_LocalInvocationIndex;
    float total;
    if (USE_SUBGROUP) {
        v = subgroupAdd(v);
        if (subgroupElect()) tailRed[gl_SubgroupID] = v;
        barrier();
        total = tailRed[0];
        for (uint g = 1u; g < gl_NumSubgroups; ++g) total += tailRed[g];
    } else {
        tailRed[t] = v;
        barrier();
        for (uint h = WG / 2u; h > 0u; h >>= 1u) {
            if (t < h) tailRed[t] += tailRed[t + h];
            barrier();
        }
        total = tailRed[0];
    }
    barrier();  // tailRed is reused by the next token
    return total;
}

// Token s of D columns (a multiple of 16); the weights from float wOffset (a multiple of 4).
void normTail(uint s, uint D, uint wOffset, float eps, bool quantize) {
    const uint t = gl_LocalInvocationIndex;
    const uint groups = D / 16u, row = s * (D >> 2u), wo = wOffset >> 2u;
    float ss = 0.0;
    for (uint g = t; g < groups; g += WG) {
        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
            precise vec4 v = tailRes[row + 4u * g + j] + tailY[row + 4u * g + j];
            tailRes[row + 4u * g + j] = v;
            ss += v.x * v.x;
            ss += v.y * v.y;
            ss += v.z * v.z;
            ss += v.w * v.w;
        }
    }
    const float inv = 1.0 / sqrt(tailTotal(ss) / float(D) + eps);
    for (uint g = t; g < groups; g += WG) {
        float o[16];
        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
            precise vec4 tv = tailRes[row + 4u * g + j] * inv;  // this lane's own writes
            precise vec4 v = tailW[wo + 4u * g + j] * tv;
            tailXn[row + 4u * g + j] = v;
            o[4u * j] = v.x;
            o[4u * j + 1u] = v.y;
            o[4u * j + 2u] = v.z;
            o[4u * j + 3u] = v.w;
        }
        if (!quantize) continue;
        uvec4 words;
        float scale;
        int qsum;
        quantizeGroup16(o, words, scale, qsum);
        const uint at = s * groups + g;
        tailXq[at] = words;
        tailXscale[at] = scale;
        tailXsum[at] = qsum;
    }
}
