// Shared by dec_delta_rule.comp and dec_gated_norm.comp (Gated DeltaNet, src/model/linear-attention.ts).
// The includer declares WG (its workgroup size), USE_SUBGROUP, enables the subgroup extensions and
// GL_GOOGLE_include_directive.

float silu(float x) { return x / (1.0 + exp(-x)); }

float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// log(1 + u) for u in [0, 1] as 2 atanh(s), s = u / (2 + u) <= 1/3, by its odd series to s^17
// (error < 2e-9 relative): the driver's log has only 2^-21 absolute error near 1 (Vulkan's
// bound), which is 5e-4 relative at u = 1e-3.
float log1pUnit(float u) {
    const float s = u / (2.0 + u);
    const float s2 = s * s;
    float p = 1.0 / 17.0;
    p = p * s2 + 1.0 / 15.0;
    p = p * s2 + 1.0 / 13.0;
    p = p * s2 + 1.0 / 11.0;
    p = p * s2 + 1.0 / 9.0;
    p = p * s2 + 1.0 / 7.0;
    p = p * s2 + 1.0 / 5.0;
    p = p * s2 + 1.0 / 3.0;
    p = p * s2 + 1.0;
    return 2.0 * s * p;
}

// torch's softplus (beta 1, threshold 20): x above 20, else log(1 + e^x) = max(x, 0) + log1p(e^-|x|).
float softplus(float x) { return x > 20.0 ? x : max(x, 0.0) + log1pUnit(exp(-abs(x))); }

#include "workgroup_sum.glsl"
