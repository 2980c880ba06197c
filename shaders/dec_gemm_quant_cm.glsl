// dec_gemm_quant_cm.glsl: the body of dec_gemm_quant_cm.comp and dec_gemm_quant_cm_emu.comp (the test variant: CM_EMULATE).
// dec_gemm_quant_cm: dec_gemm_quant (y[s, o] = sum_i x[s, i] * dequant(W)[o, i], a prompt chunk on
// q4/q8 pool weights) on the matrix cores: gemm_coopmat_tile.glsl's 64 x 64 tiles, the weights
// dequantized to f16 in shared memory once per chunk, x converted to f16 once per 64 rows. Bindings
// and push constants are dec_gemm_quant's (QuantGemmKernel records both), and so are its rules: rows
// past O compute zeros never stored, columns past I read x and the weights as 0, splits over the
// columns with the same scratch (64-row tiles).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint QBITS = 4u;        // 4 or 8
layout(constant_id = 1) const bool SCALE_F16 = true;
layout(constant_id = 2) const uint GROUP_SIZE = 32u;  // 32, 64 or 128

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
    uint splits;        // column runs a tile is split into (grid z); 1: no split
    uint splitCols;     // columns a run, a multiple of 32
} pc;

#define SPLIT_PART_BINDING 4
#define SPLIT_ARRIVED_BINDING 5
#include "gemm_coopmat_tile.glsl"

float scaleOf(uint k) {
    return SCALE_F16 ? unpackHalf2x16(sWords[pc.scaleOffset + (k >> 1u)])[k & 1u] : uintBitsToFloat(sWords[pc.scaleOffset + k]);
}

// Thread t: 16 columns (half h = t % 2 of the step) of row t / 2 (q4: 2 words; q8: 4), and 4 x
// vec4s of the 64 tokens x 32 columns.
uint nextW[4];
float nextScale;
uint nextK0;

void cmLoad(uint u) {
    const uint t = gl_LocalInvocationIndex;
    const uint k0 = u * BK, h = t % 2u, wRow = gl_WorkGroupID.x * BM + t / 2u;
    nextK0 = k0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) nextW[i] = 0u;
    nextScale = 0.0;  // rows past O: every weight 0
    if (wRow < pc.O) {
        nextScale = scaleOf(wRow * pc.groupsPerRow + k0 / GROUP_SIZE);
        const uint rowWord = pc.weightOffset * 4u + wRow * pc.rowWords;
        if (QBITS == 4u) {
            // word k0/8 + j holds columns 8j .. 8j+7: the low nibbles of its bytes first, then the high
            [[unroll]] for (uint i = 0u; i < 2u; i++) nextW[i] = wWords[rowWord + k0 / 8u + 2u * h + i];
        } else {
            // a q8 row ends on a uvec4 (16 columns): the last step's second half may lie past it
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                const uint wi = k0 / 4u + 4u * h + i;
                if (wi < pc.rowWords) nextW[i] = wWords[rowWord + wi];
            }
        }
    }
    const bool xAligned = ((pc.xOffset | pc.I) & 3u) == 0u;
    [[unroll]] for (uint m = 0u; m < 4u; m++) {
        const uint e = t + 128u * m;
        const uint tok = e / 8u, c = (e % 8u) * 4u;
        const uint s = gl_WorkGroupID.y * BN + tok, col = k0 + c;
        vec4 v = vec4(0.0);
        if (s < pc.S) {
            const uint xb = pc.xOffset + s * pc.I + col;
            if (xAligned && col + 4u <= pc.I) v = xv[xb >> 2u];
            else [[unroll]] for (uint q = 0u; q < 4u; q++) v[q] = col + q < pc.I ? xs[xb + q] : 0.0;
        }
        nextX[m] = v;
    }
}

void cmStore() {
    const uint t = gl_LocalInvocationIndex;
    const uint h = t % 2u;
    const bool tail = nextK0 + BK > pc.I;  // the padding past I may hold any quants
    float w[16];
    if (QBITS == 4u) {
        [[unroll]] for (uint i = 0u; i < 2u; i++) [[unroll]] for (uint b = 0u; b < 4u; b++) {
            w[8u * i + b] = float(int((nextW[i] >> (8u * b)) & 15u) - 8);
            w[8u * i + b + 4u] = float(int((nextW[i] >> (8u * b + 4u)) & 15u) - 8);
        }
    } else {
        [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint b = 0u; b < 4u; b++) w[4u * i + b] = float(bitfieldExtract(int(nextW[i]), int(8u * b), 8));
    }
    [[unroll]] for (uint k = 0u; k < 16u; k += 2u) {
        const uint col = nextK0 + 16u * h + k;
        const bool past0 = tail && col >= pc.I, past1 = tail && col + 1u >= pc.I;
        W2(t / 2u, 16u * h + k) = packHalf2x16(vec2(past0 ? 0.0 : nextScale * w[k], past1 ? 0.0 : nextScale * w[k + 1u]));
    }
    cmStoreX();
}

void main() {
    const uint steps = (pc.I + BK - 1u) / BK;
    const uint uBegin = gl_WorkGroupID.z * (pc.splitCols / BK);
    const uint uEnd = min(steps, uBegin + pc.splitCols / BK);
    cmTile(uBegin, uEnd);
    if (pc.splits > 1u) {  // uniform
        if (!cmLastSplit(pc.splits)) return;
    }
    cmWrite(pc.O, pc.S, pc.yOffset);
}
