#version 450
// dec_attention_combine: pass 2 of dec_attention.  One workgroup per (head h, token t) merges the
// ceil((n + t) / span) partial records of that row (span = pass 1's CHUNK * iters) with the
// log-sum-exp rule:
//   M = max_c m_c,  L = sum_c l_c exp(m_c - M),  out = sum_c acc_c exp(m_c - M) / L,
// then, with flags bit 2, out *= sigmoid(gate) (Qwen3.5's output gate, as dec_gating's mode 0:
// gate laid out as out, at gateOffset floats), so the gate costs no dispatch and barrier of its own.
// Records past the row's causal context are never read (pass 1 may leave them unwritten).
// n is pass 1's: p.n (+ positions[posIndex] with flags bit 0), capped at limit - (S - 1).
//
// Parallel over the records and the dims: thread (column d4 of 4 dims, group g) sums the records
// c = g, g + RG, ... of its column (RG = WG / min(WG, HEAD_DIM / 4) groups), 8 loads issued at a
// time, relative to the largest m of its own records (so these loads need no M and go out first),
// rescaled to M at the end; the groups' sums meet in shared memory (one barrier).  M and L: with at
// most DIRECT records (decode's common case) every thread merges all the records' (m, l) itself
// (L1 hits after its own loads: no barrier for them); with more, each thread merges its share
// online and the WG pairs meet in shared memory (one barrier more).
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint HEAD_DIM = 128u;

const uint WG = gl_WorkGroupSize.x;  // a power of two
const uint HD4 = HEAD_DIM / 4u;
const uint REC4 = HD4 + 1u;          // a record in vec4s: HD4 weighted-value vec4s, then (m, l, pad, pad)
const uint COLS = WG < HD4 ? WG : HD4;     // threads per record group
const uint RG = WG / COLS;           // record groups
const uint DIRECT = 64u;             // records every thread merges itself
const uint BATCH = 8u;               // loads issued together

layout(set = 0, binding = 0) readonly buffer P { vec4 part4[]; };
layout(set = 0, binding = 1) writeonly buffer O { float o[]; };
layout(set = 0, binding = 2) readonly buffer Pos { uint positions[]; };  // any buffer when flags bit 0 is clear
layout(set = 0, binding = 3) readonly buffer Gate { float gate[]; };     // any buffer when flags bit 2 is clear
// flags bit 3: out also written quantized for the integer-dot GGML GEMV that reads it (o_proj), as
// quantize_act with groups of 16 would from out: row (token t, head h)'s group j at
// (t * heads + h) * HEAD_DIM / 16 + j; o_proj then skips its own quantize dispatch and barrier
layout(set = 0, binding = 4) writeonly buffer XQ { uvec4 xq[]; };
layout(set = 0, binding = 5) writeonly buffer XS { float xscale[]; };
layout(set = 0, binding = 6) writeonly buffer XU { int xsum[]; };

layout(push_constant) uniform Params {
  uint n;          // as pass 1
  uint S;
  uint heads;
  uint numChunks;  // records per row (pass 1's grid x)
  uint outOffset;  // floats
  uint posIndex;   // as pass 1
  uint flags;      // as pass 1 (bit 0: n += positions[posIndex]; bit 1: batched, token t sees positions[posIndex + t] + 1, capped at limit); bit 2: the output gate
  uint limit;      // as pass 1
  uint span;       // positions per record: pass 1's CHUNK * iters
  uint gateOffset; // floats (flags bit 2)
} p;

shared vec2 pairs[WG];   // (m, l) of each thread's records (more than DIRECT)
shared vec4 sums[WG];    // each group's weighted sum of its column
shared vec4 outRow[HD4]; // flags bit 3: the row as written, for its quantization

#include "quantize_group16.glsl"

uint contextN() {
  const uint extra = (p.flags & 1u) != 0u ? positions[p.posIndex] : 0u;
  return p.n + min(extra, p.limit - (p.S - 1u) - p.n);
}

