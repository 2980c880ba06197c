// ggml_blocks.glsl: GGML's block formats Q4_1, Q5_0, Q5_1 (32-element blocks) and Q4_K, Q5_K, Q6_K
// (256-element super-blocks) read in the GGUF file's own layout, each weight formed exactly as
// ggml-quants.c's dequantize_row_* forms it (layouts and arithmetic: src/quant/FORMATS.md, "GGML
// block formats"; the CPU twin is src/quant/ggml-blocks.ts).
//
// Storage: the blocks stay as the file stores them, read as 32-bit words. Every GGML block size is
// a multiple of 2 bytes but not of 4 (Q5_0 22 B, Q6_K 210 B), so a block may start at 2 mod 4;
// such fields are assembled from two words with a funnel shift (ggml_u32). This needs no 16-bit
// storage feature (not on every device) and no repacked copy (the GPU reads the file's bytes, and
// the upload is one copy), and the extra word is an L1 hit. Q4_1 (20 B) and Q5_1 (24 B) blocks are
// 4-aligned and read by plain words; Q4_K (144 B) and Q5_K (176 B) are 16-aligned and read by
// uvec4 where the includer provides GGML_VEC4.
//
// The includer defines, before including:
//   GGML_WORD(i)   uint: word i (bytes 4i..4i+3) of the storage holding the blocks (required)
//   GGML_VEC4(i)   uvec4: 16-byte element i of the same storage (optional; else 4 GGML_WORDs)
// and reserves 4 bytes of readable storage past the last block (ggml_u32 at an address = 2 mod 4
// reads the following word).
//
// Functions (a = byte address of the block in the storage; j = which 32 consecutive elements of
// the block, 0 for the 32-element types, 0..7 for the K-quants; w[i] = element 32j + i, i.e. column
// 32j + i of the block's first column):
//   ggml_dequant32_q4_1(a, w)      a % 4 == 0
//   ggml_dequant32_q5_0(a, w)      a % 2 == 0
//   ggml_dequant32_q5_1(a, w)      a % 4 == 0
//   ggml_dequant32_q4_k(a, j, w)   a % 16 == 0 (sub-block j: one 6-bit scale and min)
//   ggml_dequant32_q5_k(a, j, w)   a % 16 == 0
//   ggml_dequant32_q6_k(a, j, w)   a % 2 == 0  (two 16-element sub-blocks: scales 2j' and 2j'+1 of its half)
//   ggml_dequant32(FMT, a, j, w)   one of the above by GGML_FMT_* (FMT a constant: the others fold away)
// Also GGML_FMT_* ids, GGML_BLOCK_BYTES(FMT), GGML_BLOCK_ELEMENTS(FMT) (macros: usable with a spec constant).
//
// Exactness: every value is GGML's, bit for bit, and every operation is `precise` (SPIR-V
// NoContraction: the compiler neither fuses nor reassociates). The one liberty, on purpose: GGML's
// `d1*x - m1` (Q4_K/Q5_K) and `x*d + m` (Q4_1/Q5_1) are written as one fma. That is the same value:
// the product is exact in f32 (at most 11 + 6 + 5 significant bits, FORMATS.md), so only the final
// add rounds, fused or not; it saves an instruction per weight. What would change bits, and is not
// done: folding the min into the scale (d1*(x - m1/d1)), f16 arithmetic, an integer sc*x for Q6_K
// (+0 where GGML has -0). Small integers become floats through the 2^23 bit trick: the bits of
// 2^23 + v minus 2^23 (+ c), exact, one or-op and one subtraction, no int->float conversion.
#ifndef GGML_BLOCKS_GLSL
#define GGML_BLOCKS_GLSL

const uint GGML_FMT_Q4_1 = 0u;
const uint GGML_FMT_Q5_0 = 1u;
const uint GGML_FMT_Q5_1 = 2u;
const uint GGML_FMT_Q4_K = 3u;
const uint GGML_FMT_Q5_K = 4u;
const uint GGML_FMT_Q6_K = 5u;

