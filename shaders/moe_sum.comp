#version 450
// moe_sum: y[s][d] = sum over the slots j of token s of ypair[s*K + j][d]. The down kernel already
// applied the router weights; a slot whose weight is 0 was not computed on the GPU this call (its
// expert ran on the CPU, or the router gave it nothing) and is skipped, never read.
// One thread per (s, d); S and K (slots per token) come from the work header.
// The last thread of the grid also writes the completion hint (binding 4).
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, binding = 0) readonly restrict buffer YP { float ypair[]; };
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) writeonly restrict buffer YB { float y[]; };
layout(std430, binding = 3) readonly restrict buffer SW { float slotWeight[]; };
// The call's sequence number (work header .w), written when this thread is done: a hint the host
// may poll instead of sleeping in the driver; it still waits on the fence before reading y.
layout(std430, binding = 4) writeonly restrict buffer DN { uint done[]; };
layout(push_constant, std430) uniform PC { uint D; } pc;

void main() {
    const uvec4 header = work[0];
    const uint i = gl_GlobalInvocationID.x;
    const uint n = header.x * pc.D;
    if (i >= n) return;
    const uint s = i / pc.D, d = i % pc.D;
    const uint K = header.y;
    float acc = 0.0;
    for (uint j = 0u; j < K; ++j) {
        const uint slot = s * K + j;
        if (slotWeight[slot] != 0.0) acc += ypair[slot * pc.D + d];
    }
    y[i] = acc;
    if (i == n - 1u) done[0] = header.w;
}
