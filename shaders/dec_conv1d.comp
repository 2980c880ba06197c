#version 450
#extension GL_GOOGLE_include_directive : require
// dec_conv1d: the causal depthwise conv1d + SiLU of Gated DeltaNet's q/k/v channels over S tokens
// (1..64), as src/model/linear-attention.ts causalConv1dSilu: out[t, c] = silu(sum_j w[c, j] *
// x[t - (KERNEL-1) + j, c]), inputs before t = 0 read from the rolling state [channels][KERNEL-1]
// (oldest first), which is then replaced by the last KERNEL-1 inputs of [state, x], in place.
// One invocation per channel walks the S tokens in order with the channel's window in registers:
// the state is read once and written once, by the invocation that owns it (no race, no barrier),
// and for each token the invocations of a subgroup read consecutive channels (coalesced).
// out must not alias x (a token's input is read after earlier outputs are written).
// Runs mode (flags bit 0, a batch of sequences): workgroup row z is run z of the runs table (see
// RUN_* below): one sequence's tokens, in order, on that sequence's state at stateOffset +
// stateIndex * stateStride; a run of 0 tokens (the table has fewer runs than S) does nothing.
// Runs of one call have distinct states, so every state is still read and written by one invocation.
// Advance mode (flags bit 1): the state alone moves on over the tokens, out is not written (the
// delta rule's conv fold computed the outputs from the state as it was; it cannot write the state,
// which several of its workgroups read); only the last KERNEL-1 tokens are read.
// Blocks mode (flags bit 2, one sequence): workgroup row z takes tokens z*TOKEN_BLOCK .. of a long
// prompt chunk (one invocation walking all of them in order waits on every load), its window
// from the earlier tokens' inputs or the state; the state is not written (advance mode after it).

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint KERNEL = 4;  // taps, 1..8
const uint TOKEN_BLOCK = 16u;                   // blocks mode: tokens an invocation

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer W { float w[]; };
layout(set = 0, binding = 2) buffer State { float state[]; };
layout(set = 0, binding = 3) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 4) readonly buffer Runs { uint runs[]; };

#include "dec_runs.glsl"
#define CONV_TAPS KERNEL
#include "conv1d.glsl"

layout(push_constant) uniform Params {
    uint S;            // tokens
    uint channels;
    uint xOffset;      // floats
    uint xStride;      // floats between tokens of x
    uint wOffset;      // floats: weights [channels][KERNEL]
    uint stateOffset;  // floats: state [channels][KERNEL-1]
    uint outOffset;    // floats
    uint outStride;    // floats between tokens of out
    uint stateStride;  // runs mode: floats between sequences' states
    uint flags;        // bit 0: runs mode; bit 1: advance the state only; bit 2: blocks mode
} pc;

void main() {
    const uint c = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (c >= pc.channels) return;
    const bool batched = (pc.flags & 1u) != 0u;
    const bool advanceOnly = (pc.flags & 2u) != 0u;
    const bool blocks = (pc.flags & 4u) != 0u;
    const uint run = gl_WorkGroupID.z;
    const uint count = batched ? runs[RUN_COUNT + run] : blocks ? min(pc.S, (run + 1u) * TOKEN_BLOCK) : pc.S;
    if (count == 0u) return;
    const uint first = batched ? runs[RUN_FIRST + run] : 0u;
    const uint stateAt = pc.stateOffset + (batched ? runs[RUN_STATE + run] * pc.stateStride : 0u);
    const uint H = KERNEL - 1u;  // history length
    // window[0..H-1]: the previous H inputs, oldest first (one spare slot: KERNEL = 1 has none)
    float window[KERNEL];
    float taps[KERNEL];
    for (uint j = 0u; j < KERNEL; j++) taps[j] = w[pc.wOffset + c * KERNEL + j];
    for (uint j = 0u; j < H; j++) window[j] = state[stateAt + c * H + j];
    // outputs from token `begin` (a block's first); inputs read from `from`: the H before the block
    // (the state stands in where there are fewer), or only the last H when advancing
    const uint begin = blocks ? run * TOKEN_BLOCK : 0u;
    const uint from = blocks ? (begin > H ? begin - H : 0u) : advanceOnly && count > H ? count - H : 0u;
    for (uint i = from; i < count; i++) {
        const uint t = batched ? runs[RUN_TOKENS + first + i] : i;
        const float xt = x[pc.xOffset + t * pc.xStride + c];
        if (!advanceOnly && i >= begin) outv[pc.outOffset + t * pc.outStride + c] = convSilu(taps, window, xt);
        convShift(window, xt);
    }
    if (!blocks) for (uint j = 0u; j < H; j++) state[stateAt + c * H + j] = window[j];
}
