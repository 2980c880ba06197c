#version 450
// dec_attention_prefill: pass 1 of dec_attention for prompt chunks of one sequence (S > 4 tokens,
// not batched), flash-attention style.  dec_attention's general pass 1 serves at most 16 query rows
// a workgroup (about 2 tokens at GQA 8), so every K and V row of a span is read again for every 2
// tokens of the chunk, and its inner loops are scalar over shared memory.  Here one workgroup per
// (span c, KV head kh, block z of tokensPerGroup tokens) serves all R = tokensPerGroup x G query
// rows (r = tl * G + g: token t0 + tl, head kh * G + g; up to ROWS, 32..64 on GPUs) at once: it
// walks its span's positions in tiles of TILE keys, each K tile and then V tile loaded from the
// cache once (f16, unpackHalf2x16) into shared memory for all the rows, and per tile
//   scores: S = Q K^T for ROWS x TILE, each thread a register tile of RA rows x KA keys (rows
//           tr + TR a, keys tk + TK b: strided, so a warp's loads spread over the banks), scaled and
//           causally masked, each thread's max over its keys into shared memory;
//   softmax: each thread takes its rows' tile max over the TK threads of the row, the new running
//           max m, p = exp(s - m) into shared memory, its own share of l rescaled by
//           alpha = exp(m_old - m) (the row's TK threads compute the same m and alpha: no second
//           reduction; l's shares meet once, at the end);
//   values: O = alpha O + P V, each thread a register tile of RC rows x QC quads of dims.
// Four barriers a tile.  The span, the causal rule and the records are dec_attention's, so
// dec_attention_combine runs unchanged after it: a span is CHUNK * iters positions; token t sees
// positions 0 .. n + t - 1 (n = p.n, plus positions[posIndex] with flags bit 0, capped at
// limit - (S - 1)); per (token, head, span) the record [HEAD_DIM floats: sum_j exp(s_j - m) v_j]
// [m][l = sum_j exp(s_j - m)][2 pad], with m = -3.0e38, l = 0 and zero sums for a token of the
// block that sees no position of the span (as dec_attention writes it; the combine never reads
// those), and no record at all from a workgroup whose block sees none of the span.  Flags bit 1
// (batched) is not served: the host runs batched calls through dec_attention.
//
// K and V: [ctx][kvHeads][HEAD_DIM] halves, read as uvec4 (8 halves) at kOffset / vOffset.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 1) const uint HEAD_DIM = 128u;   // 32, 64, 128 or 256
layout(constant_id = 2) const uint CHUNK = 32u;       // positions per chunk (a span is CHUNK * iters)
layout(constant_id = 3) const uint ROWS = 32u;        // query rows a workgroup, >= G * tokensPerGroup
layout(constant_id = 4) const uint TILE = 32u;        // keys per tile
layout(constant_id = 5) const bool HALF_TILES = false; // K/V tiles kept as halves in shared memory (half the space, unpacked at each use)
layout(constant_id = 6) const uint RA = 4u;           // score tile: rows per thread
layout(constant_id = 7) const uint KA = 2u;           // score tile: keys per thread
layout(constant_id = 8) const uint RC = 4u;           // value tile: rows per thread
layout(constant_id = 9) const uint QC = 2u;           // value tile: quads of dims per thread
// the host keeps (ROWS / RA) * (TILE / KA) == WG == (ROWS / RC) * (HEAD_DIM / 4 / QC)

const uint WG = gl_WorkGroupSize.x;
const uint HD4 = HEAD_DIM / 4u;
const uint HD8 = HEAD_DIM / 8u;
const uint REC4 = HD4 + 1u;   // a record in vec4s: HD4 weighted-value sums, then (m, l, pad, pad)
const uint TK = TILE / KA;    // score threads per row
const uint TR = ROWS / RA;    // score thread rows
const uint TD = HD4 / QC;     // value threads per row
const uint TRC = ROWS / RC;   // value thread rows
// row strides padded by one element, so the threads reading other rows at one column hit other banks
const uint QS = HD4 + 1u;     // vec4
const uint KS = HD4 + 1u;     // quads
const uint PS = TILE + 1u;    // floats