// Macros, not functions, so that they also fold a specialization constant into a constant.
#define GGML_BLOCK_BYTES(fmt) ((fmt) == GGML_FMT_Q4_1 ? 20u : (fmt) == GGML_FMT_Q5_0 ? 22u : (fmt) == GGML_FMT_Q5_1 ? 24u \
                             : (fmt) == GGML_FMT_Q4_K ? 144u : (fmt) == GGML_FMT_Q5_K ? 176u : 210u)
#define GGML_BLOCK_ELEMENTS(fmt) ((fmt) >= GGML_FMT_Q4_K ? 256u : 32u)

#ifndef GGML_VEC4
#define GGML_VEC4(i) uvec4(GGML_WORD(4u * (i)), GGML_WORD(4u * (i) + 1u), GGML_WORD(4u * (i) + 2u), GGML_WORD(4u * (i) + 3u))
#endif

// 4 bytes at even byte address a, little-endian (a funnel shift of two words when a % 4 == 2).
uint ggml_u32(uint a) {
    const uint i = a >> 2u;
    const uint sh = (a & 2u) << 3u;  // 0 or 16
    return (GGML_WORD(i) >> sh) | ((GGML_WORD(i + 1u) << 16u) << (16u - sh));
}

// v (< 2^23) as a float, exactly: the bits of 2^23 + v, minus 2^23.
float ggml_small(uint v) {
    precise float f = uintBitsToFloat(v | 0x4B000000u) - 8388608.0;
    return f;
}

// v - c (v, c < 2^23) as a float, exactly, in one subtraction.
float ggml_small_minus(uint v, uint c) {
    precise float f = uintBitsToFloat(v | 0x4B000000u) - (8388608.0 + float(c));
    return f;
}

// The field (w & mask) as a float, exactly: mask selects bits below 23 (a value v * 2^s for a field
// at bit s), ORed into the mantissa of 2^23, minus 2^23 (+ c). One and-or (LOP3) and one
// subtraction a weight, where shifting each field down first would cost another integer op: the
// 2^s goes into the scale instead (d * 2^-s, exact: a power of two, far from the f32 range's ends).
float ggml_field(uint w, uint mask) {
    precise float f = uintBitsToFloat((w & mask) | 0x4B000000u) - 8388608.0;
    return f;
}
float ggml_field_minus(uint w, uint mask, float c) {
    precise float f = uintBitsToFloat((w & mask) | 0x4B000000u) - (8388608.0 + c);
    return f;
}
// 2^-s for s in 0..126, exactly.
float ggml_pow2_neg(uint s) { return uintBitsToFloat((127u - s) << 23u); }

// A 2-mod-4 word from its two aligned words (sh 0: aligned, 16: the upper half of w0 first).
uint ggml_funnel(uint w0, uint w1, uint sh) { return sh == 0u ? w0 : ((w0 >> 16u) | (w1 << 16u)); }

// Byte b (0..3) of word w.
uint ggml_byte(uint w, uint b) { return (w >> (8u * b)) & 0xFFu; }

// dequantize_row_q4_1: y = x*d + m, x = nibble j (low nibbles: elements 0..15, high: 16..31).
// Byte b of a qs word holds its low nibble at bit 8b, its high one at 8b+4: bytes 0-1 are read in
// place (scales d, d/16, d/256, d/4096), bytes 2-3 from the word's upper half the same way.
void ggml_dequant32_q4_1(uint a, out float w[32]) {
    const vec2 dm = unpackHalf2x16(GGML_WORD(a >> 2u));
    const float m = dm.y;
    float ds[4];
    [[unroll]] for (uint i = 0u; i < 4u; ++i) ds[i] = dm.x * ggml_pow2_neg(4u * i);
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
        const uint q = GGML_WORD((a >> 2u) + 1u + k);
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint j = 4u * k + b;
            const uint part = b < 2u ? q : (q >> 16u);
            const uint s = 8u * (b & 1u);  // the low nibble's bit in `part`
            precise float lo = fma(ggml_field(part, 0xFu << s), ds[s / 4u], m);  // = x*d + m: x*d is exact
            precise float hi = fma(ggml_field(part, 0xF0u << s), ds[s / 4u + 1u], m);
            w[j] = lo;
            w[j + 16u] = hi;
        }
    }
}

