// dec_attention_cm.glsl: attention of a long prompt chunk of one sequence on the matrix cores
// (dec_attention_cm; CM_EMULATE: dec_attention_cm_emu, plain sums over the same tiles for tests).
// The flash-attention kernels before it (dec_attention_prefill) form every score and value product
// with scalar f32 FMAs, and split a chunk longer than 64 tokens into calls one after another.
// Here one dispatch serves the whole chunk: a workgroup per (block of BR query rows, KV head), the
// rows r = tl * G + g (token t0 + tl, query head kh * G + g: every K/V row read once for the G query
// heads that share it), walking keys 0 .. (its last token's) in tiles of BC, with
//   S = (scale Q) K^T and O += P V as 16 x 8 x 16 f16 -> f32 matrix products (q rounded to f16 as
//   llama.cpp's flash attention rounds it; the cache is f16 already; P in [0, 1] rounded to f16).
// O stays in the matrix accumulators for the whole walk: they cannot be scaled row by row (the
// online softmax's rescale), so the walk runs twice: pass 1 forms only the scores, for each row's
// max m and sum l (TPR threads a row, every thread of the workgroup, their parts joined by
// subgroup shuffles; the running sum rescaled as the max grows), and pass 2 forms them again with
// P = exp(S - m) and the values: half again as many matrix products, and
// the values' sums are never rescaled. At the end out = O / l, times sigmoid(gate) with flags
// bit 1 (Qwen3.5's output gate, as dec_attention_combine's), written [S][heads][HEAD_DIM] f32.
//
// Token t (0-based in the call) sees positions 0 .. n + t - 1, n = p.n + positions[posIndex] with
// flags bit 0, capped at limit - (S - 1) as dec_attention's.
//
// Subgroups (4 of 32): row block rb = sg % RB (rows 16 rb ..), column part cp = sg / RB of CP = 4 /
// RB: the scores' keys cp * BC / CP .. and the values' dims cp * HEAD_DIM / CP .. of that block.
// Shared memory (uvec4s, as the GEMM tiles: cooperative loads need 16-byte aligned starts): Q (f16,
// BR rows of HEAD_DIM + 8), the K tile, then in its place the V tile (f16, BC rows), S (f32, BR rows
// of BC + 4; pass 2 writes P as f16 over the start of each row, after a subgroup barrier by which
// the row's threads have read its scores); the O tile (f32, BR rows of HEAD_DIM + 4) reuses that space after the walk.
#include "cm_extensions.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint HEAD_DIM = 128u;  // 32, 64, 128 or 256
layout(constant_id = 1) const uint BR = 64u;         // query rows a workgroup: 16, 32 or 64, a multiple of G
layout(constant_id = 2) const uint BC = 32u;         // keys a tile: 32 (16 where BR is 32 or 64)

const uint WG = 128u;
const uint HD4 = HEAD_DIM / 4u;
const uint HD8 = HEAD_DIM / 8u;
const uint RB = BR / 16u;          // row blocks
const uint CP = 4u / RB;           // column parts a row block
const uint SJ = BC / CP / 8u;      // score accumulators a subgroup (1..4)
const uint OJ = HEAD_DIM / CP / 8u; // value accumulators a subgroup (1..16)
const uint TPR = WG / BR;          // softmax threads a row: 2, 4 or 8, lanes of one subgroup
const uint CPT = BC / TPR;         // the columns of a tile each takes (an even count)
const uint LDQ = HEAD_DIM + 8u;    // f16 stride of Q, K and V rows (a 16-byte multiple that staggers the banks)
const uint LDS = BC + 4u;          // f32 stride of S rows (P: 2 LDS halves)
const uint LDO = HEAD_DIM + 4u;    // f32 stride of O rows
const uint Q_V = BR * LDQ / 8u;    // uvec4s of Q
const uint KV_V = BC * LDQ / 8u;   // uvec4s of one K or V tile
const uint S_V = BR * LDS / 4u;    // uvec4s of S
const uint K_BASE = Q_V;
// V over K: each tile's V is stored after the barrier that ends its scores' reads of K
const uint V_BASE = K_BASE;
const uint S_BASE = Q_V + KV_V;
const uint O_V = BR * LDO / 4u;
const uint SPACE = S_BASE + S_V > O_V ? S_BASE + S_V : O_V;
shared uvec4 tiles[SPACE];
shared float rowScale[BR];         // each row's 1 / l, for the threads that write it out
#define WORD(i) tiles[(i) >> 2u][(i) & 3u]
#define SF(r, c) uintBitsToFloat(WORD(4u * S_BASE + (r) * LDS + (c)))
#define OF(r, d) uintBitsToFloat(WORD((r) * LDO + (d)))
// the tile loads a thread issues (BC keys x HD8 uvec4s over the workgroup)
const uint KV_LOADS = (BC * HD8 + WG - 1u) / WG;

