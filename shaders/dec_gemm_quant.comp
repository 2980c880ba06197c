#version 450
// dec_gemm_quant: y[s, o] = sum_i x[s, i] * dequant(W)[o, i] for a prompt chunk of S tokens on
// q4/q8 weights (FORMATS.md), tiled: one workgroup per block of BM = 32 rows and BN = 64 tokens
// walks the columns 32 at a time (one q4 uvec4, two q8 uvec4s per row: one scale group, as every
// group size is a multiple of 32), dequantizing the weight tile to f32 in shared memory once
// for all 64 tokens and the x tile once for all 32 rows; each of the 128 threads then
// accumulates a 4 x 4 (rows x tokens) register tile. Rows past O and tokens past S compute
// zeros that are never stored; columns past I read x as 0 (the weights' padding may hold
// anything). The GEMV kernels read each weight once per few tokens (their register chunk); this
// reads it once per 64.
//
// Split over the columns (pc.splits > 1, grid z = splits): a matrix of few rows (o_proj: 2048 rows,
// 64 tiles) leaves most of a GPU's cores idle, so each tile's columns are cut into `splits` runs of
// pc.splitCols, one workgroup each, ended by gemm_split.glsl (the last workgroup of a tile adds
// the partials in split order).
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint QBITS = 4u;        // 4 or 8
layout(constant_id = 1) const bool SCALE_F16 = true;
layout(constant_id = 2) const uint GROUP_SIZE = 32u;  // 32, 64 or 128

const uint BM = 32u;  // rows per workgroup
const uint BN = 64u;  // tokens per workgroup
const uint BK = 32u;  // columns per step

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

// split runs only: partial tiles (binding 4) and arrival words (binding 5), as the GGML GEMMs
#define SPLIT_PART_BINDING 4
#define SPLIT_ARRIVED_BINDING 5
#include "gemm_split.glsl"

// [column][row / 4] and [column][token / 4]: the compute loop reads one vec4 of each per column
shared vec4 wTile[BK][BM / 4u];
shared vec4 xTile[BK][BN / 4u];

float scaleOf(uint k) {
    return SCALE_F16 ? unpackHalf2x16(sWords[pc.scaleOffset + (k >> 1u)])[k & 1u] : uintBitsToFloat(sWords[pc.scaleOffset + k]);
}

// The next step's inputs, loaded into registers while the current step computes (with a barrier
// per step and few warps per SM, a load issued only after the barrier stalls every step).
uint nextW0, nextW1;
float nextScale;
vec4 nextX[4];

void loadStep(uint k0, uint wRow, bool xAligned) {
    const uint t = gl_LocalInvocationIndex;
    nextW0 = 0u;
    nextW1 = 0u;
    nextScale = 0.0;  // rows past O: every weight 0
    if (wRow < pc.O) {
        nextScale = scaleOf(wRow * pc.groupsPerRow + k0 / GROUP_SIZE);
        const uint rowWord = pc.weightOffset * 4u + wRow * pc.rowWords;
        if (QBITS == 4u) {
            // word k0/8 + t%4 holds columns 8w .. 8w+7: low nibbles of its bytes first, then the high
            nextW0 = wWords[rowWord + k0 / 8u + t % 4u];
        } else {
            // a q8 row ends on a uvec4 (16 columns): the last step's second half may lie past it
            const uint wi = k0 / 4u + (t % 4u) * 2u;
            if (wi < pc.rowWords) nextW0 = wWords[rowWord + wi];
            if (wi + 1u < pc.rowWords) nextW1 = wWords[rowWord + wi + 1u];
        }
    }
    // x: 64 tokens x 32 columns, 4 vec4s per thread (0 past S and past I)
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

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBase = gl_WorkGroupID.x * BM;
    const uint tokBase = gl_WorkGroupID.y * BN;
    const uint ty = t / 16u, tx = t % 16u;  // this thread's rows ty*4.., tokens tx*4..
    // the weight tile: thread t dequantizes 8 columns (lc ..) of row lr of each step
    const uint lr = t / 4u, lc = (t % 4u) * 8u;
    const uint wRow = rowBase + lr;
    const bool xAligned = ((pc.xOffset | pc.I) & 3u) == 0u;
    float acc[4][4];
    [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;

    const uint kBegin = gl_WorkGroupID.z * pc.splitCols;
    const uint kEnd = min(pc.I, kBegin + pc.splitCols);
    if (kBegin < kEnd) loadStep(kBegin, wRow, xAligned);  // uniform
    for (uint k0 = kBegin; k0 < kEnd; k0 += BK) {
        const float d = nextScale;
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            if (QBITS == 4u) {
                wTile[lc + i][lr / 4u][lr % 4u] = d * float(int((nextW0 >> (8u * i)) & 15u) - 8);
                wTile[lc + i + 4u][lr / 4u][lr % 4u] = d * float(int((nextW0 >> (8u * i + 4u)) & 15u) - 8);
            } else {
                wTile[lc + i][lr / 4u][lr % 4u] = d * float(bitfieldExtract(int(nextW0), int(8u * i), 8));
                wTile[lc + i + 4u][lr / 4u][lr % 4u] = d * float(bitfieldExtract(int(nextW1), int(8u * i), 8));
            }
        }
        [[unroll]] for (uint m = 0u; m < 4u; m++) {
            const uint e = t + 128u * m;
            const uint tok = e / 8u, c = (e % 8u) * 4u;
            [[unroll]] for (uint q = 0u; q < 4u; q++) xTile[c + q][tok / 4u][tok % 4u] = nextX[m][q];
        }
        barrier();
        if (k0 + BK < kEnd) loadStep(k0 + BK, wRow, xAligned);
        [[unroll]] for (uint k = 0u; k < BK; k++) {
            const vec4 a = wTile[k][ty];
            const vec4 b = xTile[k][tx];
            [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    if (pc.splits > 1u) {  // uniform
        if (!lastSplit(acc, pc.splits)) return;
    }
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        const uint s = tokBase + tx * 4u + j;
        if (s >= pc.S) continue;
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            const uint row = rowBase + ty * 4u + i;
            if (row < pc.O) yb[pc.yOffset + s * pc.O + row] = acc[i][j];
        }
    }
}
