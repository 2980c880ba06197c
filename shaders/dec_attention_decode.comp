#version 450
// dec_attention_decode: pass 1 of dec_attention for decode (one query token per workgroup, spans
// of one chunk), with the work of a chunk spread over every thread.  dec_attention's general pass 1
// walks its phases with a few threads each (one thread per position for the scores, R threads for
// the softmax, HD/2 for the values): on a GPU that is serial latency, not bandwidth.  Here:
//   scores: LANES threads per position, each dotting its HEAD_DIM / LANES dims (uvec4 of 8 halves,
//           interleaved so a position's LANES threads read consecutive 16 B) with every row's q
//           (read from q directly: no staging barrier, the loads go out with the K loads), the
//           partial dots into shared memory;
//   values: one thread per (row r, uvec4 column u of 8 dims), ROWS * HEAD_DIM / 8 <= WG: it sums
//           its row's lane partials, takes the chunk's max and exp itself (the row's threads
//           compute the same values in the same order, so no second barrier and no cross-thread
//           reduction), and accumulates its 8 dims; with UNROLL its value loads are issued before
//           the barrier, together with the K loads.
// One barrier per chunk.  Writes the same partial record as dec_attention (per (token, head,
// chunk): HEAD_DIM weighted-value floats, m, l, 2 pad), merged by dec_attention_combine.
//
// Workgroup (c0, kh, t): KV head kh, token t (rows r = heads kh * ROWS + r of token t); it walks
// chunks c0, c0 + gridX, ... while the chunk starts inside the token's context, so a grid capped
// below numChunks still covers every chunk and a long cache's surplus workgroups stay few.
// Token t sees n + t positions, n as dec_attention (p.n + positions[posIndex] with flags bit 0,
// capped at limit - (S - 1)); batched (flags bit 1): token t sees min(positions[posIndex + t] + 1,
// limit) positions of its own sequence, whose rows start at positions[posIndex + BATCH_WORDS + t]
// - positions[posIndex + t].  Push constants: dec_attention's; kOffset (uvec4) locates both the
// keys and the values (one layout), vOffset, tokensPerGroup and iters are not read.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 1) const uint HEAD_DIM = 128u;   // 32, 64, 128 or 256
layout(constant_id = 2) const uint CHUNK = 32u;       // positions per record
layout(constant_id = 3) const uint ROWS = 8u;         // heads / kvHeads; ROWS * HEAD_DIM / 8 <= WG
layout(constant_id = 4) const bool UNROLL = false;    // unrolled loops, value loads before the barrier (GPUs)
layout(constant_id = 5) const uint LANES = 4u;        // threads per position (a power of two dividing HEAD_DIM / 8)

const uint WG = gl_WorkGroupSize.x;
const uint HD4 = HEAD_DIM / 4u;
const uint HD8 = HEAD_DIM / 8u;
const uint REC4 = HD4 + 1u;              // a record in vec4s
const uint PER_LANE = HD8 / LANES;       // uvec4 of a key row per thread
const uint POS_STEP = WG / LANES;        // positions per pass of the score loop
const uint PASSES = (CHUNK + POS_STEP - 1u) / POS_STEP;
const uint PREFETCH = CHUNK < 32u ? CHUNK : 32u; // value loads held in registers across the barrier (UNROLL)
const uint BATCH_WORDS = 64u;

layout(set = 0, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };
layout(set = 0, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(set = 0, binding = 3) writeonly buffer P { vec4 part4[]; };
layout(set = 0, binding = 4) readonly buffer Pos { uint positions[]; };

layout(push_constant) uniform Params {
  uint n;
  uint S;
  uint heads;
  uint kvHeads;
  uint kOffset;        // the layer's first key/value, in uvec4
  uint vOffset;        // (dec_attention's; unread)
  uint qOffset;        // vec4
  uint numChunks;      // records per (token, head)
  uint tokensPerGroup; // (unread: one token per workgroup)
  float scale;
  uint posIndex;
  uint flags;
  uint limit;
  uint iters;          // (unread: 1)
} p;

// the lane partials of each (row, position) score
shared float sp[ROWS * CHUNK * LANES];

uint contextN() {
  const uint extra = (p.flags & 1u) != 0u ? positions[p.posIndex] : 0u;
  return p.n + min(extra, p.limit - (p.S - 1u) - p.n);
}

vec4 lo4(uvec4 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }
vec4 hi4(uvec4 w) { return vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w)); }