// dequantize_row_q5_0: y = x*d, x = (nibble | bit j (or j+16) of qh << 4) - 16 (an int in C).
void ggml_dequant32_q5_0(uint a, out float w[32]) {
    const float d = unpackHalf2x16(ggml_u32(a)).x;
    const uint qh = ggml_u32(a + 2u);
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
        const uint q = ggml_u32(a + 6u + 4u * k);
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint j = 4u * k + b;
            const uint h0 = ((qh >> j) << 4u) & 0x10u;
            const uint h1 = (qh >> (j + 12u)) & 0x10u;
            precise float lo = ggml_small_minus(((q >> (8u * b)) & 0xFu) | h0, 16u) * d;
            precise float hi = ggml_small_minus(((q >> (8u * b + 4u)) & 0xFu) | h1, 16u) * d;
            w[j] = lo;
            w[j + 16u] = hi;
        }
    }
}

// dequantize_row_q5_1: y = x*d + m with Q5_0's 5-bit x, no offset.
void ggml_dequant32_q5_1(uint a, out float w[32]) {
    const uint i = a >> 2u;
    const vec2 dm = unpackHalf2x16(GGML_WORD(i));
    const float d = dm.x, m = dm.y;
    const uint qh = GGML_WORD(i + 1u);
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
        const uint q = GGML_WORD(i + 2u + k);
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint j = 4u * k + b;
            const uint h0 = ((qh >> j) << 4u) & 0x10u;
            const uint h1 = (qh >> (j + 12u)) & 0x10u;
            precise float lo = fma(ggml_small(((q >> (8u * b)) & 0xFu) | h0), d, m);  // = x*d + m: x*d is exact
            precise float hi = fma(ggml_small(((q >> (8u * b + 4u)) & 0xFu) | h1), d, m);
            w[j] = lo;
            w[j + 16u] = hi;
        }
    }
}

// get_scale_min_k4(j, scales): (sc, m) of sub-block j from the 12 scale bytes held in words s1..s3
// (bytes 4..15 of the block: scales[0..3] = s1, [4..7] = s2, [8..11] = s3).
uvec2 ggml_scale_min_k4(uint j, uint s1, uint s2, uint s3) {
    if (j < 4u) return uvec2(ggml_byte(s1, j) & 63u, ggml_byte(s2, j) & 63u);
    const uint b = j - 4u;  // scales[j+4] = byte b of s3, scales[j-4] = byte b of s1, scales[j] = byte b of s2
    const uint hi = ggml_byte(s3, b);
    return uvec2((hi & 0xFu) | ((ggml_byte(s1, b) >> 6u) << 4u), (hi >> 4u) | ((ggml_byte(s2, b) >> 6u) << 4u));
}

