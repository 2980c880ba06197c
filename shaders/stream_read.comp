#version 450
// Streaming read of `count` uvec4 from `offset`: the device's own read bandwidth, the baseline
// every GEMV benchmark is compared against. Four independent loads per iteration keep many
// requests in flight; the XOR result is stored only if it equals a constant, so the loads stay live.
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, binding = 0) readonly restrict buffer Src { uvec4 src[]; };
layout(std430, binding = 1) writeonly restrict buffer Dst { uint dst[]; };
layout(push_constant, std430) uniform PC { uint offset; uint count; } pc;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uint i = gl_GlobalInvocationID.x;
  uvec4 a = uvec4(0u), b = uvec4(0u), c = uvec4(0u), d = uvec4(0u);
  for (; i + 3u * stride < pc.count; i += 4u * stride) {
    a ^= src[pc.offset + i];
    b ^= src[pc.offset + i + stride];
    c ^= src[pc.offset + i + 2u * stride];
    d ^= src[pc.offset + i + 3u * stride];
  }
  for (; i < pc.count; i += stride) a ^= src[pc.offset + i];
  const uvec4 v = a ^ b ^ c ^ d;
  const uint acc = v.x ^ v.y ^ v.z ^ v.w;
  if (acc == 0x9e3779b9u) dst[gl_GlobalInvocationID.x] = acc;
}
