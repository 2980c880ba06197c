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
//
// ROPE_FOLD (not batched): dec_rope_kv's work folded in, one dependent step fewer.  q (binding 0)
// and the new k, v (bindings 5, 6) are the q/k/v GEMVs' raw outputs; token t is at position
// contextN() - 1 + t (dec_rope_kv's pos0 + t + positions word when n = pos0 + 1).  Every
// workgroup normalises and rotates its ROWS q heads itself (q is tiny) into shared memory; the
// new k/v rows of tokens u <= t that lie in a chunk it walks it computes too (normalised, rotated,
// rounded to f16) and uses from shared memory in place of the cache's rows, which it does not read:
// the workgroup of token u (z = u) whose chunk holds u's position writes u's k and v rows to the
// cache (bindings 9, 10 alias 1, 2), and no workgroup of this dispatch reads a row written in it.
// The arithmetic is rope.glsl's, the sums of squares dec_rope_kv's: each head in a slice of
// ROPE_WG logical threads (whole subgroups), subgroupAdd then the tree over the slice's subgroups
// (USE_SUBGROUP), or the shared tree over the slice, so the bits are dec_rope_kv's (64 threads) on
// a device whose two pipelines get the same subgroup size.  One extra barrier before the chunks
// (plus the norm's, with flags bit 0 of foldFlags).
//
// COMBINE_TAIL: dec_attention_combine's work in the last workgroup of each (KV head, token) to
// finish (an arrival counter, zeroed again by that workgroup for the next call), so the combine needs
// no dispatch and barrier of its own: for each of its ROWS rows, M = max m_c, L = sum l_c exp(m_c -
// M), out = sum acc_c exp(m_c - M) / L, merged online over the records (equal to the combine's to
// rounding, not its bits), then the output gate (tailFlags bit 0) and the quantized rows for o_proj
// (bit 1), as the combine writes them. The records are written and read coherent (other
// workgroups' writes of this dispatch), published by a fence before each workgroup's arrival.
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 1) const uint HEAD_DIM = 128u;   // 32, 64, 128 or 256
layout(constant_id = 2) const uint CHUNK = 32u;       // positions per record
layout(constant_id = 3) const uint ROWS = 8u;         // heads / kvHeads; ROWS * HEAD_DIM / 8 <= WG
layout(constant_id = 4) const bool UNROLL = false;    // unrolled loops, value loads before the barrier (GPUs)
layout(constant_id = 5) const uint LANES = 4u;        // threads per position (a power of two dividing HEAD_DIM / 8)
layout(constant_id = 6) const bool ROPE_FOLD = false; // q/k head norms, RoPE and the KV append folded in (see above)
layout(constant_id = 7) const bool USE_SUBGROUP = true; // ROPE_FOLD's head norm: as dec_rope_kv's (subgroups of at most ROPE_WG)
layout(constant_id = 8) const bool COMBINE_TAIL = false; // the combine in each row group's last workgroup (see above)

const uint WG = gl_WorkGroupSize.x;
const uint HD4 = HEAD_DIM / 4u;
const uint HD8 = HEAD_DIM / 8u;
const uint REC4 = HD4 + 1u;              // a record in vec4s
const uint PER_LANE = HD8 / LANES;       // uvec4 of a key row per thread
const uint POS_STEP = WG / LANES;        // positions per pass of the score loop
const uint PASSES = (CHUNK + POS_STEP - 1u) / POS_STEP;
const uint PREFETCH = CHUNK < 32u ? CHUNK : 32u; // value loads held in registers across the barrier (UNROLL)
const uint BATCH_WORDS = 64u;
const uint ROPE_WG = 64u;                // dec_rope_kv's threads a head (its default workgroup)
const uint NEW_ROWS = 4u;                // new positions a call at most (DECODE_ATTENTION_TOKENS)
const uint FOLD_HEADS = ROWS + NEW_ROWS; // heads a workgroup normalises at most
const uint MERGE_AHEAD = 4u;             // COMBINE_TAIL: records loaded before any is merged

