#version 450
// dec_gating: Qwen3.5's three elementwise gates, over S tokens of n floats each (token t's row at
// offset + t * stride), one invocation per element:
//   mode 0, the gated attention's output gate: y = x * sigmoid(g)           (g laid out as x)
//   mode 1, the shared expert's SwiGLU:        y = silu(x) * g              (x the gate proj, g the up proj)
//   mode 2, the shared expert's scaled add:    y += sigmoid(g[t]) * x       (g one float per token)
// as src/model/hybrid-decoder.ts: the sigmoid rounded to f32 before it multiplies. y may be x
// (each element read and written by one invocation). Dispatch ceil(n / WG) x S (x split over z
// is not needed: n <= maxComputeWorkGroupCount[0] * WG).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64, local_size_x_id = 0) in;

const uint WG = gl_WorkGroupSize.x;

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer G { float g[]; };
layout(set = 0, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform Params {
    uint S;
    uint n;         // elements per token
    uint mode;
    uint xOffset;   // floats; token t's row at xOffset + t * xStride
    uint xStride;
    uint gOffset;   // mode 2: token t's scale at gOffset + t * gStride
    uint gStride;
    uint yOffset;
    uint yStride;
} pc;

float sigmoid(float v) { return 1.0 / (1.0 + exp(-v)); }

void main() {
    const uint i = gl_WorkGroupID.x * WG + gl_LocalInvocationIndex;
    const uint t = gl_WorkGroupID.y;
    if (i >= pc.n || t >= pc.S) return;
    const float xv = x[pc.xOffset + t * pc.xStride + i];
    const uint yi = pc.yOffset + t * pc.yStride + i;
    if (pc.mode == 0u) {
        y[yi] = xv * sigmoid(g[pc.gOffset + t * pc.gStride + i]);
    } else if (pc.mode == 1u) {
        y[yi] = (xv / (1.0 + exp(-xv))) * g[pc.gOffset + t * pc.gStride + i];
    } else {
        y[yi] = y[yi] + sigmoid(g[pc.gOffset + t * pc.gStride]) * xv;
    }
}
