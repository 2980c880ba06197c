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
// the correctly rounded values (test/decoder-kernels.test.ts measures it).
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

// ---- exact trig of an f32 angle -----------------------------------------------------------
float pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23u); }  // e in [-126, 127]

// a * b = p + e exactly (Dekker; every operation rounded, none contracted).
void twoProd(float a, float b, out float p, out float e) {
    precise float pp = a * b;
    precise float ca = 4097.0 * a;
    precise float ah = ca - (ca - a);
    precise float al = a - ah;
    precise float cb = 4097.0 * b;
    precise float bh = cb - (cb - b);
    precise float bl = b - bh;
    precise float ee = ((ah * bh - pp) + ah * bl + al * bh) + al * bl;
    p = pp;
    e = ee;
}

// a (>= 0, < 2^24) = quadrant * pi/2 + (rh + rl), |rh + rl| <= pi/4 (float-float).
void reduceAngle(float a, out uint quadrant, out float rh, out float rl) {
    if (a <= 0.78539816) { quadrant = 0u; rh = a; rl = 0.0; return; }
    const uint bits = floatBitsToUint(a);
    const uint m = (bits & 0x7FFFFFu) | 0x800000u;
    const uint s = 150u - (bits >> 23u);  // a = m * 2^-s, s in [0, 24]
    // 2/pi * 2^128, most significant word first
    const uint T0 = 0xA2F9836Eu, T1 = 0x4E441529u, T2 = 0xFC2757D1u, T3 = 0xF534DDC0u;
    uint h0, l0, h1, l1, h2, l2, h3, l3, c;
    umulExtended(m, T3, h3, l3);
    umulExtended(m, T2, h2, l2);
    umulExtended(m, T1, h1, l1);
    umulExtended(m, T0, h0, l0);
    // P = m * T as words r4..r0 (r0 least significant); r0 = l3 is below what is kept
    uint carry;
    const uint r1 = uaddCarry(h3, l2, carry);
    const uint t2 = uaddCarry(h2, l1, c); uint cc = c;
    const uint r2 = uaddCarry(t2, carry, c); cc += c;
    uint t3 = uaddCarry(h1, l0, c); uint cc3 = c;
    uint r3 = uaddCarry(t3, cc, c); cc3 += c;
    uint r4 = h0 + cc3;
    // a * 2/pi = P * 2^-(128 + s): integer part r4 >> s, 64 fraction bits below it
    uint q = r4 >> s;
    uint fh = s == 0u ? r3 : (r3 >> s) | (r4 << (32u - s));
    uint fl = s == 0u ? r2 : (r2 >> s) | (r3 << (32u - s));
    // round to the nearest quadrant: a fraction >= 1/2 is (fraction - 1), negative
    const bool neg = (fh & 0x80000000u) != 0u;
    if (neg) {
        q += 1u;
        fl = ~fl + 1u;
        fh = ~fh + (fl == 0u ? 1u : 0u);
    }
    quadrant = q & 3u;
    if (fh == 0u && fl == 0u) { rh = 0.0; rl = 0.0; return; }
    // normalise the 64-bit magnitude (value (fh:fl) * 2^-64) to its top bit at 63
    const int sh = fh != 0u ? 31 - findMSB(fh) : 63 - findMSB(fl);
    if (sh >= 32) { fh = fl << uint(sh - 32); fl = 0u; }
    else if (sh > 0) { fh = (fh << uint(sh)) | (fl >> uint(32 - sh)); fl = fl << uint(sh); }
    const float Fh = float(fh >> 8u) * pow2(-24 - sh);
    const float Fl = float(((fh & 0xFFu) << 16u) | (fl >> 16u)) * pow2(-48 - sh);
    // r = (Fh + Fl) * pi/2 as a float-float
    const float PIO2_H = 1.57079637050628662109375;      // f32(pi/2)
    const float PIO2_L = -4.37113900018624283e-8;        // pi/2 - PIO2_H
    float p, e;
    twoProd(Fh, PIO2_H, p, e);
    precise float lo = e + (Fh * PIO2_L + Fl * PIO2_H);
    precise float hi = p + lo;
    precise float lo2 = lo - (hi - p);
    rh = neg ? -hi : hi;
    rl = neg ? -lo2 : lo2;
}