// dequantize_row_q4_K / q5_K, sub-block j: d1 = d*sc, m1 = dmin*m (f32), y = d1*x - m1; x = nibble
// (low nibbles of qs[32k..32k+31] for j = 2k, high for j = 2k+1), plus 16 where bit j of qh[l] is set (Q5_K).
// Element l's nibble sits at bit nib + 8(l%4) of qs word l/4 (nib = 0 or 4): bytes 0-1 of a word are
// read in place, bytes 2-3 from its upper half (two scales, d1*2^-nib and d1*2^-(nib+8)); Q5_K's qh bit
// is first moved next to the nibble (bit nib+4 of each byte), one shift a half-word.
void ggml_dequant32_k45(uint a, uint j, bool five, out float w[32]) {
    const uint v = a >> 4u;
    const uvec4 h = GGML_VEC4(v);  // d | dmin << 16, scales[0..11]
    const vec2 dd = unpackHalf2x16(h.x);
    const uvec2 sm = ggml_scale_min_k4(j, h.y, h.z, h.w);
    precise float d1 = dd.x * ggml_small(sm.x);
    precise float m1 = dd.y * ggml_small(sm.y);
    const uint nib = (j & 1u) * 4u;
    precise float da = d1 * ggml_pow2_neg(nib), db = d1 * ggml_pow2_neg(nib + 8u);
    const uint qv = v + (five ? 3u : 1u) + 2u * (j >> 1u);  // qs[32k..]: two uvec4
    const uint fieldMask = five ? 0x1Fu : 0xFu;
    [[unroll]] for (uint half_ = 0u; half_ < 2u; ++half_) {
        const uvec4 q = GGML_VEC4(qv + half_);
        uvec4 qh = uvec4(0u);
        if (five) qh = GGML_VEC4(v + 1u + half_);  // qh[16 half_ ..]
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            [[unroll]] for (uint hw = 0u; hw < 2u; ++hw) {  // bytes 2hw, 2hw+1 of the word
                uint part = hw == 0u ? q[k] : (q[k] >> 16u);
                if (five) {
                    // bit j of byte b (bit 8b + j) to bit 8b + nib + 4, next to the nibble
                    const uint hb = hw == 0u ? qh[k] : (qh[k] >> 16u);
                    const uint moved = (nib + 4u >= j) ? (hb << (nib + 4u - j)) : (hb >> (j - nib - 4u));
                    part = (part & (0x0F0Fu << nib)) | (moved & (0x1010u << nib));
                }
                [[unroll]] for (uint b = 0u; b < 2u; ++b) {
                    const uint l = 16u * half_ + 4u * k + 2u * hw + b;
                    precise float y = fma(b == 0u ? da : db, ggml_field(part, fieldMask << (nib + 8u * b)), -m1);  // = d1*x - m1: d1*x is exact
                    w[l] = y;
                }
            }
        }
    }
}
void ggml_dequant32_q4_k(uint a, uint j, out float w[32]) { ggml_dequant32_k45(a, j, false, w); }
void ggml_dequant32_q5_k(uint a, uint j, out float w[32]) { ggml_dequant32_k45(a, j, true, w); }

// dequantize_row_q6_K, elements 32j .. 32j+31: half n = j/4, quarter p = j%4 of it; element l of the
// quarter: x = 4 bits of ql[64n + 32(p&1) + l] (low nibble for p < 2, high for p >= 2) | bits 2p..2p+1
// of qh[32n + l] << 4, minus 32 (an int8 in C); y = (d * scales[8n + 2p + l/16]) * x, the first product
// a float and the second too (so -0 stays where GGML has it). Four 6-bit x are assembled a word at a
// time (bits 0-5 of each byte), then read in place (bytes 0-1) or from the upper half (2-3).
void ggml_dequant32_q6_k(uint a, uint j, out float w[32]) {
    const uint n = j >> 2u, p = j & 3u;
    const float d = unpackHalf2x16(ggml_u32(a + 208u)).x;
    const uint scw = ggml_u32(a + 192u + 8u * n + 2u * p);  // scales[8n+2p] (l < 16), [8n+2p+1] (l >= 16)
    const int sc0 = bitfieldExtract(int(scw), 0, 8), sc1 = bitfieldExtract(int(scw), 8, 8);
    // d * (float)sc: sc is a small signed int, exact as a float
    precise float ds0 = d * (ggml_small(uint(sc0 + 128)) - 128.0);
    precise float ds1 = d * (ggml_small(uint(sc1 + 128)) - 128.0);
    precise float ds0b = ds0 * (1.0 / 256.0), ds1b = ds1 * (1.0 / 256.0);  // for fields at bit 8
    const uint qlA = a + 64u * n + 32u * (p & 1u);
    const uint qhA = a + 128u + 32u * n;
    const uint nib = (p >> 1u) * 4u;
    const uint sh = (a & 2u) << 3u;  // 16: the block starts mid-word
    const uint qlW = qlA >> 2u, qhW = qhA >> 2u;
    uint qlPrev = GGML_WORD(qlW), qhPrev = GGML_WORD(qhW);
    [[unroll]] for (uint k = 0u; k < 8u; ++k) {
        const uint qlNext = GGML_WORD(qlW + k + 1u), qhNext = GGML_WORD(qhW + k + 1u);
        const uint ql = ggml_funnel(qlPrev, qlNext, sh), qh = ggml_funnel(qhPrev, qhNext, sh);
        qlPrev = qlNext;
        qhPrev = qhNext;
        // bits 2p..2p+1 of each byte to bits 4..5
        const uint hi2 = (p == 3u ? (qh >> 2u) : (qh << (4u - 2u * p))) & 0x30303030u;
        const uint x4 = ((ql >> nib) & 0x0F0F0F0Fu) | hi2;
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint l = 4u * k + b;
            const uint part = b < 2u ? x4 : (x4 >> 16u);
            const uint s = 8u * (b & 1u);
            const float dsl = l < 16u ? (s == 0u ? ds0 : ds0b) : (s == 0u ? ds1 : ds1b);
            precise float y = dsl * ggml_field_minus(part, 0x3Fu << s, 32.0 * float(1u << s));  // a product: -0 where GGML has it
            w[l] = y;
        }
    }
}

