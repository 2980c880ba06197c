#version 450
// dec_attention_combine: pass 2 of dec_attention.  One workgroup per (head h, token t) merges the
// ceil((n + t) / span) partial records of that row (span = pass 1's CHUNK * iters) with the
// log-sum-exp rule:
//   M = max_c m_c,  L = sum_c l_c exp(m_c - M),  out = sum_c acc_c exp(m_c - M) / L.
// Records past the row's causal context are never read (pass 1 may leave them unwritten).
// n is pass 1's: p.n (+ positions[posIndex] with flags bit 0), capped at limit - (S - 1).
// The records are read in parallel (the threads split them for M and L, and each dimension's
// loop issues 8 loads before it uses them): a loop of one dependent global load per record
// took most of a decode token's attention time.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint HEAD_DIM = 128u;

const uint WG = gl_WorkGroupSize.x;  // a power of two
const uint REC = HEAD_DIM + 4u;
const uint MAX_RECORDS = 4096u;      // records per row (the host refuses more)

layout(set = 0, binding = 0) readonly buffer P { float part[]; };
layout(set = 0, binding = 1) writeonly buffer O { float o[]; };
layout(set = 0, binding = 2) readonly buffer Pos { uint positions[]; };  // any buffer when flags bit 0 is clear

layout(push_constant) uniform Params {
  uint n;          // as pass 1
  uint S;
  uint heads;
  uint numChunks;  // records per row (pass 1's grid x)
  uint outOffset;  // floats
  uint posIndex;   // as pass 1
  uint flags;      // as pass 1 (bit 0: n += positions[posIndex]; bit 1: batched, token t sees positions[posIndex + t] + 1, capped at limit)
  uint limit;      // as pass 1
  uint span;       // positions per record: pass 1's CHUNK * iters
} p;

shared float weightOf[MAX_RECORDS];  // exp(m_c - M)
shared float reduction[WG];

uint contextN() {
  const uint extra = (p.flags & 1u) != 0u ? positions[p.posIndex] : 0u;
  return p.n + min(extra, p.limit - (p.S - 1u) - p.n);
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
  const uint row = t * p.heads + h;
  const uint seen = (p.flags & 2u) != 0u ? min(positions[p.posIndex + t] + 1u, p.limit) : contextN() + t;
  const uint records = min((seen + p.span - 1u) / p.span, MAX_RECORDS);
  const uint base = row * p.numChunks * REC;

  float m = -3.0e38;
  for (uint c = tid; c < records; c += WG) m = max(m, part[base + c * REC + HEAD_DIM]);
  reduction[tid] = m;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) reduction[tid] = max(reduction[tid], reduction[tid + s]);
    barrier();
  }
  const float M = reduction[0];
  barrier();

  float l = 0.0;
  for (uint c = tid; c < records; c += WG) {
    const float w = exp(part[base + c * REC + HEAD_DIM] - M);
    weightOf[c] = w;
    l += part[base + c * REC + HEAD_DIM + 1u] * w;
  }
  reduction[tid] = l;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) reduction[tid] += reduction[tid + s];
    barrier();
  }
  const float inv = 1.0 / reduction[0];

  for (uint d = tid; d < HEAD_DIM; d += WG) {
    float acc = 0.0;
    uint c = 0u;
    for (; c + 8u <= records; c += 8u) {
      float v[8];
      [[unroll]] for (uint k = 0u; k < 8u; k++) v[k] = part[base + (c + k) * REC + d];
      [[unroll]] for (uint k = 0u; k < 8u; k++) acc += v[k] * weightOf[c + k];
    }
    for (; c < records; c++) acc += part[base + c * REC + d] * weightOf[c];
    o[p.outOffset + row * HEAD_DIM + d] = acc * inv;
  }
}