layout(set = 0, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };
layout(set = 0, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(set = 0, binding = 3) coherent buffer P { vec4 part4[]; };  // written; read by COMBINE_TAIL
layout(set = 0, binding = 4) readonly buffer Pos { uint positions[]; };
// ROPE_FOLD only
layout(set = 0, binding = 5) readonly buffer KR { float kRaw[]; };
layout(set = 0, binding = 6) readonly buffer VR { float vRaw[]; };
layout(set = 0, binding = 7) readonly buffer Inv { float invFreq[]; };
layout(set = 0, binding = 8) readonly buffer Norm { float normW[]; };
layout(set = 0, binding = 9) writeonly buffer KC { uint kCache[]; };
layout(set = 0, binding = 10) writeonly buffer VC { uint vCache[]; };
// COMBINE_TAIL only: arrivals per (token, KV head), out, the output gate, out quantized (as the combine's)
layout(set = 0, binding = 11) coherent buffer Arr { uint arrivals[]; };
layout(set = 0, binding = 12) writeonly buffer O { float o[]; };
layout(set = 0, binding = 13) readonly buffer Gate { float gate[]; };
layout(set = 0, binding = 14) writeonly buffer XQ { uvec4 xq[]; };
layout(set = 0, binding = 15) writeonly buffer XS { float xscale[]; };
layout(set = 0, binding = 16) writeonly buffer XU { int xsum[]; };

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
  // ROPE_FOLD only
  uint kRawOffset;     // floats: token u's KV head h at kRawOffset + (u * kvHeads + h) * HEAD_DIM
  uint vRawOffset;     // floats, as kRawOffset
  uint invOffset;      // floats
  uint qNormOffset;    // floats in normW (foldFlags bit 0)
  uint kNormOffset;    // floats in normW (foldFlags bit 0)
  float eps;           // (foldFlags bit 0)
  uint rotaryDim;      // dims of each head that rotate (multiple of 4, <= HEAD_DIM); 0: HEAD_DIM
  uint foldFlags;      // bit 0: head norm
  // COMBINE_TAIL only
  uint outOffset;      // floats
  uint gateOffset;     // floats
  uint tailFlags;      // bit 0: the output gate; bit 1: out quantized too
} p;

// the lane partials of each (row, position) score
shared float sp[ROWS * CHUNK * LANES];
// ROPE_FOLD: the workgroup's q rows (normalised, rotated), the new positions' k and v rows (f16
// pairs as the cache holds them, token u's at u * HD8), the head norms' partial sums
shared vec4 qs4[ROPE_FOLD ? ROWS * HD4 : 1u];
shared uvec4 newK8[ROPE_FOLD ? NEW_ROWS * HD8 : 1u];
shared uvec4 newV8[ROPE_FOLD ? NEW_ROWS * HD8 : 1u];
shared float partial[ROPE_FOLD ? FOLD_HEADS * ROPE_WG : 1u];
uint newStart = 0xFFFFFFFFu;  // ROPE_FOLD: token 0's position (the new rows are newStart + u)
// COMBINE_TAIL: the rows as written (for their quantization); whether this workgroup arrived last
shared vec4 tailRows[COMBINE_TAIL ? ROWS * HD4 : 1u];
shared bool arrivedLast;

#include "rope.glsl"
#include "quantize_group16.glsl"

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

// vec4 i = r * HD4 + d of the workgroup's q rows: the folded ones, else q's from q0.
vec4 qAt(uint q0, uint i) { return ROPE_FOLD ? qs4[i] : q4[q0 + i]; }

// uvec4 `col` of position pos's key (value) row, at k8[gi] (v8[gi]) unless it is a new row.
uvec4 keyAt(uint gi, uint pos, uint col) { return ROPE_FOLD && pos >= newStart ? newK8[(pos - newStart) * HD8 + col] : k8[gi]; }
uvec4 valueAt(uint gi, uint pos, uint col) { return ROPE_FOLD && pos >= newStart ? newV8[(pos - newStart) * HD8 + col] : v8[gi]; }

uint ceilPow2(uint n) { return n <= 1u ? 1u : 1u << uint(findMSB(n - 1u) + 1); }

// The index of the i-th set bit of mask.
uint nthBit(uint mask, uint i) {
  for (uint k = 0u; k < i; k++) mask &= mask - 1u;
  return uint(findLSB(mask));
}

// Elements e, e + 1 of a head at base: of raw q (isQ), else of raw k.
vec2 foldLoad(bool isQ, uint base, uint e) {
  return isQ ? vec2(q4[(base + e) >> 2u][(base + e) & 3u], q4[(base + e + 1u) >> 2u][(base + e + 1u) & 3u]) : vec2(kRaw[base + e], kRaw[base + e + 1u]);
}

