#version 450
// dec_attention_combine: pass 2 of dec_attention.  One workgroup per (head h, token t) merges the
// ceil((n + t) / span) partial records of that row (span = pass 1's CHUNK * iters) with the
// log-sum-exp rule:
//   M = max_c m_c,  L = sum_c l_c exp(m_c - M),  out = sum_c acc_c exp(m_c - M) / L.
// Records past the row's causal context are never read (pass 1 may leave them unwritten).
// n is pass 1's: p.n (+ positions[posIndex] with flags bit 0), capped at limit - (S - 1).
layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint HEAD_DIM = 128u;

const uint WG = gl_WorkGroupSize.x;
const uint REC = HEAD_DIM + 4u;

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
  uint flags;      // as pass 1 (bit 0: n += positions[posIndex])
  uint limit;      // as pass 1
  uint span;       // positions per record: pass 1's CHUNK * iters
} p;

uint contextN() {
  const uint extra = (p.flags & 1u) != 0u ? positions[p.posIndex] : 0u;
  return p.n + min(extra, p.limit - (p.S - 1u) - p.n);
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
  const uint row = t * p.heads + h;
  const uint chunks = (contextN() + t + p.span - 1u) / p.span;
  const uint base = row * p.numChunks * REC;
  float M = -3.0e38;
  for (uint c = 0u; c < chunks; c++) M = max(M, part[base + c * REC + HEAD_DIM]);
  float L = 0.0;
  for (uint c = 0u; c < chunks; c++) L += part[base + c * REC + HEAD_DIM + 1u] * exp(part[base + c * REC + HEAD_DIM] - M);
  const float inv = 1.0 / L;
  for (uint d = tid; d < HEAD_DIM; d += WG) {
    float acc = 0.0;
    for (uint c = 0u; c < chunks; c++) acc += part[base + c * REC + d] * exp(part[base + c * REC + HEAD_DIM] - M);
    o[p.outOffset + row * HEAD_DIM + d] = acc * inv;
  }
}
