#version 450
// dec_rope_kv: rotate-half RoPE of q [S][heads][headDim] and k [S][kvHeads][headDim] in place,
// as src/model/ops.ts applyRope (angle = f32(pos * inv[i]), cos and sin of it rounded to f32,
// x1' = x1 c - x2 s, x2' = x2 c + x1 s), and k (rotated) and v written to an f16 KV cache
// [ctx][kvHeads][headDim] (halves packed two per uint, round to nearest even) at the token's
// position. Token t's position: pos0 + t, plus positions[posIndex] when flags bit 0 is set (a
// recorded graph replays with the position in a buffer). Cache rows at positions >= ctx are not
// written. Batched (flags bit 3: tokens of different sequences, one decode step of each): token
// t's position is positions[posIndex + t] and its cache row positions[posIndex + BATCH_WORDS + t]
// (its sequence's first row + the position: the sequences share one cache of ctx rows). Workgroup (x, y) = (head slot, token): slots 0..heads-1 are q heads, heads.. the kv heads
// (k rotated, k and v cached). Each invocation owns 4 elements of a head: 2j, 2j+1 and
// 2j+half, 2j+1+half (j < headDim/4), so its cache writes are whole uints.
//
// cos/sin: the driver's are not accurate outside [-pi, pi] (Vulkan leaves their error there
// undefined), and angles reach ~1e5 rad. The angle (an f32, < 2^24) is reduced exactly in integer
// arithmetic (Payne-Hanek: its 24-bit mantissa times 128 bits of 2/pi), the remainder taken as a
// float-float, and sin/cos evaluated by minimax polynomials on [-pi/4, pi/4]: within 2 ulp of
// the correctly rounded values (test/decoder-kernels.test.ts measures it). That arithmetic (and the
// head norm's, the rotation's and the f16 rounding) lives in rope.glsl, shared with dec_attention_decode.
//
// Head norm (flags bit 2, Qwen3's q_norm / k_norm): each q head and each k head (never v) is first
// RMS-normalised over its headDim elements, y = x / sqrt(mean(x^2) + eps) * w, w = the headDim
// floats at qNormOffset (q heads) or kNormOffset (k heads) of binding 7, as src/model/ops.ts
// rmsNorm and dec_rmsnorm: the normalised value x * inv is rounded to f32 before w multiplies it
// (precise: no contraction), inv = 1 / sqrt(sum / headDim + eps). The f32 sum of squares:
// each invocation adds the squares of its elements (each square rounded), in the order
// 2j, 2j+1, 2j+half, 2j+1+half, j = its index, then + WG, ...; then across the workgroup as
// dec_rmsnorm: with USE_SUBGROUP subgroupAdd, then a shared-memory tree over the subgroups'
// sums; without, a shared-memory tree over the invocations' sums (partial[i] += partial[i + s],
// s halving from the power of two below the count). The normalised values stay in registers;
// k's normalised-then-rotated values are what the cache gets. Without the bit nothing is read
// from binding 7 (any buffer may be bound).
//
// Partial rotary (rotaryDim < headDim, Qwen3.5's full-attention layers): only the first rotaryDim
// dims of each head rotate, pairing i with i + rotaryDim/2 (inverse frequencies rotaryDim/2 of
// them); the dims from rotaryDim on pass through (normalised and cached all the same). The groups
// of 4 elements: j < rotaryDim/4 as above with half = rotaryDim/2, then the passed-through dims 4
// at a time. rotaryDim = headDim (or 0) is the full rotation, unchanged.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 2) const bool USE_SUBGROUP = true;

layout(set = 0, binding = 0) buffer Q { float q[]; };
layout(set = 0, binding = 1) buffer K { float k[]; };
layout(set = 0, binding = 2) readonly buffer V { float v[]; };
layout(set = 0, binding = 3) readonly buffer Inv { float invFreq[]; };
layout(set = 0, binding = 4) writeonly buffer KC { uint kCache[]; };
layout(set = 0, binding = 5) writeonly buffer VC { uint vCache[]; };
layout(set = 0, binding = 6) readonly buffer Pos { uint positions[]; };
const uint BATCH_WORDS = 64u;  // batched: the cache rows follow the S positions at this distance
layout(set = 0, binding = 7) readonly buffer Norm { float normW[]; };

layout(push_constant) uniform Params {
    uint S;
    uint heads;
    uint kvHeads;
    uint headDim;
    uint pos0;
    uint posIndex;      // word of positions[] added to pos0 when flags bit 0
    uint flags;         // bit 0: positions[posIndex] + pos0 + t; bit 1: write the cache; bit 2: head norm; bit 3: batched
    uint ctx;           // cache rows
    uint qOffset;       // floats
    uint kOffset;       // floats
    uint vOffset;       // floats
    uint kCacheOffset;  // uints (halves / 2): the layer's base in kCache
    uint vCacheOffset;  // uints
    uint invOffset;     // floats
    uint qNormOffset;   // floats in normW (bit 2)
    uint kNormOffset;   // floats in normW (bit 2)
    float eps;          // (bit 2)
    uint rotaryDim;     // dims of each head that rotate (multiple of 4, <= headDim); 0: headDim
} pc;

const uint WG = gl_WorkGroupSize.x;
shared float partial[WG];

// Smallest power of two >= n (n >= 1).
uint ceilPow2(uint n) { return n <= 1u ? 1u : 1u << uint(findMSB(n - 1u) + 1); }

