// float_weights.glsl: the float GEMMs' loads (dec_gemm_float, dec_gemm_float_tile): W as dec_gemv_half
// reads it (f16 / bf16 packed two per uint, or f32 with flags bit 1) and x f32 [S][I], 0 past I.
// The includer declares the buffers w1 / w4 (binding 0), xs / xv (binding 1) and the push constants
// pc.I, pc.weightOffset, pc.xOffset and pc.flags first.

#include "half_words.glsl"

// Columns col .. col + 3 of row `row` (< O) as floats, 0 past I: 16-byte loads where the f32
// elements are 16-byte aligned, word loads where the halves start a word, else half by half.
vec4 loadWeights4(uint row, uint col) {
    if (col + 4u <= pc.I) {
        if (f32w()) {
            const uint e = pc.weightOffset + row * pc.I + col;
            if ((e & 3u) == 0u) return uintBitsToFloat(w4[e >> 2u]);
            return uintBitsToFloat(uvec4(w1[e], w1[e + 1u], w1[e + 2u], w1[e + 3u]));
        }
        const uint h = 2u * pc.weightOffset + row * pc.I + col;
        if ((h & 1u) == 0u) return vec4(decode2(w1[h >> 1u]), decode2(w1[(h >> 1u) + 1u]));
        return vec4(loadHalf(h), loadHalf(h + 1u), loadHalf(h + 2u), loadHalf(h + 3u));
    }
    vec4 v = vec4(0.0);
    [[unroll]] for (uint q = 0u; q < 4u; q++) {
        if (col + q < pc.I) {
            v[q] = f32w() ? uintBitsToFloat(w1[pc.weightOffset + row * pc.I + col + q])
                          : loadHalf(2u * pc.weightOffset + row * pc.I + col + q);
        }
    }
    return v;
}

// Columns col .. col + 3 of token s (< S) of x, 0 past I.
vec4 loadX4(uint s, uint col, bool xAligned) {
    const uint xb = pc.xOffset + s * pc.I + col;
    if (xAligned && col + 4u <= pc.I) return xv[xb >> 2u];
    vec4 v = vec4(0.0);
    [[unroll]] for (uint q = 0u; q < 4u; q++) v[q] = col + q < pc.I ? xs[xb + q] : 0.0;
    return v;
}
