// rope.glsl: the per-head arithmetic of dec_rope_kv (q/k head RMS norm, RoPE's exact angle
// reduction and sin/cos, rotate-half with partial rotary, f16 rounding of the cache rows), shared
// by dec_rope_kv.comp and dec_attention_decode.comp (ROPE_FOLD) so both give the same bits.
// Buffer-free: the includer loads the elements, weights and inverse frequencies and does the
// cross-thread sum of squares (dec_rope_kv's workgroupSum, or the fold's per-head slices that
// mirror it). See dec_rope_kv.comp for the layout of a head's groups of 4 elements.
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

// ss + the squares of a group's 4 elements (each rounded), added in the order x1.x, x1.y, x2.x, x2.y.
float ropeSquares(float ssIn, vec2 x1, vec2 x2) {
    precise float ss = ssIn;
    precise float e0 = x1.x * x1.x;
    precise float e1 = x1.y * x1.y;
    precise float e2 = x2.x * x2.x;
    precise float e3 = x2.y * x2.y;
    ss = ss + e0;
    ss = ss + e1;
    ss = ss + e2;
    ss = ss + e3;
    return ss;
}

// The head norm's 1 / sqrt(mean(x^2) + eps) from the head's f32 sum of squares.
float ropeInvNorm(float total, uint headDim, float eps) { return 1.0 / sqrt(total / float(headDim) + eps); }

// cos and sin of a rotated group's two angles fpos * f (f: the inverse frequencies of its two
// pairs), each rounded to f32: (cos0, cos1, sin0, sin1).
vec4 ropeCosSin(float fpos, vec2 f) {
    precise float a0 = fpos * f.x;
    precise float a1 = fpos * f.y;
    const vec2 sc0 = sinCos(a0), sc1 = sinCos(a1);
    return vec4(sc0.y, sc1.y, sc0.x, sc1.x);
}

// One group: normalised when `norm` (x * inv rounded to f32, then times the weights w1, w2), then
// when `rotate` (a rotated group) rotated by the angles whose ropeCosSin is cs:
// x1' = x1 c - x2 s, x2' = x2 c + x1 s.
void ropeGroup(inout vec2 x1, inout vec2 x2, bool norm, float inv, vec2 w1, vec2 w2, bool rotate, vec4 cs) {
    if (norm) {
        precise vec2 n1 = x1 * inv;
        precise vec2 n2 = x2 * inv;
        precise vec2 y1 = w1 * n1;
        precise vec2 y2 = w2 * n2;
        x1 = y1;
        x2 = y2;
    }
    if (rotate) {
        const vec2 c = cs.xy, s = cs.zw;
        precise vec2 r1 = x1 * c - x2 * s;
        precise vec2 r2 = x2 * c + x1 * s;
        x1 = r1;
        x2 = r2;
    }
}