void ggml_dequant32(uint fmt, uint a, uint j, out float w[32]) {
    if (fmt == GGML_FMT_Q4_1) ggml_dequant32_q4_1(a, w);
    else if (fmt == GGML_FMT_Q5_0) ggml_dequant32_q5_0(a, w);
    else if (fmt == GGML_FMT_Q5_1) ggml_dequant32_q5_1(a, w);
    else if (fmt == GGML_FMT_Q4_K) ggml_dequant32_q4_k(a, j, w);
    else if (fmt == GGML_FMT_Q5_K) ggml_dequant32_q5_k(a, j, w);
    else ggml_dequant32_q6_k(a, j, w);
}

// ---- Slices: the GEMV kernels' unit of work (dec_gemv_ggml, dec_gemv_ggml_idp) ----
// A slice is 32 weights of a row read from 16 consecutive quant bytes, so that consecutive slices
// (consecutive lanes) read consecutive bytes and no two read the same ones (a 32-column unit of
// ggml_dequant32 reads a K-quant's qs bytes twice, once a nibble). Slice s of a block (0 for the
// 32-element types, 0..7 for the K-quants) is two runs of 16 columns: w[0..15] at block columns
// c0 .. c0+15 and w[16..31] at c0 + GGML_SLICE_GAP(FMT) .., c0 = ggml_slice_col(FMT, s):
//   Q4_1/Q5_0/Q5_1  the whole block (c0 0, gap 16: 32 consecutive columns)
//   Q4_K/Q5_K       qs bytes 16s..16s+15: low nibbles = sub-block 2k, high = 2k+1 (k = s/2), c0 = 64k + 16(s%2), gap 32
//   Q6_K            ql bytes 16s..16s+15: low nibbles quarter p = c, high p = c+2 of half n
//                   (n = s/4, c = (s/2)%2, h = s%2), c0 = 128n + 32c + 16h, gap 64
// ggml_slice(FMT, a, s, q0, q1, d, m) returns each run's quants as unsigned bytes (byte b of word i
// = element 4i+b of the run, 0..63, with Q5's fifth and Q6_K's upper two bits in place), its
// scale d (f32, formed as GGML forms it: d*sc for the K-quants) and additive min m (Q4_1/Q5_1: m,
// Q4_K/Q5_K: -dmin*mn, else 0); the weight is (q - GGML_SLICE_OFFSET(FMT)) * d for Q5_0 (16) and
// Q6_K (32), else q*d + m: GGML's value in both cases (ggml_slice_weights; q*d is exact).
#define GGML_SLICE_GAP(fmt) ((fmt) == GGML_FMT_Q6_K ? 64u : (fmt) >= GGML_FMT_Q4_K ? 32u : 16u)
#define GGML_SLICE_OFFSET(fmt) ((fmt) == GGML_FMT_Q6_K ? 32u : (fmt) == GGML_FMT_Q5_0 ? 16u : 0u)

uint ggml_slice_col(uint fmt, uint s) {
    if (fmt == GGML_FMT_Q6_K) return 128u * (s >> 2u) + 16u * (s & 3u);
    if (fmt >= GGML_FMT_Q4_K) return 64u * (s >> 1u) + 16u * (s & 1u);
    return 0u;
}

