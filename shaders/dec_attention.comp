#version 450
// dec_attention: attention over an f16 KV cache, split over the sequence (flash-decoding), pass 1
// of 2.  One workgroup per (span c, KV head kh, token group z) serves every query row that reads
// kh: the G = heads / kvHeads query heads of each of its tokens (rows r = tl * G + g: token
// t0 + tl, head kh * G + g), so each K and V row of the span is read from memory once for all of
// them.  A span is `iters` chunks of CHUNK positions, walked in order with the online-softmax
// rule (running max m, sum l, and the weighted values rescaled by exp(m_old - m_new)): decode
// takes iters = 1 (many short spans, parallel over the sequence), a prompt chunk of many tokens
// takes longer spans so its partials stay few.  Token t sees positions 0 .. n + t - 1 (causal),
// where n = p.n, plus positions[posIndex] when flags bit 0 is set (so one recorded command buffer
// serves any position: the host writes the word between submits), capped at limit - (S - 1) so the
// last token never reads past the `limit` positions the grid, the partials and the cache were
// sized for.  Batched (flags bit 1: tokens of different sequences sharing one cache, one token
// per group): token t sees positions[posIndex + t] + 1 positions (capped at limit) of its own
// sequence, whose rows start at positions[posIndex + BATCH_WORDS + t] - positions[posIndex + t].
// Writes, per (token, head, span), the partial record
// [HEAD_DIM floats: sum_j exp(s_j - m) v_j][m][l = sum_j exp(s_j - m)][2 pad]; the combine pass
// (dec_attention_combine) merges the spans with the log-sum-exp rule.
//
// K and V: [ctx][kvHeads][HEAD_DIM] halves (IEEE binary16, two per uint, the lower half first),
// read as uint/uvec4 and unpacked with unpackHalf2x16: no 16-bit storage feature needed.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint HEAD_DIM = 128u;   // 32, 64, 128 or 256 (a multiple of 8)
layout(constant_id = 2) const uint CHUNK = 64u;       // positions per workgroup
layout(constant_id = 3) const uint MAX_ROWS = 8u;     // >= G * tokensPerGroup
layout(constant_id = 4) const bool UNROLL = false;    // unroll the K and V loops (GPUs)

const uint WG = gl_WorkGroupSize.x;
const uint HD4 = HEAD_DIM / 4u;
const uint HD8 = HEAD_DIM / 8u;
const uint HD2 = HEAD_DIM / 2u;
const uint REC = HEAD_DIM + 4u;

layout(set = 0, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };
layout(set = 0, binding = 2) readonly buffer V { uint v2[]; };
layout(set = 0, binding = 3) writeonly buffer P { float part[]; };
layout(set = 0, binding = 4) readonly buffer Pos { uint positions[]; };  // any buffer when flags bit 0 is clear

layout(push_constant) uniform Params {
  uint n;              // positions seen by token 0 (token t sees n + t)
  uint S;              // query tokens
  uint heads;
  uint kvHeads;
  uint kOffset;        // this layer's keys, in uvec4 (8 halves)
  uint vOffset;        // this layer's values, in uints (2 halves)
  uint qOffset;        // q, in vec4 (4 floats)
  uint numChunks;      // partial records per (token, head): the grid's x
  uint tokensPerGroup; // tokens per workgroup (z splits S)
  float scale;         // 1 / sqrt(HEAD_DIM)
  uint posIndex;       // the word of positions[] added to n (flags bit 0)
  uint flags;          // bit 0: n += positions[posIndex]; bit 1: batched (see above)
  uint limit;          // positions the last token may see at most (>= n + S - 1): n is capped at limit - (S - 1)
  uint iters;          // chunks per span (>= 1)
} p;

const uint BATCH_WORDS = 64u;

// n of this call: p.n (+ positions[posIndex]), capped (without overflow) so n + S - 1 <= limit
uint contextN() {
  const uint extra = (p.flags & 1u) != 0u ? positions[p.posIndex] : 0u;
  return p.n + min(extra, p.limit - (p.S - 1u) - p.n);
}