// ROPE_FOLD's prologue (uniform; ends with a barrier): qs4 from the raw q rows of token t, newK8 /
// newV8 for the new rows of tokens u <= t in the chunks this workgroup walks (and the cache rows of
// token t's own), everything as dec_rope_kv computes it.
void foldRope(uint kh, uint t) {
  const uint tid = USE_SUBGROUP ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID : gl_LocalInvocationIndex;
  const uint slices = WG / ROPE_WG, slice = tid / ROPE_WG, lj = tid % ROPE_WG;
  const uint groups = HEAD_DIM / 4u, rd = p.rotaryDim == 0u ? HEAD_DIM : p.rotaryDim, half_ = rd >> 1u, rgroups = rd >> 2u;
  const bool norm = (p.foldFlags & 1u) != 0u;
  uint mask = 0u;  // tokens u <= t whose new row lies in a chunk of this workgroup
  for (uint u = 0u; u <= t; u++) {
    if (((newStart + u) / CHUNK) % gl_NumWorkGroups.x == gl_WorkGroupID.x) mask |= 1u << u;
  }
  const uint heads = ROWS + bitCount(mask), rounds = (heads + slices - 1u) / slices;
  // slice width of the norm's tree: the slice's subgroups, or its threads
  const uint sgs = USE_SUBGROUP ? ROPE_WG / gl_SubgroupSize : ROPE_WG;
  const uint count = USE_SUBGROUP ? sgs : min(ROPE_WG, groups);
  if (norm) {  // uniform
    for (uint r = 0u; r < rounds; r++) {
      const uint h = r * slices + slice;
      const bool isQ = h < ROWS;
      const uint u = isQ ? t : nthBit(mask, h - ROWS);
      const uint base = isQ ? 4u * p.qOffset + (t * p.heads + kh * ROWS + h) * HEAD_DIM : p.kRawOffset + (u * p.kvHeads + kh) * HEAD_DIM;
      precise float ss = 0.0;
      if (h < heads && lj < groups) {
        const uvec2 e = groupPairs(lj, rgroups, half_, rd);
        ss = ropeSquares(ss, foldLoad(isQ, base, e.x), foldLoad(isQ, base, e.y));
      }
      if (USE_SUBGROUP) {
        const float v = subgroupAdd(ss);
        if (h < heads && subgroupElect()) partial[h * sgs + (gl_SubgroupID % sgs)] = v;
      } else if (h < heads) {
        partial[h * ROPE_WG + lj] = ss;
      }
    }
    barrier();
    for (uint s = ceilPow2(count) >> 1u; s > 0u; s >>= 1u) {
      for (uint i = gl_LocalInvocationIndex; i < heads * sgs; i += WG) {
        const uint li = i % sgs;
        if (li < s && li + s < count) partial[i] += partial[i + s];
      }
      barrier();
    }
  }
  const uint row0 = 4u * p.kOffset;  // the layer's first cache uint
  // this thread's group of every q head: one position, so one set of weights, angles, cos and sin
  const bool rotate = lj < rgroups;
  const uvec2 e = groupPairs(min(lj, groups - 1u), rgroups, half_, rd);
  const vec2 f = rotate ? vec2(invFreq[p.invOffset + 2u * lj], invFreq[p.invOffset + 2u * lj + 1u]) : vec2(0.0);
  const vec4 qcs = rotate ? ropeCosSin(float(newStart + t), f) : vec4(0.0);
  const vec2 qw1 = norm ? vec2(normW[p.qNormOffset + e.x], normW[p.qNormOffset + e.x + 1u]) : vec2(1.0);
  const vec2 qw2 = norm ? vec2(normW[p.qNormOffset + e.y], normW[p.qNormOffset + e.y + 1u]) : vec2(1.0);
  for (uint r = 0u; r < rounds; r++) {
    const uint h = r * slices + slice;
    if (h >= heads || lj >= groups) continue;
    const bool isQ = h < ROWS;
    const uint u = isQ ? t : nthBit(mask, h - ROWS);
    const uint base = isQ ? 4u * p.qOffset + (t * p.heads + kh * ROWS + h) * HEAD_DIM : p.kRawOffset + (u * p.kvHeads + kh) * HEAD_DIM;
    vec2 x1 = foldLoad(isQ, base, e.x), x2 = foldLoad(isQ, base, e.y);
    const float inv = norm ? ropeInvNorm(partial[h * sgs], HEAD_DIM, p.eps) : 1.0;
    const vec2 w1 = !isQ && norm ? vec2(normW[p.kNormOffset + e.x], normW[p.kNormOffset + e.x + 1u]) : qw1;
    const vec2 w2 = !isQ && norm ? vec2(normW[p.kNormOffset + e.y], normW[p.kNormOffset + e.y + 1u]) : qw2;
    const vec4 cs = !isQ && rotate ? ropeCosSin(float(newStart + u), f) : qcs;
    ropeGroup(x1, x2, norm, inv, w1, w2, rotate, cs);
    if (isQ) {
      const uint i1 = h * HEAD_DIM + e.x, i2 = h * HEAD_DIM + e.y;
      qs4[i1 >> 2u][i1 & 3u] = x1.x; qs4[(i1 + 1u) >> 2u][(i1 + 1u) & 3u] = x1.y;
      qs4[i2 >> 2u][i2 & 3u] = x2.x; qs4[(i2 + 1u) >> 2u][(i2 + 1u) & 3u] = x2.y;
    } else {
      // uints e.x / 2 and e.y / 2 of the row, two halves each
      const uint vb = p.vRawOffset + (u * p.kvHeads + kh) * HEAD_DIM;
      const uint k1 = pack2(x1.x, x1.y), k2 = pack2(x2.x, x2.y);
      const uint v1 = pack2(vRaw[vb + e.x], vRaw[vb + e.x + 1u]), v2 = pack2(vRaw[vb + e.y], vRaw[vb + e.y + 1u]);
      const uint w1i = u * (HEAD_DIM / 2u) + (e.x >> 1u), w2i = u * (HEAD_DIM / 2u) + (e.y >> 1u);
      newK8[w1i >> 2u][w1i & 3u] = k1; newK8[w2i >> 2u][w2i & 3u] = k2;
      newV8[w1i >> 2u][w1i & 3u] = v1; newV8[w2i >> 2u][w2i & 3u] = v2;
      if (u == t) {  // the one writer of this row (no workgroup of this dispatch reads it from the cache)
        const uint c = row0 + ((newStart + u) * p.kvHeads + kh) * (HEAD_DIM / 2u);
        kCache[c + (e.x >> 1u)] = k1; kCache[c + (e.y >> 1u)] = k2;
        vCache[c + (e.x >> 1u)] = v1; vCache[c + (e.y >> 1u)] = v2;
      }
    }
  }
  barrier();
}