// Sum of v over the workgroup (called in uniform control flow); `count`: invocations
// 0..count-1 may hold nonzero v (the shared-memory tree only spans them).
float workgroupSum(float v, uint count) {
    const uint li = gl_LocalInvocationIndex;
    if (USE_SUBGROUP) {
        v = subgroupAdd(v);
        const uint nsg = gl_NumSubgroups;
        if (nsg == 1u) return v;
        if (subgroupElect()) partial[gl_SubgroupID] = v;
        barrier();
        for (uint s = ceilPow2(nsg) >> 1u; s > 0u; s >>= 1u) {
            if (li < s && li + s < nsg) partial[li] += partial[li + s];
            barrier();
        }
    } else {
        partial[li] = v;
        barrier();
        for (uint s = ceilPow2(count) >> 1u; s > 0u; s >>= 1u) {
            if (li < s && li + s < count) partial[li] += partial[li + s];
            barrier();
        }
    }
    return partial[0];
}

#include "rope.glsl"

// The 4 elements of a group of the head at base: x1 at p.x, p.x+1; x2 at p.y, p.y+1.
void loadGroup(bool isQ, uint base, uvec2 p, out vec2 x1, out vec2 x2) {
    if (isQ) { x1 = vec2(q[base + p.x], q[base + p.x + 1u]); x2 = vec2(q[base + p.y], q[base + p.y + 1u]); }
    else { x1 = vec2(k[base + p.x], k[base + p.x + 1u]); x2 = vec2(k[base + p.y], k[base + p.y + 1u]); }
}

void main() {
    const uint slot = gl_WorkGroupID.x;
    const uint t = gl_WorkGroupID.y;
    if (t >= pc.S || slot >= pc.heads + pc.kvHeads) return;  // uniform per workgroup
    const uint hd = pc.headDim;
    const uint rd = pc.rotaryDim == 0u ? hd : pc.rotaryDim;
    const uint half_ = rd >> 1u;
    const uint groups = hd >> 2u;
    const uint rgroups = rd >> 2u;
    const uint li = gl_LocalInvocationIndex;
    const bool batched = (pc.flags & 8u) != 0u;
    uint pos = pc.pos0 + t;
    if ((pc.flags & 1u) != 0u) pos += positions[pc.posIndex];
    if (batched) pos = positions[pc.posIndex + t];
    const uint row = batched ? positions[pc.posIndex + BATCH_WORDS + t] : pos;
    const bool isQ = slot < pc.heads;
    const uint kvh = slot - pc.heads;
    const uint base = isQ ? pc.qOffset + (t * pc.heads + slot) * hd : pc.kOffset + (t * pc.kvHeads + kvh) * hd;
    const bool cache = !isQ && (pc.flags & 2u) != 0u && row < pc.ctx;
    const bool norm = (pc.flags & 4u) != 0u;
    const uint cacheRow = (row * pc.kvHeads + kvh) * (hd >> 1u);  // uints
    const float fpos = float(pos);
    // this invocation's first group (j = li), loaded once and kept in registers
    vec2 first1 = vec2(0.0), first2 = vec2(0.0);
    if (li < groups) loadGroup(isQ, base, groupPairs(li, rgroups, half_, rd), first1, first2);
    float inv = 1.0;
    if (norm) {  // uniform
        precise float ss = 0.0;
        vec2 x1 = first1, x2 = first2;
        for (uint j = li; j < groups; j += WG) {
            if (j != li) loadGroup(isQ, base, groupPairs(j, rgroups, half_, rd), x1, x2);
            ss = ropeSquares(ss, x1, x2);
        }
        const float total = workgroupSum(ss, min(WG, groups));
        inv = ropeInvNorm(total, hd, pc.eps);
    }
    const uint wo = isQ ? pc.qNormOffset : pc.kNormOffset;
    for (uint j = li; j < groups; j += WG) {
        const uvec2 p = groupPairs(j, rgroups, half_, rd);
        vec2 x1 = first1, x2 = first2;
        if (j != li) loadGroup(isQ, base, p, x1, x2);
        const bool rotate = j < rgroups;
        const vec2 w1 = norm ? vec2(normW[wo + p.x], normW[wo + p.x + 1u]) : vec2(1.0);
        const vec2 w2 = norm ? vec2(normW[wo + p.y], normW[wo + p.y + 1u]) : vec2(1.0);
        const vec2 f = rotate ? vec2(invFreq[pc.invOffset + 2u * j], invFreq[pc.invOffset + 2u * j + 1u]) : vec2(0.0);
        vec2 y1 = x1, y2 = x2;
        ropeGroup(y1, y2, norm, inv, w1, w2, rotate, rotate ? ropeCosSin(fpos, f) : vec4(0.0));
        if (isQ) {
            q[base + p.x] = y1.x; q[base + p.x + 1u] = y1.y;
            q[base + p.y] = y2.x; q[base + p.y + 1u] = y2.y;
        } else {
            k[base + p.x] = y1.x; k[base + p.x + 1u] = y1.y;
            k[base + p.y] = y2.x; k[base + p.y + 1u] = y2.y;
            if (cache) {
                kCache[pc.kCacheOffset + cacheRow + (p.x >> 1u)] = pack2(y1.x, y1.y);
                kCache[pc.kCacheOffset + cacheRow + (p.y >> 1u)] = pack2(y2.x, y2.y);
                const uint vb = pc.vOffset + (t * pc.kvHeads + kvh) * hd;
                vCache[pc.vCacheOffset + cacheRow + (p.x >> 1u)] = pack2(v[vb + p.x], v[vb + p.x + 1u]);
                vCache[pc.vCacheOffset + cacheRow + (p.y >> 1u)] = pack2(v[vb + p.y], v[vb + p.y + 1u]);
            }
        }
    }
}
