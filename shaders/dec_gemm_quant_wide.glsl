// dec_gemm_quant_wide.glsl: the body of dec_gemm_quant_wide_cm.comp and dec_gemm_quant_wide_cm_emu.comp
// (the test variant: CM_EMULATE).
// dec_gemm_quant_wide_cm: dec_gemm_quant (y[s, o] = sum_i x[s, i] * dequant(W)[o, i], a prompt chunk
// on q4/q8 pool weights) for long chunks, on cm_slice_tile.glsl's tiles of 128 rows x BN tokens:
// each thread dequantizes its row's 32 columns a step (q times its group's scale, then f16), x is
// converted to f16 once per 128 rows, both tiles double-buffered with one barrier a step. At 64
// tokens this tile left half a large GPU idle and lost to dec_gemm_quant_cm's 64 x 64 tiles; a long
// chunk has tiles enough. Rows past O compute zeros never stored, columns past I read x and the
// weights as 0. No split over the columns. Grid: (row tiles, token tiles).
#extension GL_GOOGLE_include_directive : require
#include "cm_extensions.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint QBITS = 4u;        // 4 or 8
layout(constant_id = 1) const bool SCALE_F16 = true;
layout(constant_id = 2) const uint GROUP_SIZE = 32u;  // 32, 64 or 128
layout(constant_id = 3) const uint BN = 64u;          // tokens a tile: 32 or 64

layout(std430, binding = 0) readonly restrict buffer WW { uint wWords[]; };
layout(std430, binding = 1) readonly restrict buffer SC { uint sWords[]; };
layout(std430, binding = 2) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 2) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; };
layout(push_constant, std430) uniform PC {
    uint O;
    uint I;
    uint S;
    uint rowWords;
    uint groupsPerRow;
    uint weightOffset;  // uvec4 units
    uint scaleOffset;   // words
    uint xOffset;       // floats
    uint yOffset;       // floats
} pc;

#include "cm_slice_tile.glsl"

float scaleOf(uint k) {
    return SCALE_F16 ? unpackHalf2x16(sWords[pc.scaleOffset + (k >> 1u)])[k & 1u] : uintBitsToFloat(sWords[pc.scaleOffset + k]);
}

// This thread's row (tile row t) and its step's quants (q4: 4 words; q8: 8) and scale.
uint wRow;
uint nextW[8];
float nextScale;
uint nextK0;

void tileLoadW(uint u) {
    const uint k0 = u * BK;
    nextK0 = k0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) nextW[i] = 0u;
    nextScale = 0.0;  // rows past O: every weight 0
    if (wRow < pc.O) {
        nextScale = scaleOf(wRow * pc.groupsPerRow + k0 / GROUP_SIZE);
        const uint rowWord = pc.weightOffset * 4u + wRow * pc.rowWords;
        if (QBITS == 4u) {
            // word k0/8 + j holds columns 8j .. 8j+7: the low nibbles of its bytes first, then the high
            [[unroll]] for (uint i = 0u; i < 4u; i++) nextW[i] = wWords[rowWord + k0 / 8u + i];
        } else {
            // a q8 row ends on a uvec4 (16 columns): the last step's second half may lie past it
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                const uint wi = k0 / 4u + i;
                if (wi < pc.rowWords) nextW[i] = wWords[rowWord + wi];
            }
        }
    }
}

void tileWeights(out float w[32]) {
    float q[32];
    if (QBITS == 4u) {
        [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint b = 0u; b < 4u; b++) {
            q[8u * i + b] = float(int((nextW[i] >> (8u * b)) & 15u) - 8);
            q[8u * i + b + 4u] = float(int((nextW[i] >> (8u * b + 4u)) & 15u) - 8);
        }
    } else {
        [[unroll]] for (uint i = 0u; i < 8u; i++) [[unroll]] for (uint b = 0u; b < 4u; b++) q[4u * i + b] = float(bitfieldExtract(int(nextW[i]), int(8u * b), 8));
    }
    const bool tail = nextK0 + BK > pc.I;  // the padding past I may hold any quants
    [[unroll]] for (uint k = 0u; k < 32u; k++) w[k] = tail && nextK0 + k >= pc.I ? 0.0 : nextScale * q[k];
}

uint tileXCol(uint u, uint v) { return u * BK + 4u * v; }

uint s0;  // the tile's first token
vec4 tileLoadX(uint m, uint col) {
    const uint s = s0 + xInput(m);
    vec4 v = vec4(0.0);
    if (s < pc.S) {
        const uint xb = pc.xOffset + s * pc.I + col;
        if (((pc.xOffset | pc.I) & 3u) == 0u && col + 4u <= pc.I) v = xv[xb >> 2u];
        else [[unroll]] for (uint q = 0u; q < 4u; q++) v[q] = col + q < pc.I ? xs[xb + q] : 0.0;
    }
    return v;
}

void main() {
    const uint rowBase = gl_WorkGroupID.x * BM;
    wRow = rowBase + gl_LocalInvocationIndex;
    s0 = gl_WorkGroupID.y * BN;
    tileSteps(0u, (pc.I + BK - 1u) / BK);
    // element idx = t + 128 e of the tile: row idx % BM, token idx / BM (rows contiguous)
    for (uint idx = gl_LocalInvocationIndex; idx < BM * BN; idx += 128u) {
        const uint row = rowBase + idx % BM, s = s0 + idx / BM;
        if (row < pc.O && s < pc.S) yb[pc.yOffset + s * pc.O + row] = CT(idx % BM, idx / BM);
    }
}
