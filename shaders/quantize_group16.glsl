// quantize_group16.glsl: quantize_act's rule for one group of 16 values a thread holds (the kernels
// that write the integer-dot GEMVs' input themselves: dec_rmsnorm_quant, dec_attention_combine,
// dec_attention_decode's COMBINE_TAIL, moe_ggml's norm tail):
//   amax = max |v|;  amax == 0 -> scale 0, q 0;  else amax = m * 2^e (frexp), scale = 2^(e-7),
//   q = clamp(roundEven(v * 2^(7-e)), -127, 127);  byte j of word k is q[4k + j];  qsum = sum of q.
void quantizeGroup16(float v[16], out uvec4 words, out float scale, out int qsum) {
    float amax = 0.0;
    [[unroll]] for (uint j = 0u; j < 16u; ++j) amax = max(amax, abs(v[j]));
    words = uvec4(0u);
    scale = 0.0;
    qsum = 0;
    if (amax > 0.0) {
        int e = 0;
        frexp(amax, e);
        scale = ldexp(1.0, e - 7);
        [[unroll]] for (uint j = 0u; j < 16u; ++j) {
            // ldexp(v, 7-e) == v * 2^(7-e) exactly, without forming 2^(7-e) (which can overflow)
            const int q = int(clamp(roundEven(ldexp(v[j], 7 - e)), -127.0, 127.0));
            qsum += q;
            words[j / 4u] |= (uint(q) & 0xFFu) << (8u * (j % 4u));
        }
    }
}