// 4 bits (x < 16) to bit 0 of bytes 0..3: x + x<<7 + x<<14 + x<<21 do not overlap, so no carries.
uint ggml_spread4(uint x) { return (x * 0x00204081u) & 0x01010101u; }

void ggml_slice(uint fmt, uint a, uint s, out uvec4 q0, out uvec4 q1, out vec2 d, out vec2 m) {
    m = vec2(0.0);
    if (fmt == GGML_FMT_Q4_1 || fmt == GGML_FMT_Q5_1) {
        const uint i = a >> 2u;
        const vec2 dm = unpackHalf2x16(GGML_WORD(i));
        d = vec2(dm.x);
        m = vec2(dm.y);
        const bool five = fmt == GGML_FMT_Q5_1;
        const uint qh = five ? GGML_WORD(i + 1u) : 0u;
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            const uint q = GGML_WORD(i + (five ? 2u : 1u) + k);
            q0[k] = (q & 0x0F0F0F0Fu) | (ggml_spread4((qh >> (4u * k)) & 0xFu) << 4u);
            q1[k] = ((q >> 4u) & 0x0F0F0F0Fu) | (ggml_spread4((qh >> (16u + 4u * k)) & 0xFu) << 4u);
        }
    } else if (fmt == GGML_FMT_Q5_0) {
        d = vec2(unpackHalf2x16(ggml_u32(a)).x);
        const uint qh = ggml_u32(a + 2u);
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            const uint q = ggml_u32(a + 6u + 4u * k);
            q0[k] = (q & 0x0F0F0F0Fu) | (ggml_spread4((qh >> (4u * k)) & 0xFu) << 4u);
            q1[k] = ((q >> 4u) & 0x0F0F0F0Fu) | (ggml_spread4((qh >> (16u + 4u * k)) & 0xFu) << 4u);
        }
    } else if (fmt == GGML_FMT_Q4_K || fmt == GGML_FMT_Q5_K) {
        const bool five = fmt == GGML_FMT_Q5_K;
        const uint v = a >> 4u;
        const uvec4 h = GGML_VEC4(v);  // d | dmin << 16, scales[0..11]
        const vec2 dd = unpackHalf2x16(h.x);
        const uint j = 2u * (s >> 1u);  // sub-blocks j (low nibbles) and j + 1 (high)
        // get_scale_min_k4 for all 8 sub-blocks a byte each, 4 to a word, without a branch on j (a
        // lane's j differs from its neighbours'): scales[0..3] & 63 / mins[0..3] & 63 for j < 4;
        // for j >= 4 the low nibbles (scales) or high nibbles (mins) of scales[8..11] with bits 6-7
        // of scales[0..3] / [4..7] moved to bits 4-5. The same integers as ggml_scale_min_k4.
        const uint scw = j < 4u ? (h.y & 0x3F3F3F3Fu) : ((h.w & 0x0F0F0F0Fu) | ((h.y >> 2u) & 0x30303030u));
        const uint mnw = j < 4u ? (h.z & 0x3F3F3F3Fu) : (((h.w >> 4u) & 0x0F0F0F0Fu) | ((h.z >> 2u) & 0x30303030u));
        const uint sh = (j & 2u) << 3u;  // bytes j%4, j%4 + 1 of the word: bit 0 or 16
        precise float d0 = dd.x * ggml_small((scw >> sh) & 0xFFu), d1 = dd.x * ggml_small((scw >> (sh + 8u)) & 0xFFu);
        precise float m0 = dd.y * ggml_small((mnw >> sh) & 0xFFu), m1 = dd.y * ggml_small((mnw >> (sh + 8u)) & 0xFFu);
        d = vec2(d0, d1);
        m = -vec2(m0, m1);  // negation is exact: q*d - m1 = q*d + (-m1)
        const uvec4 q = GGML_VEC4(v + (five ? 3u : 1u) + s);
        uvec4 qh = uvec4(0u);
        if (five) qh = GGML_VEC4(v + 1u + (s & 1u));  // qh[16(s%2) ..]: bit j of each byte for sub-block j
        q0 = (q & 0x0F0F0F0Fu) | (((qh >> j) & 0x01010101u) << 4u);
        q1 = ((q >> 4u) & 0x0F0F0F0Fu) | (((qh >> (j + 1u)) & 0x01010101u) << 4u);
    } else {  // Q6_K
        const uint n = s >> 2u, c = (s >> 1u) & 1u, hh = s & 1u;
        const float dq = unpackHalf2x16(ggml_u32(a + 208u)).x;
        // scales[8n + 2c + hh] (quarter c) and [.. + 4] (quarter c + 2), int8
        const uint scA = ggml_u32(a + 192u + 8u * n + 2u * c), scB = ggml_u32(a + 196u + 8u * n + 2u * c);
        const int sc0 = bitfieldExtract(int(scA), int(8u * hh), 8), sc1 = bitfieldExtract(int(scB), int(8u * hh), 8);
        precise float d0 = dq * (ggml_small(uint(sc0 + 128)) - 128.0);  // d * (float)sc, as GGML
        precise float d1 = dq * (ggml_small(uint(sc1 + 128)) - 128.0);
        d = vec2(d0, d1);
        const uint qhA = a + 128u + 32u * n + 16u * hh;
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            const uint ql = ggml_u32(a + 16u * s + 4u * k), qh = ggml_u32(qhA + 4u * k);
            q0[k] = (ql & 0x0F0F0F0Fu) | (((qh >> (2u * c)) & 0x03030303u) << 4u);
            q1[k] = ((ql >> 4u) & 0x0F0F0F0Fu) | (((qh >> (2u * c + 4u)) & 0x03030303u) << 4u);
        }
    }
}

