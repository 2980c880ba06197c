#version 450
// bench:spin's dependent step: every workgroup reads the whole input row (as a GEMV reads x), sums
// it, and writes its slice of the output row (input * 0.5 + sum * 1e-6); steps alternate the two
// rows (flip). SPIN: no pipeline barrier before the step; its workgroups wait until every
// workgroup of the previous step has counted itself done in counters[step - 1] (buffers coherent,
// so the reads go past the non-coherent caches). Relies on the previous dispatch's workgroups all
// being launched before this one's spin (true where dispatches start in order; not a Vulkan rule).
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool SPIN = false;
layout(std430, binding = 0) coherent buffer A { float a[]; };
layout(std430, binding = 1) coherent buffer B { float b[]; };
layout(std430, binding = 2) coherent buffer C { uint counters[]; };
layout(push_constant, std430) uniform P { uint step; uint n; uint prevGroups; uint flip; } p;

shared float red[256];

float readRow(uint i) { return p.flip != 0u ? b[i] : a[i]; }
void writeRow(uint i, float v) { if (p.flip != 0u) a[i] = v; else b[i] = v; }

void main() {
  const uint tid = gl_LocalInvocationIndex;
  if (SPIN && p.step > 0u) {
    if (tid == 0u) {
      while (atomicAdd(counters[p.step - 1u], 0u) < p.prevGroups) {}
    }
    memoryBarrierBuffer();
    barrier();
  }
  float s = 0.0;
  for (uint i = tid; i < p.n; i += 256u) s += readRow(i);
  red[tid] = s;
  barrier();
  for (uint k = 128u; k > 0u; k >>= 1u) {
    if (tid < k) red[tid] += red[tid + k];
    barrier();
  }
  const uint per = p.n / gl_NumWorkGroups.x;
  for (uint i = tid; i < per; i += 256u) {
    const uint j = gl_WorkGroupID.x * per + i;
    writeRow(j, readRow(j) * 0.5 + red[0] * 1e-6);
  }
  if (SPIN) {
    memoryBarrierBuffer();  // this workgroup's row writes before its count
    barrier();
    if (tid == 0u) atomicAdd(counters[p.step], 1u);
  }
}