// sin and cos of the f32 angle a >= 0, each rounded to f32 (within 2 ulp).
vec2 sinCos(float a) {
    uint quadrant;
    float rh, rl;
    reduceAngle(a, quadrant, rh, rl);
    precise float z = rh * rh;
    precise float sp = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * rh;
    precise float sn = rh + (sp + rl * (1.0 - 0.5 * z));
    precise float cp = z * z * ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2);
    precise float cs = 1.0 - (0.5 * z - (cp - rl * rh));
    vec2 r;
    if (quadrant == 0u) r = vec2(sn, cs);
    else if (quadrant == 1u) r = vec2(cs, -sn);
    else if (quadrant == 2u) r = vec2(-sn, -cs);
    else r = vec2(-cs, sn);
    return r;
}

// ---- f32 -> f16 bits, round to nearest even (as src/quant/half.ts f32ToF16Bits) --------------
uint f16Bits(float f) {
    const uint x = floatBitsToUint(f);
    const uint sign = (x >> 16u) & 0x8000u;
    const uint ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return sign | 0x7C00u | (ax > 0x7F800000u ? (0x200u | ((ax & 0x7FFFFFu) >> 13u)) : 0u);
    if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
    if (ax >= 0x38800000u) {                         // normal half
        uint h = (ax - 0x38000000u) >> 13u;
        const uint rest = ax & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) h += 1u;
        return sign | h;
    }
    if (ax <= 0x33000000u) return sign;              // <= 2^-25: zero
    const uint full = (ax & 0x7FFFFFu) | 0x800000u;
    const uint shift = 126u - (ax >> 23u);           // 14..24 (units of 2^-24)
    uint units = full >> shift;
    const uint rest = full & ((1u << shift) - 1u);
    const uint halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (units & 1u) != 0u)) units += 1u;
    return sign | units;
}

uint pack2(float lo, float hi) { return f16Bits(lo) | (f16Bits(hi) << 16u); }

// Element pairs of group j: rotated groups (j < rgroups) x1 = (2j, 2j+1), x2 = (2j+half, 2j+1+half);
// passed-through ones the 4 consecutive dims from rd + 4 (j - rgroups).
uvec2 groupPairs(uint j, uint rgroups, uint half_, uint rd) {
    if (j < rgroups) return uvec2(2u * j, 2u * j + half_);
    const uint e = rd + 4u * (j - rgroups);
    return uvec2(e, e + 2u);
}

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
            precise float e0 = x1.x * x1.x;
            precise float e1 = x1.y * x1.y;
            precise float e2 = x2.x * x2.x;
            precise float e3 = x2.y * x2.y;
            ss = ss + e0;
            ss = ss + e1;
            ss = ss + e2;
            ss = ss + e3;
        }
        const float total = workgroupSum(ss, min(WG, groups));
        inv = 1.0 / sqrt(total / float(hd) + pc.eps);
    }
    const uint wo = isQ ? pc.qNormOffset : pc.kNormOffset;
    for (uint j = li; j < groups; j += WG) {
        const uvec2 p = groupPairs(j, rgroups, half_, rd);
        vec2 x1 = first1, x2 = first2;
        if (j != li) loadGroup(isQ, base, p, x1, x2);
        if (norm) {
            precise vec2 n1 = x1 * inv;
            precise vec2 n2 = x2 * inv;
            precise vec2 y1 = vec2(normW[wo + p.x], normW[wo + p.x + 1u]) * n1;
            precise vec2 y2 = vec2(normW[wo + p.y], normW[wo + p.y + 1u]) * n2;
            x1 = y1;
            x2 = y2;
        }
        vec2 y1 = x1, y2 = x2;
        if (j < rgroups) {
            const uint i0 = 2u * j;
            precise float a0 = fpos * invFreq[pc.invOffset + i0];
            precise float a1 = fpos * invFreq[pc.invOffset + i0 + 1u];
            const vec2 sc0 = sinCos(a0), sc1 = sinCos(a1);
            const vec2 c = vec2(sc0.y, sc1.y), s = vec2(sc0.x, sc1.x);
            precise vec2 r1 = x1 * c - x2 * s;
            precise vec2 r2 = x2 * c + x1 * s;
            y1 = r1;
            y2 = r2;
        }
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