shared vec4 qs[MAX_ROWS * HD4];
shared float sc[MAX_ROWS * CHUNK];
// spans of several chunks: each row's running max and sum, the chunk's rescale factor, and the
// weighted values so far (as pairs of dimensions)
shared float rowM[MAX_ROWS];
shared float rowL[MAX_ROWS];
shared float rowAlpha[MAX_ROWS];
shared vec2 accS[MAX_ROWS * HD2];

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint c = gl_WorkGroupID.x, kh = gl_WorkGroupID.y;
  const uint G = p.heads / p.kvHeads;
  const uint t0 = gl_WorkGroupID.z * p.tokensPerGroup;
  const uint T = min(p.tokensPerGroup, p.S - t0);
  const uint R = G * T;
  const uint spanStart = c * p.iters * CHUNK;
  const bool batched = (p.flags & 2u) != 0u;
  // batched: n + t0 is the group's one token's count (uint arithmetic wraps back), and its rows start at rowBase
  const uint n = batched ? min(positions[p.posIndex + t0] + 1u, p.limit) - t0 : contextN();
  const uint rowBase = batched ? positions[p.posIndex + BATCH_WORDS + t0] - positions[p.posIndex + t0] : 0u;
  const uint kOff = p.kOffset + rowBase * p.kvHeads * HD8;
  const uint vOff = p.vOffset + rowBase * p.kvHeads * HD2;
  // positions of this span seen by the group's last token; none: a surplus workgroup
  const uint seen = n + t0 + T - 1u;
  if (spanStart >= seen) return;
  const bool single = p.iters == 1u;  // uniform: one chunk, written straight out (decode)

  for (uint i = tid; i < R * HD4; i += WG) {
    const uint r = i / HD4, d = i % HD4;
    const uint t = t0 + r / G, h = kh * G + r % G;
    qs[i] = q4[p.qOffset + (t * p.heads + h) * HD4 + d];
  }
  if (!single) {
    if (tid < R) { rowM[tid] = -3.0e38; rowL[tid] = 0.0; }
    for (uint i = tid; i < R * HD2; i += WG) accS[i] = vec2(0.0);
  }
  barrier();

  for (uint it = 0u; it < p.iters; it++) {
    const uint start = spanStart + it * CHUNK;
    if (start >= seen) break;  // uniform
    const uint len = min(CHUNK, seen - start);

    // scores: one thread per position, all rows at once (each K row loaded once)
    for (uint j = tid; j < len; j += WG) {
      const uint base = kOff + ((start + j) * p.kvHeads + kh) * HD8;
      float acc[MAX_ROWS];
      [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) acc[r] = 0.0;
      // UNROLL (GPUs): the row's HD8 loads are issued together, one memory latency instead of HD8 in
      // a row; a CPU device compiles the unrolled loops far too slowly, so it keeps the plain ones.
      if (UNROLL) {
        [[unroll]] for (uint i = 0u; i < HD8; i++) {
          const uvec4 w = k8[base + i];
          const vec4 lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
          const vec4 hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
          [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) {
            if (r < R) acc[r] += dot(qs[r * HD4 + 2u * i], lo) + dot(qs[r * HD4 + 2u * i + 1u], hi);
          }
        }
      } else {
        for (uint i = 0u; i < HD8; i++) {
          const uvec4 w = k8[base + i];
          const vec4 lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
          const vec4 hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
          [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) {
            if (r < R) acc[r] += dot(qs[r * HD4 + 2u * i], lo) + dot(qs[r * HD4 + 2u * i + 1u], hi);
          }
        }
      }
      [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) {
        if (r < R) sc[r * CHUNK + j] = acc[r] * p.scale;
      }
    }
    barrier();

    // per row: max over its causal positions, exp, sum (masked positions weigh 0); over a span,
    // the new max m' rescales what came before by exp(m - m')
    if (tid < R) {
      const uint r = tid;
      const uint t = t0 + r / G, h = kh * G + r % G;
      // positions token t sees in this chunk: >= 1 for every span the combine reads of it (in its first chunk); 0 past its context
      const uint cnt = n + t > start ? min(len, n + t - start) : 0u;
      float m = single ? -3.0e38 : rowM[r];
      for (uint j = 0u; j < cnt; j++) m = max(m, sc[r * CHUNK + j]);
      float l = 0.0;
      for (uint j = 0u; j < len; j++) {
        const float e = j < cnt ? exp(sc[r * CHUNK + j] - m) : 0.0;
        sc[r * CHUNK + j] = e;
        l += e;
      }
      if (single) {
        const uint rec = ((t * p.heads + h) * p.numChunks + c) * REC;
        part[rec + HEAD_DIM] = m;
        part[rec + HEAD_DIM + 1u] = l;
      } else {
        const float alpha = exp(rowM[r] - m);
        rowAlpha[r] = alpha;
        rowL[r] = rowL[r] * alpha + l;
        rowM[r] = m;
      }
    }
    barrier();

    // weighted values: one thread per pair of dimensions, all rows at once (each V row loaded once)
    for (uint u = tid; u < HD2; u += WG) {
      vec2 acc[MAX_ROWS];
      [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) acc[r] = vec2(0.0);
      if (UNROLL) {
        // over the whole chunk (positions past len masked): the CHUNK value loads are issued together
        [[unroll]] for (uint j = 0u; j < CHUNK; j++) {
          if (j < len) {
            const vec2 v = unpackHalf2x16(v2[vOff + ((start + j) * p.kvHeads + kh) * HD2 + u]);
            [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) {
              if (r < R) acc[r] += sc[r * CHUNK + j] * v;
            }
          }
        }
      } else {
        for (uint j = 0u; j < len; j++) {
          const vec2 v = unpackHalf2x16(v2[vOff + ((start + j) * p.kvHeads + kh) * HD2 + u]);
          [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) {
            if (r < R) acc[r] += sc[r * CHUNK + j] * v;
          }
        }
      }
      [[unroll]] for (uint r = 0u; r < MAX_ROWS; r++) {
        if (r < R) {
          if (single) {
            const uint t = t0 + r / G, h = kh * G + r % G;
            const uint rec = ((t * p.heads + h) * p.numChunks + c) * REC;
            part[rec + 2u * u] = acc[r].x;
            part[rec + 2u * u + 1u] = acc[r].y;
          } else {
            accS[r * HD2 + u] = accS[r * HD2 + u] * rowAlpha[r] + acc[r];
          }
        }
      }
    }
    barrier();  // sc and rowAlpha are rewritten by the next chunk
  }
  if (single) return;
  for (uint i = tid; i < R * HD2; i += WG) {
    const uint r = i / HD2, u = i % HD2;
    const uint t = t0 + r / G, h = kh * G + r % G;
    const uint rec = ((t * p.heads + h) * p.numChunks + c) * REC;
    part[rec + 2u * u] = accS[i].x;
    part[rec + 2u * u + 1u] = accS[i].y;
  }
  if (tid < R) {
    const uint t = t0 + tid / G, h = kh * G + tid % G;
    const uint rec = ((t * p.heads + h) * p.numChunks + c) * REC;
    part[rec + HEAD_DIM] = rowM[tid];
    part[rec + HEAD_DIM + 1u] = rowL[tid];
  }
}
