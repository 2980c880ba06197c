#version 450
// Streaming read of `count` uvec4 from `offset`: the device's own read bandwidth, the baseline
// every GEMV benchmark is compared against. Four independent loads per iteration keep many
// requests in flight; the XOR result is stored only if it equals a constant, so the loads stay live.
// NONTEMPORAL marks the loads as SPIR-V's Nontemporal memory access (data read once, a hint to keep
// it out of the caches): does a weight stream so marked leave the graph's small data cached?
#extension GL_EXT_spirv_intrinsics : require
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const bool NONTEMPORAL = false;
// STRIDE > 1: element i of the read is src[offset + i * STRIDE] (one 16-byte word every STRIDE * 16
// bytes: a read that touches many pages and few cache lines)
layout(constant_id = 2) const uint STRIDE = 1u;
layout(std430, binding = 0) readonly restrict buffer Src { uvec4 src[]; };
layout(std430, binding = 1) writeonly restrict buffer Dst { uint dst[]; };
layout(push_constant, std430) uniform PC { uint offset; uint count; } pc;

// OpLoad (61) with the Nontemporal memory operand (0x4)
spirv_instruction(id = 61) uvec4 loadNontemporal(spirv_by_reference uvec4 p, spirv_literal uint access);
uvec4 load(uint i) { return NONTEMPORAL ? loadNontemporal(src[i], 4u) : src[i]; }
uvec4 element(uint i) { return load(pc.offset + i * STRIDE); }

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uint i = gl_GlobalInvocationID.x;
  uvec4 a = uvec4(0u), b = uvec4(0u), c = uvec4(0u), d = uvec4(0u);
  for (; i + 3u * stride < pc.count; i += 4u * stride) {
    a ^= element(i);
    b ^= element(i + stride);
    c ^= element(i + 2u * stride);
    d ^= element(i + 3u * stride);
  }
  for (; i < pc.count; i += stride) a ^= element(i);
  const uvec4 v = a ^ b ^ c ^ d;
  const uint acc = v.x ^ v.y ^ v.z ^ v.w;
  if (acc == 0x9e3779b9u) dst[gl_GlobalInvocationID.x] = acc;
}
