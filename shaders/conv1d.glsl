// Shared by dec_conv1d.comp and dec_delta_rule.comp (its conv-fold mode): one token of one channel of
// Gated DeltaNet's causal depthwise conv1d + SiLU (src/model/linear-attention.ts causalConv1dSilu),
// so that the fold computes what dec_conv1d does bit for bit. The includer defines CONV_TAPS (a
// constant, 1..8). taps[0..CONV_TAPS-1]: the channel's weights; window[0..CONV_TAPS-2]: its previous
// inputs, oldest first (one spare slot: a single tap has none).
// precise: no driver may contract the products into fmas in one shader and not in the other.

// silu(sum_j taps[j] * window[j] + taps[last] * xt), the sum in tap order
float convSilu(const float taps[CONV_TAPS], const float window[CONV_TAPS], float xt) {
    const uint H = CONV_TAPS - 1u;
    precise float s = 0.0;
    for (uint j = 0u; j < H; j++) s += taps[j] * window[j];
    s += taps[H] * xt;
    precise float y = s / (1.0 + exp(-s));
    return y;
}

// The window after token xt: shifted one place, xt last.
void convShift(inout float window[CONV_TAPS], float xt) {
    const uint H = CONV_TAPS - 1u;
    for (uint j = 0u; j + 1u < H; j++) window[j] = window[j + 1u];
    if (H > 0u) window[H - 1u] = xt;
}
