// half_words.glsl: float weights as dec_gemv_half reads them (gemv_half.glsl, float_weights.glsl):
// 16-bit floats packed two per uint (f16, or bf16 with pc.flags bit 0), element 2j in the low half,
// or f32 one per uint with pc.flags bit 1. The includer declares w1 (uint[]) and pc.flags first.
bool bf16() { return (pc.flags & 1u) != 0u; }
bool f32w() { return (pc.flags & 2u) != 0u; }

// The two 16-bit floats of word w: (element of the low half, element of the high half).
vec2 decode2(uint w) {
    if (bf16()) return vec2(uintBitsToFloat(w << 16u), uintBitsToFloat(w & 0xFFFF0000u));
    return unpackHalf2x16(w);
}

// Half element h (index into the flat array of halves, weightOffset included) as a float.
float loadHalf(uint h) {
    const uint w = w1[h >> 1u];
    const uint b = ((h & 1u) != 0u) ? (w >> 16u) : (w & 0xFFFFu);
    return bf16() ? uintBitsToFloat(b << 16u) : unpackHalf2x16(b).x;
}