float score(uint r, uint j) {
  float s = 0.0;
  [[unroll]] for (uint l = 0u; l < LANES; l++) s += sp[(r * CHUNK + j) * LANES + l];
  return s * p.scale;
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint kh = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
  const bool batched = (p.flags & 2u) != 0u;
  const uint seen = batched ? min(positions[p.posIndex + t] + 1u, p.limit) : contextN() + t;
  const uint rowBase = batched ? positions[p.posIndex + BATCH_WORDS + t] - positions[p.posIndex + t] : 0u;
  const uint base = p.kOffset + rowBase * p.kvHeads * HD8;  // position 0 of this sequence, in uvec4
  const uint lane = tid % LANES, slot = tid / LANES;       // score loop: lane of position slot (+ pass * POS_STEP)
  const uint vr = tid / HD8, vu = tid % HD8;               // value loop: row, column
  const bool valueThread = vr < ROWS;
  const uint q0 = p.qOffset + (t * p.heads + kh * ROWS) * HD4;

  for (uint c = gl_WorkGroupID.x; c < p.numChunks; c += gl_NumWorkGroups.x) {
    const uint start = c * CHUNK;
    if (start >= seen) break;  // uniform: past the token's context (a surplus workgroup at once)
    const uint len = min(CHUNK, seen - start);

    // scores: partial dots of LANES threads per position
    for (uint pass = 0u; pass < PASSES; pass++) {
      const uint j = pass * POS_STEP + slot;
      float acc[ROWS];
      [[unroll]] for (uint r = 0u; r < ROWS; r++) acc[r] = 0.0;
      if (j < len) {
        const uint row = base + ((start + j) * p.kvHeads + kh) * HD8 + lane;
        if (UNROLL) {
          uvec4 w[PER_LANE];
          [[unroll]] for (uint i = 0u; i < PER_LANE; i++) w[i] = k8[row + i * LANES];
          [[unroll]] for (uint i = 0u; i < PER_LANE; i++) {
            const uint d = 2u * (i * LANES + lane);
            const vec4 lo = lo4(w[i]), hi = hi4(w[i]);
            [[unroll]] for (uint r = 0u; r < ROWS; r++) acc[r] += dot(q4[q0 + r * HD4 + d], lo) + dot(q4[q0 + r * HD4 + d + 1u], hi);
          }
        } else {
          for (uint i = 0u; i < PER_LANE; i++) {
            const uvec4 w = k8[row + i * LANES];
            const uint d = 2u * (i * LANES + lane);
            const vec4 lo = lo4(w), hi = hi4(w);
            [[unroll]] for (uint r = 0u; r < ROWS; r++) acc[r] += dot(q4[q0 + r * HD4 + d], lo) + dot(q4[q0 + r * HD4 + d + 1u], hi);
          }
        }
      }
      if (j < CHUNK) {
        [[unroll]] for (uint r = 0u; r < ROWS; r++) sp[(r * CHUNK + j) * LANES + lane] = acc[r];
      }
    }

    const uint vrow = base + (start * p.kvHeads + kh) * HD8 + vu;  // position start's value column, + j * kvHeads * HD8
    const uint vstep = p.kvHeads * HD8;
    uvec4 vv[PREFETCH];
    if (UNROLL && valueThread) {
      [[unroll]] for (uint j = 0u; j < PREFETCH; j++) vv[j] = j < len ? v8[vrow + j * vstep] : uvec4(0u);
    }
    barrier();

    if (valueThread) {
      float m = -3.0e38;
      float l = 0.0;
      vec4 a0 = vec4(0.0), a1 = vec4(0.0);
      if (UNROLL) {
        [[unroll]] for (uint j = 0u; j < CHUNK; j++) {
          if (j < len) m = max(m, score(vr, j));
        }
        [[unroll]] for (uint j = 0u; j < CHUNK; j++) {
          if (j < len) {
            const float e = exp(score(vr, j) - m);
            const uvec4 w = j < PREFETCH ? vv[j] : v8[vrow + j * vstep];
            l += e;
            a0 += e * lo4(w);
            a1 += e * hi4(w);
          }
        }
      } else {
        for (uint j = 0u; j < len; j++) m = max(m, score(vr, j));
        for (uint j = 0u; j < len; j++) {
          const float e = exp(score(vr, j) - m);
          const uvec4 w = v8[vrow + j * vstep];
          l += e;
          a0 += e * lo4(w);
          a1 += e * hi4(w);
        }
      }
      const uint rec = ((t * p.heads + kh * ROWS + vr) * p.numChunks + c) * REC4;
      part4[rec + 2u * vu] = a0;
      part4[rec + 2u * vu + 1u] = a1;
      if (vu == 0u) part4[rec + HD4] = vec4(m, l, 0.0, 0.0);
    }
    if (c + gl_NumWorkGroups.x < p.numChunks) barrier();  // uniform: sp is rewritten by the next chunk
  }
}