// COMBINE_TAIL: arrive; the last of the (KV head kh, token t) workgroups merges their rows' records.
void combineTail(uint kh, uint t, uint seen) {
  const uint tid = gl_LocalInvocationIndex;
  memoryBarrierBuffer();  // this workgroup's records before its arrival
  barrier();
  const uint counter = t * p.kvHeads + kh;
  if (tid == 0u) arrivedLast = atomicAdd(arrivals[counter], 1u) == gl_NumWorkGroups.x - 1u;
  barrier();
  if (!arrivedLast) return;  // uniform
  if (tid == 0u) atomicExchange(arrivals[counter], 0u);  // every other workgroup of the row group has arrived
  memoryBarrierBuffer();
  const uint vr = tid / HD8, vu = tid % HD8;  // row, 8-dim column: the value loop's threads
  const uint records = min((seen + CHUNK - 1u) / CHUNK, p.numChunks);
  const uint row = t * p.heads + kh * ROWS + vr;
  if (vr < ROWS) {
    const uint base = row * p.numChunks * REC4;
    float m = -3.0e38, l = 0.0;
    vec4 a0 = vec4(0.0), a1 = vec4(0.0);
    // MERGE_AHEAD records' loads in flight at once (a record at a time was one L2 round trip each,
    // in a row: the tail's latency grew with the context), merged in order as before
    for (uint c0 = 0u; c0 < records; c0 += MERGE_AHEAD) {
      vec4 ml[MERGE_AHEAD], r0[MERGE_AHEAD], r1[MERGE_AHEAD];
      [[unroll]] for (uint j = 0u; j < MERGE_AHEAD; j++) {
        const uint c = min(c0 + j, records - 1u);
        ml[j] = part4[base + c * REC4 + HD4];
        r0[j] = part4[base + c * REC4 + 2u * vu];
        r1[j] = part4[base + c * REC4 + 2u * vu + 1u];
      }
      [[unroll]] for (uint j = 0u; j < MERGE_AHEAD; j++) {
        if (c0 + j < records) {
          const float mn = max(m, ml[j].x), so = exp(m - mn), sn = exp(ml[j].x - mn);
          l = l * so + ml[j].y * sn;
          a0 = a0 * so + r0[j] * sn;
          a1 = a1 * so + r1[j] * sn;
          m = mn;
        }
      }
    }
    const float inv = 1.0 / l;
    vec4 y0 = a0 * inv, y1 = a1 * inv;
    const uint oi = p.outOffset + row * HEAD_DIM + 8u * vu;
    if ((p.tailFlags & 1u) != 0u) {
      const uint gi = p.gateOffset + row * HEAD_DIM + 8u * vu;
      y0 *= 1.0 / (1.0 + exp(-vec4(gate[gi], gate[gi + 1u], gate[gi + 2u], gate[gi + 3u])));
      y1 *= 1.0 / (1.0 + exp(-vec4(gate[gi + 4u], gate[gi + 5u], gate[gi + 6u], gate[gi + 7u])));
    }
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
      o[oi + k] = y0[k];
      o[oi + 4u + k] = y1[k];
    }
    tailRows[vr * HD4 + 2u * vu] = y0;
    tailRows[vr * HD4 + 2u * vu + 1u] = y1;
  }
  if ((p.tailFlags & 2u) == 0u) return;  // uniform
  barrier();
  // one thread a group of 16 (4 vec4s), quantize_act's rule, as dec_attention_combine
  for (uint q = tid; q < ROWS * (HEAD_DIM / 16u); q += WG) {
    const uint r = q / (HEAD_DIM / 16u), gq = q % (HEAD_DIM / 16u);
    float v[16];
    [[unroll]] for (uint j = 0u; j < 16u; j++) v[j] = tailRows[r * HD4 + 4u * gq + j / 4u][j % 4u];
    uvec4 words;
    float scale;
    int qsum;
    quantizeGroup16(v, words, scale, qsum);
    const uint at = (t * p.heads + kh * ROWS + r) * (HEAD_DIM / 16u) + gq;
    xq[at] = words;
    xscale[at] = scale;
    xsum[at] = qsum;
  }
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
  // uniform: no chunk here (so none with a new row); with COMBINE_TAIL it still arrives
  const bool idle = gl_WorkGroupID.x * CHUNK >= seen;
  if (ROPE_FOLD && idle && !COMBINE_TAIL) return;
  if (ROPE_FOLD && !idle) {
    newStart = contextN() - 1u;
    foldRope(kh, t);
  }

  for (uint c = gl_WorkGroupID.x; c < p.numChunks && !idle; c += gl_NumWorkGroups.x) {
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
          [[unroll]] for (uint i = 0u; i < PER_LANE; i++) w[i] = keyAt(row + i * LANES, start + j, lane + i * LANES);
          [[unroll]] for (uint i = 0u; i < PER_LANE; i++) {
            const uint d = 2u * (i * LANES + lane);
            const vec4 lo = lo4(w[i]), hi = hi4(w[i]);
            [[unroll]] for (uint r = 0u; r < ROWS; r++) acc[r] += dot(qAt(q0, r * HD4 + d), lo) + dot(qAt(q0, r * HD4 + d + 1u), hi);
          }
        } else {
          for (uint i = 0u; i < PER_LANE; i++) {
            const uvec4 w = keyAt(row + i * LANES, start + j, lane + i * LANES);
            const uint d = 2u * (i * LANES + lane);
            const vec4 lo = lo4(w), hi = hi4(w);
            [[unroll]] for (uint r = 0u; r < ROWS; r++) acc[r] += dot(qAt(q0, r * HD4 + d), lo) + dot(qAt(q0, r * HD4 + d + 1u), hi);
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
      [[unroll]] for (uint j = 0u; j < PREFETCH; j++) vv[j] = j < len ? valueAt(vrow + j * vstep, start + j, vu) : uvec4(0u);
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
            const uvec4 w = j < PREFETCH ? vv[j] : valueAt(vrow + j * vstep, start + j, vu);
            l += e;
            a0 += e * lo4(w);
            a1 += e * hi4(w);
          }
        }
      } else {
        for (uint j = 0u; j < len; j++) m = max(m, score(vr, j));
        for (uint j = 0u; j < len; j++) {
          const float e = exp(score(vr, j) - m);
          const uvec4 w = valueAt(vrow + j * vstep, start + j, vu);
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
  if (COMBINE_TAIL) combineTail(kh, t, seen);
}