layout(set = 0, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };
layout(set = 0, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(set = 0, binding = 3) writeonly buffer Out { vec4 out4[]; };
layout(set = 0, binding = 4) readonly buffer Pos { uint positions[]; };  // any buffer when flags bit 0 is clear
layout(set = 0, binding = 5) readonly buffer Gate { vec4 gate4[]; };     // any buffer when flags bit 1 is clear

layout(push_constant) uniform Params {
  uint n;           // positions seen by token 0 (token t sees n + t)
  uint S;           // query tokens
  uint heads;
  uint kvHeads;
  uint kOffset;     // this layer's keys, in uvec4 (8 halves)
  uint vOffset;     // its values, in uvec4
  uint qOffset;     // vec4s
  uint outOffset;   // vec4s
  uint gateOffset;  // vec4s (flags bit 1)
  float scale;      // 1 / sqrt(HEAD_DIM)
  uint posIndex;    // the word of positions[] added to n (flags bit 0)
  uint flags;       // bit 0: n += positions[posIndex]; bit 1: out *= sigmoid(gate)
  uint limit;       // positions the last token may see at most (>= n + S - 1)
} p;

uint contextN() {
  const uint extra = (p.flags & 1u) != 0u ? positions[p.posIndex] : 0u;
  return p.n + min(extra, p.limit - (p.S - 1u) - p.n);
}

uvec4 kvNext[KV_LOADS];

// key tile [start, start + BC) of cache `which` (0 keys, 1 values) into registers, zeros from `end` on
void loadTile(uint which, uint start, uint end, uint kh) {
  const uint t = gl_LocalInvocationIndex;
  [[unroll]] for (uint i = 0u; i < KV_LOADS; i++) {
    const uint e = t + WG * i, j = e / HD8, c = e % HD8;
    uvec4 w = uvec4(0u);
    if (e < BC * HD8 && start + j < end) {
      const uint at = ((start + j) * p.kvHeads + kh) * HD8 + c;
      w = which == 0u ? k8[p.kOffset + at] : v8[p.vOffset + at];
    }
    kvNext[i] = w;
  }
}

void storeTile(uint base) {
  const uint t = gl_LocalInvocationIndex;
  [[unroll]] for (uint i = 0u; i < KV_LOADS; i++) {
    const uint e = t + WG * i;
    if (e < BC * HD8) tiles[base + (e / HD8) * (LDQ / 8u) + e % HD8] = kvNext[i];
  }
}

#ifdef CM_EMULATE
// Test hook: the same tiles with plain f32 sums of their f16 values; thread t owns O elements
// t + WG e of [row][dim].
const uint O_PER_THREAD = BR * HEAD_DIM / WG;
float emuO[O_PER_THREAD];

vec2 half2At(uint base, uint row, uint ld, uint k) { return unpackHalf2x16(WORD(4u * base + (row * ld + k) / 2u)); }

void scores() {
  const uint t = gl_LocalInvocationIndex;
  for (uint e = t; e < BR * BC; e += WG) {
    const uint r = e / BC, c = e % BC;
    float s = 0.0;
    for (uint k = 0u; k < HEAD_DIM; k += 2u) {
      const vec2 q = half2At(0u, r, LDQ, k), kk = half2At(K_BASE, c, LDQ, k);
      s += q.x * kk.x + q.y * kk.y;
    }
    WORD(4u * S_BASE + r * LDS + c) = floatBitsToUint(s);
  }
}

void clearValues() {
  for (uint e = 0u; e < O_PER_THREAD; e++) emuO[e] = 0.0;
}

void values() {
  const uint t = gl_LocalInvocationIndex;
  for (uint e = 0u; e < O_PER_THREAD; e++) {
    const uint idx = t + WG * e, r = idx / HEAD_DIM, d = idx % HEAD_DIM;
    float acc = 0.0;
    for (uint c = 0u; c < BC; c += 2u) {
      const vec2 pr = unpackHalf2x16(WORD(4u * S_BASE + r * LDS + c / 2u));  // P: halves over row r's start
      const float v0 = unpackHalf2x16(WORD(4u * V_BASE + (c * LDQ + d) / 2u))[d & 1u];
      const float v1 = unpackHalf2x16(WORD(4u * V_BASE + ((c + 1u) * LDQ + d) / 2u))[d & 1u];
      acc += pr.x * v0 + pr.y * v1;
    }
    emuO[e] += acc;
  }
}

void storeValues() {
  const uint t = gl_LocalInvocationIndex;
  for (uint e = 0u; e < O_PER_THREAD; e++) {
    const uint idx = t + WG * e;
    WORD((idx / HEAD_DIM) * LDO + idx % HEAD_DIM) = floatBitsToUint(emuO[e]);
  }
}
#else
// A and B distinct types (16 x 16 and 16 x 8), as gemm_coopmat_tile.glsl's
#define CM_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>  // M x K
#define CM_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>   // K x N
#define CM_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>   // M x N

void scores() {
  const uint sg = gl_SubgroupID, r0 = (sg % RB) * 16u, c0 = (sg / RB) * (BC / CP);
  CM_C s0 = CM_C(0.0), s1 = CM_C(0.0), s2 = CM_C(0.0), s3 = CM_C(0.0);
  [[unroll]] for (uint k = 0u; k < HEAD_DIM; k += 16u) {
    CM_A a;
    coopMatLoadNV(a, tiles, (r0 * LDQ + k) / 8u, LDQ / 8u, false);
#define SCORE_J(j, s) if (SJ > j) { CM_B b; coopMatLoadNV(b, tiles, K_BASE + ((c0 + 8u * j) * LDQ + k) / 8u, LDQ / 8u, true); s = coopMatMulAddNV(a, b, s); }
    SCORE_J(0u, s0) SCORE_J(1u, s1) SCORE_J(2u, s2) SCORE_J(3u, s3)
  }
#define STORE_S(j, s) if (SJ > j) coopMatStoreNV(s, tiles, S_BASE + (r0 * LDS + c0 + 8u * j) / 4u, LDS / 4u, false);
  STORE_S(0u, s0) STORE_S(1u, s1) STORE_S(2u, s2) STORE_S(3u, s3)
}

// the value accumulators, named (an array indexed in a loop may be kept in memory)
CM_C o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15;

void clearValues() {
  o0 = CM_C(0.0); o1 = CM_C(0.0); o2 = CM_C(0.0); o3 = CM_C(0.0); o4 = CM_C(0.0); o5 = CM_C(0.0); o6 = CM_C(0.0); o7 = CM_C(0.0);
  o8 = CM_C(0.0); o9 = CM_C(0.0); o10 = CM_C(0.0); o11 = CM_C(0.0); o12 = CM_C(0.0); o13 = CM_C(0.0); o14 = CM_C(0.0); o15 = CM_C(0.0);
}

void values() {
  const uint sg = gl_SubgroupID, r0 = (sg % RB) * 16u, d0 = (sg / RB) * (HEAD_DIM / CP);
  [[unroll]] for (uint k = 0u; k < BC; k += 16u) {
    CM_A a;  // P rows r0.. (halves over S's rows: stride 2 LDS halves), keys k..
    coopMatLoadNV(a, tiles, S_BASE + (r0 * 2u * LDS + k) / 8u, LDS / 4u, false);
#define VALUE_J(j, o) if (OJ > j) { CM_B b; coopMatLoadNV(b, tiles, V_BASE + (k * LDQ + d0 + 8u * j) / 8u, LDQ / 8u, false); o = coopMatMulAddNV(a, b, o); }
    VALUE_J(0u, o0) VALUE_J(1u, o1) VALUE_J(2u, o2) VALUE_J(3u, o3) VALUE_J(4u, o4) VALUE_J(5u, o5) VALUE_J(6u, o6) VALUE_J(7u, o7)
    VALUE_J(8u, o8) VALUE_J(9u, o9) VALUE_J(10u, o10) VALUE_J(11u, o11) VALUE_J(12u, o12) VALUE_J(13u, o13) VALUE_J(14u, o14) VALUE_J(15u, o15)
  }
}

void storeValues() {
  const uint sg = gl_SubgroupID, r0 = (sg % RB) * 16u, d0 = (sg / RB) * (HEAD_DIM / CP);
#define STORE_O(j, o) if (OJ > j) coopMatStoreNV(o, tiles, (r0 * LDO + d0 + 8u * j) / 4u, LDO / 4u, false);
  STORE_O(0u, o0) STORE_O(1u, o1) STORE_O(2u, o2) STORE_O(3u, o3) STORE_O(4u, o4) STORE_O(5u, o5) STORE_O(6u, o6) STORE_O(7u, o7)
  STORE_O(8u, o8) STORE_O(9u, o9) STORE_O(10u, o10) STORE_O(11u, o11) STORE_O(12u, o12) STORE_O(13u, o13) STORE_O(14u, o14) STORE_O(15u, o15)
}
#endif

void main() {
  const uint t = gl_LocalInvocationIndex;
  const uint kh = gl_WorkGroupID.y;
  const uint G = p.heads / p.kvHeads;
  const uint TB = BR / G;                        // tokens a workgroup
  const uint t0 = gl_WorkGroupID.x * TB;
  const uint T = min(TB, p.S - t0);
  const uint R = G * T;
  const uint n = contextN();
  const uint end = n + t0 + T - 1u;              // keys the block's last token sees

  // Q (scaled) as f16 pairs; rows past R zero
  for (uint i = t; i < BR * HD4; i += WG) {
    const uint r = i / HD4, d = i % HD4;
    vec4 q = vec4(0.0);
    if (r < R) q = q4[p.qOffset + ((t0 + r / G) * p.heads + kh * G + r % G) * HD4 + d] * p.scale;
    WORD((r * LDQ + 4u * d) / 2u) = packHalf2x16(q.xy);
    WORD((r * LDQ + 4u * d) / 2u + 1u) = packHalf2x16(q.zw);
  }
  // the softmax threads of row `row`: part `part` takes columns c0 .. c0 + CPT of each tile. Rows and
  // parts come from the subgroup numbering, so a row's TPR threads are lanes of one subgroup.
  const uint g = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
  const uint row = g / TPR, part = g % TPR, c0 = part * CPT;
  // keys below lim are visible (0 past R: all masked)
  const uint lim = row < R ? n + t0 + row / G : 0u;
  float m = -3.0e38, l = 0.0;

  // pass 1: each row's max and sum of exp
  loadTile(0u, 0u, end, kh);
  for (uint start = 0u; start < end; start += BC) {
    storeTile(K_BASE);
    barrier();                                   // Q and K stored; S free (read before the last barrier)
    if (start + BC < end) loadTile(0u, start + BC, end, kh);
    scores();
    barrier();
    float most = m;
    [[unroll]] for (uint j = 0u; j < CPT; j++) if (start + c0 + j < lim) most = max(most, SF(row, c0 + j));
    [[unroll]] for (uint o = 1u; o < TPR; o <<= 1u) most = max(most, subgroupShuffleXor(most, o));
    float sum = 0.0;
    [[unroll]] for (uint j = 0u; j < CPT; j++) if (start + c0 + j < lim) sum += exp(SF(row, c0 + j) - most);
    [[unroll]] for (uint o = 1u; o < TPR; o <<= 1u) sum += subgroupShuffleXor(sum, o);
    l = l * exp(m - most) + sum;
    m = most;
    barrier();                                   // K and S are rewritten by the next tile
  }

  // pass 2: P = exp(S - m) and O += P V
  clearValues();
  loadTile(0u, 0u, end, kh);
  for (uint start = 0u; start < end; start += BC) {
    storeTile(K_BASE);
    barrier();
    loadTile(1u, start, end, kh);
    scores();
    barrier();
    storeTile(V_BASE);
    float e[CPT];
    [[unroll]] for (uint j = 0u; j < CPT; j++) e[j] = start + c0 + j < lim ? exp(SF(row, c0 + j) - m) : 0.0;
    // P as f16 pairs over the start of the row's S: every thread of the row has read its scores first
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint j = 0u; j < CPT; j += 2u) WORD(4u * S_BASE + row * LDS + (c0 + j) / 2u) = packHalf2x16(vec2(e[j], e[j + 1u]));
    if (start + BC < end) loadTile(0u, start + BC, end, kh);
    barrier();
    values();
    barrier();                                   // K, V and P are rewritten by the next tile
  }

  // O / l (and the gate) into out; the O tile over Q and the tiles
  storeValues();
  if (part == 0u) rowScale[row] = l > 0.0 ? 1.0 / l : 0.0;
  barrier();
  const bool gated = (p.flags & 2u) != 0u;
  for (uint i = t; i < R * HD4; i += WG) {
    const uint r = i / HD4, d = i % HD4;
    const uint row = (t0 + r / G) * p.heads + kh * G + r % G;
    vec4 o = vec4(OF(r, 4u * d), OF(r, 4u * d + 1u), OF(r, 4u * d + 2u), OF(r, 4u * d + 3u)) * rowScale[r];
    if (gated) o *= 1.0 / (1.0 + exp(-gate4[p.gateOffset + row * HD4 + d]));
    out4[p.outOffset + row * HD4 + d] = o;
  }
}