layout(set = 0, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };
layout(set = 0, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(set = 0, binding = 3) writeonly buffer P { vec4 part4[]; };
layout(set = 0, binding = 4) readonly buffer Pos { uint positions[]; };  // any buffer when flags bit 0 is clear

layout(push_constant) uniform Params {
  uint n;              // positions seen by token 0 (token t sees n + t)
  uint S;              // query tokens
  uint heads;
  uint kvHeads;
  uint kOffset;        // this layer's keys, in uvec4 (8 halves)
  uint vOffset;        // this layer's values, in uints (2 halves; a multiple of 4)
  uint qOffset;        // q, in vec4 (4 floats)
  uint numChunks;      // partial records per (token, head): the grid's x
  uint tokensPerGroup; // tokens per workgroup (z splits S)
  float scale;         // 1 / sqrt(HEAD_DIM)
  uint posIndex;       // the word of positions[] added to n (flags bit 0)
  uint flags;          // bit 0: n += positions[posIndex]
  uint limit;          // positions the last token may see at most (>= n + S - 1): n is capped at limit - (S - 1)
  uint iters;          // chunks per span (>= 1)
} p;

uint contextN() {
  const uint extra = (p.flags & 1u) != 0u ? positions[p.posIndex] : 0u;
  return p.n + min(extra, p.limit - (p.S - 1u) - p.n);
}

shared vec4 qs[ROWS * QS];
// the K tile, then (once the scores are taken) the V tile: floats, or halves with HALF_TILES
shared vec4 kvf[HALF_TILES ? 1u : TILE * KS];
shared uvec2 kvh[HALF_TILES ? TILE * KS : 1u];
shared float ps[ROWS * PS];     // the tile's p = exp(s - m)
shared float red[ROWS * TK];    // each score thread's max over its keys (at the end: its share of l)
shared float rowAlpha[ROWS];    // the tile's rescale factor exp(m_old - m_new) of each row

// a cache row's 8 halves (uvec4 e of tile key j) into the tile
void storeTile(uint j, uint e, uvec4 w) {
  if (HALF_TILES) {
    kvh[j * KS + 2u * e] = w.xy;
    kvh[j * KS + 2u * e + 1u] = w.zw;
  } else {
    kvf[j * KS + 2u * e] = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
    kvf[j * KS + 2u * e + 1u] = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
  }
}

// dims 4 d .. 4 d + 3 of tile key j
vec4 tileQuad(uint j, uint d) {
  if (HALF_TILES) {
    const uvec2 w = kvh[j * KS + d];
    return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
  }
  return kvf[j * KS + d];
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint c = gl_WorkGroupID.x, kh = gl_WorkGroupID.y;
  const uint G = p.heads / p.kvHeads;
  const uint t0 = gl_WorkGroupID.z * p.tokensPerGroup;
  const uint T = min(p.tokensPerGroup, p.S - t0);
  const uint R = G * T;
  const uint n = contextN();
  const uint spanStart = c * CHUNK * p.iters;
  // positions of this span seen by the block's last token; none: a surplus workgroup
  const uint seen = n + t0 + T - 1u;
  if (spanStart >= seen) return;
  const uint end = spanStart + min(CHUNK * p.iters, seen - spanStart);

  for (uint i = tid; i < ROWS * HD4; i += WG) {
    const uint r = i / HD4, d = i % HD4;
    vec4 q = vec4(0.0);
    if (r < R) q = q4[p.qOffset + ((t0 + r / G) * p.heads + kh * G + r % G) * HD4 + d];
    qs[r * QS + d] = q;
  }

  const uint tk = tid % TK, tr = tid / TK;   // scores and softmax: keys tk + TK b, rows tr + TR a
  const uint td = tid % TD, trc = tid / TD;  // values: quads td + TD b, rows trc + TRC a
  // per score row: the positions below lim are visible (0 for rows past R: all masked)
  uint lim[RA];
  float m[RA], lShare[RA];
  [[unroll]] for (uint a = 0u; a < RA; a++) {
    const uint r = tr + TR * a;
    lim[a] = r < R ? min(end, n + t0 + r / G) : 0u;
    m[a] = -3.0e38;
    lShare[a] = 0.0;
  }
  vec4 acc[RC][QC];
  [[unroll]] for (uint a = 0u; a < RC; a++) {
    [[unroll]] for (uint b = 0u; b < QC; b++) acc[a][b] = vec4(0.0);
  }

  for (uint start = spanStart; start < end; start += TILE) {
    const uint len = min(TILE, end - start);  // uniform
    // K tile (keys past the span's end zero: no read past the cache)
    for (uint i = tid; i < TILE * HD8; i += WG) {
      const uint j = i / HD8, e = i % HD8;
      uvec4 w = uvec4(0u);
      if (j < len) w = k8[p.kOffset + ((start + j) * p.kvHeads + kh) * HD8 + e];
      storeTile(j, e, w);
    }
    barrier();

    float s[RA][KA];
    [[unroll]] for (uint a = 0u; a < RA; a++) {
      [[unroll]] for (uint b = 0u; b < KA; b++) s[a][b] = 0.0;
    }
    for (uint d = 0u; d < HD4; d++) {
      vec4 k[KA];
      [[unroll]] for (uint b = 0u; b < KA; b++) k[b] = tileQuad(tk + TK * b, d);
      [[unroll]] for (uint a = 0u; a < RA; a++) {
        const vec4 q = qs[(tr + TR * a) * QS + d];
        [[unroll]] for (uint b = 0u; b < KA; b++) s[a][b] += dot(q, k[b]);
      }
    }
    [[unroll]] for (uint a = 0u; a < RA; a++) {
      float most = -3.0e38;
      [[unroll]] for (uint b = 0u; b < KA; b++) {
        s[a][b] *= p.scale;
        if (start + tk + TK * b < lim[a]) most = max(most, s[a][b]);
      }
      red[(tr + TR * a) * TK + tk] = most;
    }
    barrier();

    // V tile into the K tile's place (its scores are taken)
    for (uint i = tid; i < TILE * HD8; i += WG) {
      const uint j = i / HD8, e = i % HD8;
      uvec4 w = uvec4(0u);
      if (j < len) w = v8[p.vOffset / 4u + ((start + j) * p.kvHeads + kh) * HD8 + e];
      storeTile(j, e, w);
    }
    [[unroll]] for (uint a = 0u; a < RA; a++) {
      const uint r = tr + TR * a;
      float mNew = m[a];
      for (uint k = 0u; k < TK; k++) mNew = max(mNew, red[r * TK + k]);
      const float alpha = exp(m[a] - mNew);
      m[a] = mNew;
      float sum = 0.0;
      [[unroll]] for (uint b = 0u; b < KA; b++) {
        const float e = start + tk + TK * b < lim[a] ? exp(s[a][b] - mNew) : 0.0;
        ps[r * PS + tk + TK * b] = e;
        sum += e;
      }
      lShare[a] = lShare[a] * alpha + sum;
      if (tk == 0u) rowAlpha[r] = alpha;
    }
    barrier();

    [[unroll]] for (uint a = 0u; a < RC; a++) {
      const float alpha = rowAlpha[trc + TRC * a];
      [[unroll]] for (uint b = 0u; b < QC; b++) acc[a][b] *= alpha;
    }
    for (uint j = 0u; j < len; j++) {
      vec4 v[QC];
      [[unroll]] for (uint b = 0u; b < QC; b++) v[b] = tileQuad(j, td + TD * b);
      [[unroll]] for (uint a = 0u; a < RC; a++) {
        const float pj = ps[(trc + TRC * a) * PS + j];
        [[unroll]] for (uint b = 0u; b < QC; b++) acc[a][b] += pj * v[b];
      }
    }
    barrier();  // the tiles, red and rowAlpha are rewritten by the next tile
  }

  // l: the shares of each row's TK score threads, summed by its first
  [[unroll]] for (uint a = 0u; a < RA; a++) red[(tr + TR * a) * TK + tk] = lShare[a];
  barrier();
  [[unroll]] for (uint a = 0u; a < RA; a++) {
    const uint r = tr + TR * a;
    if (tk == 0u && r < R) {
      float l = 0.0;
      for (uint k = 0u; k < TK; k++) l += red[r * TK + k];
      const uint rec4 = (((t0 + r / G) * p.heads + kh * G + r % G) * p.numChunks + c) * REC4;
      part4[rec4 + HD4] = vec4(m[a], l, 0.0, 0.0);
    }
  }
  [[unroll]] for (uint a = 0u; a < RC; a++) {
    const uint r = trc + TRC * a;
    if (r < R) {
      const uint rec4 = (((t0 + r / G) * p.heads + kh * G + r % G) * p.numChunks + c) * REC4;
      [[unroll]] for (uint b = 0u; b < QC; b++) part4[rec4 + td + TD * b] = acc[a][b];
    }
  }
}