// The slice's 32 weights, each GGML's value bit for bit: bytes 0-1 of a word read in place and
// 2-3 from its upper half (ggml_field, scales d * 2^-8 for the byte at bit 8); Q5_0/Q6_K as the
// product (q - off) * d (the difference exact; -0 where GGML has it), the others as fma(q, d, m)
// (q*d exact: at most 11 + 6 + 6 significant bits, so only the add rounds, as in GGML).
void ggml_slice_weights(uint fmt, uvec4 q0, uvec4 q1, vec2 d, vec2 m, out float w[32]) {
    const uint off = GGML_SLICE_OFFSET(fmt);
    [[unroll]] for (uint run = 0u; run < 2u; ++run) {
        const uvec4 q = run == 0u ? q0 : q1;
        const float dr = d[run], mr = m[run];
        precise float db = dr * (1.0 / 256.0);
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            [[unroll]] for (uint b = 0u; b < 4u; ++b) {
                const uint part = b < 2u ? q[k] : (q[k] >> 16u);
                const uint sh = 8u * (b & 1u);
                const float ds = sh == 0u ? dr : db;
                precise float y;
                if (off != 0u) y = ggml_field_minus(part, 0xFFu << sh, float(off << sh)) * ds;
                else y = fma(ggml_field(part, 0xFFu << sh), ds, mr);
                w[16u * run + 4u * k + b] = y;
            }
        }
    }
}

// The slice's quants as floats for a factored dot (dec_gemv_ggml's FACTORED variant): f[i] =
// (q_i - GGML_SLICE_OFFSET(FMT)) * 2^(8 (i & 1)), exact (the byte at bit 8 of a half-word is read in
// place, as ggml_slice_weights does; the caller scales the odd-index sum by 2^-8, also exact).
void ggml_slice_quants(uint fmt, uvec4 q0, uvec4 q1, out float f[32]) {
    const uint off = GGML_SLICE_OFFSET(fmt);
    [[unroll]] for (uint run = 0u; run < 2u; ++run) {
        const uvec4 q = run == 0u ? q0 : q1;
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            [[unroll]] for (uint b = 0u; b < 4u; ++b) {
                const uint part = b < 2u ? q[k] : (q[k] >> 16u);
                const uint sh = 8u * (b & 1u);
                f[16u * run + 4u * k + b] = off != 0u ? ggml_field_minus(part, 0xFFu << sh, float(off << sh)) : ggml_field(part, 0xFFu << sh);
            }
        }
    }
}

#endif  // GGML_BLOCKS_GLSL