// (m, l) merged with (mc, lc): the larger max, the sums rescaled to it
vec2 merge(vec2 a, vec2 b) {
  const float m = max(a.x, b.x);
  return vec2(m, a.y * exp(a.x - m) + b.y * exp(b.x - m));
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
  const uint row = t * p.heads + h;
  const bool gated = (p.flags & 4u) != 0u;
  const bool quantized = (p.flags & 8u) != 0u;
  const uint d4 = tid % COLS, g = tid / COLS;
  // the gate's loads go out first: they need nothing else
  vec4 gv[(HD4 + COLS - 1u) / COLS];
  if (gated && g == 0u) {
    [[unroll]] for (uint k = 0u; k < (HD4 + COLS - 1u) / COLS; k++) {
      const uint d = 4u * (d4 + k * COLS);
      const uint gi = p.gateOffset + row * HEAD_DIM + d;
      if (d < HEAD_DIM) gv[k] = vec4(gate[gi], gate[gi + 1u], gate[gi + 2u], gate[gi + 3u]);
    }
  }
  const uint seen = (p.flags & 2u) != 0u ? min(positions[p.posIndex + t] + 1u, p.limit) : contextN() + t;
  const uint records = min((seen + p.span - 1u) / p.span, p.numChunks);
  const uint base = row * p.numChunks * REC4;

  // this thread's weighted sums, relative to the largest m of its own records (accM): they need
  // no M, so their loads go out first; rescaled to M once it is known
  const uint COLUMNS = (HD4 + COLS - 1u) / COLS;
  vec4 acc[COLUMNS];
  float accM = -3.0e38;
  [[unroll]] for (uint k = 0u; k < COLUMNS; k++) acc[k] = vec4(0.0);
  for (uint c = g; c < records; c += BATCH * RG) {
    float m[BATCH];
    [[unroll]] for (uint i = 0u; i < BATCH; i++) m[i] = c + i * RG < records ? part4[base + (c + i * RG) * REC4 + HD4].x : -3.0e38;
    [[unroll]] for (uint k = 0u; k < COLUMNS; k++) {
      const uint col = d4 + k * COLS;
      vec4 a[BATCH];
      [[unroll]] for (uint i = 0u; i < BATCH; i++) a[i] = c + i * RG < records && col < HD4 ? part4[base + (c + i * RG) * REC4 + col] : vec4(0.0);
      float bm = accM;
      [[unroll]] for (uint i = 0u; i < BATCH; i++) bm = max(bm, m[i]);
      vec4 s = acc[k] * exp(accM - bm);
      [[unroll]] for (uint i = 0u; i < BATCH; i++) s += a[i] * exp(m[i] - bm);
      acc[k] = s;
    }
    [[unroll]] for (uint i = 0u; i < BATCH; i++) accM = max(accM, m[i]);
  }

  vec2 ml = vec2(-3.0e38, 0.0);  // (M, L)
  if (records <= DIRECT) {
    for (uint c = 0u; c < records; c += BATCH) {
      vec2 r[BATCH];
      [[unroll]] for (uint k = 0u; k < BATCH; k++) r[k] = c + k < records ? part4[base + (c + k) * REC4 + HD4].xy : vec2(-3.0e38, 0.0);
      [[unroll]] for (uint k = 0u; k < BATCH; k++) ml.x = max(ml.x, r[k].x);
    }
    for (uint c = 0u; c < records; c += BATCH) {
      vec2 r[BATCH];
      [[unroll]] for (uint k = 0u; k < BATCH; k++) r[k] = c + k < records ? part4[base + (c + k) * REC4 + HD4].xy : vec2(-3.0e38, 0.0);
      [[unroll]] for (uint k = 0u; k < BATCH; k++) ml.y += r[k].y * exp(r[k].x - ml.x);
    }
  } else {
    for (uint c = tid; c < records; c += WG) ml = merge(ml, part4[base + c * REC4 + HD4].xy);
    pairs[tid] = ml;
    barrier();
    ml = vec2(-3.0e38, 0.0);
    for (uint i = 0u; i < WG; i++) ml.x = max(ml.x, pairs[i].x);
    for (uint i = 0u; i < WG; i++) ml.y += pairs[i].y * exp(pairs[i].x - ml.x);
  }
  const float inv = 1.0 / ml.y, rescale = exp(accM - ml.x);

  [[unroll]] for (uint k = 0u; k < COLUMNS; k++) {
    const uint col = d4 + k * COLS;
    vec4 sum = acc[k] * rescale;
    if (RG > 1u) {  // then COLUMNS = 1
      sums[tid] = sum;
      barrier();
      if (g == 0u) for (uint i = 1u; i < RG; i++) sum += sums[i * COLS + d4];
    }
    if (g == 0u && col < HD4) {
      vec4 y = sum * inv;
      if (gated) y *= 1.0 / (1.0 + exp(-gv[k]));
      const uint oi = p.outOffset + row * HEAD_DIM + 4u * col;
      o[oi] = y.x;
      o[oi + 1u] = y.y;
      o[oi + 2u] = y.z;
      o[oi + 3u] = y.w;
      if (quantized) outRow[col] = y;
    }
  }
  if (!quantized) return;  // uniform
  barrier();
  // one thread a group of 16 (4 vec4s), quantize_act's rule
  for (uint q = tid; q < HEAD_DIM / 16u; q += WG) {
    float v[16];
    [[unroll]] for (uint j = 0u; j < 16u; j++) v[j] = outRow[4u * q + j / 4u][j % 4u];
    uvec4 words;
    float scale;
    int qsum;
    quantizeGroup16(v, words, scale, qsum);
    const uint at = row * (HEAD_DIM / 16u) + q;
    xq[at] = words;
    xscale[at] = scale;
    xsum[at] = qsum;
  }
}
