#version 450
// dec_gemm_float_tile: dec_gemm_float's product (y[s, o] = sum_i W[o, i] * x[s, i], the same weights,
// x, y, bindings and push constants) for matrices of many rows (the routers' prompt chunks), as
// 32-row x 32-token tiles.  A 32 x 64 tile of 128 threads over all of I left a 256-row router at 512
// tokens 64 workgroups, too few for a large GPU; here the four 64-thread groups of a workgroup
// each take a quarter of the columns of the same tile (so a tile is 4 x 2 warps, and such a router
// 128 workgroups), stage their 16-column steps of weights and x in shared memory as f32, and keep
// a 4 x 4 (rows x tokens) register tile; the four partial tiles are then added in group order in
// shared memory (the same sum on every run).  The next step's loads are issued before this one's
// products.  Grid ceil(O / 32) x ceil(S / 32).  Rows past O, tokens past S and columns past I
// compute zeros that are never stored (weights and x past I are read as 0, nothing past the matrix
// or x is read).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;

const uint GROUP = 64u;   // threads of a column group
const uint GROUPS = 4u;   // column groups a workgroup
const uint BM = 32u;      // rows a tile
const uint BN = 32u;      // tokens a tile
const uint BK = 16u;      // columns a step of a group

layout(std430, binding = 0) readonly restrict buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly restrict buffer W1 { uint w1[]; };
layout(std430, binding = 1) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 1) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 2) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;
    uint S;
    uint weightOffset;  // uints (two halves each; f32 weights: one element each)
    uint xOffset;       // floats
    uint yOffset;       // floats
    uint flags;         // bit 0: bf16 (else f16); bit 1: f32 weights (bit 0 ignored)
} pc;

#include "float_weights.glsl"

// [group][column of the step][row / 4 or token / 4]: one vec4 of each read a column a thread
shared vec4 wTile[GROUPS][BK][BM / 4u];
shared vec4 xTile[GROUPS][BK][BN / 4u];
// groups 1..3's partial tiles [group - 1][i * 4 + j][thread of the group]
shared float red[(GROUPS - 1u) * 16u * GROUP];

// the next step's inputs: 2 vec4s of weights and 2 of x a thread (a step is 32 x 16 of each)
vec4 nextW[2];
vec4 nextX[2];

void loadStep(uint col0, uint l, bool xAligned) {
    const uint rowBase = gl_WorkGroupID.x * BM, tokBase = gl_WorkGroupID.y * BN;
    [[unroll]] for (uint m = 0u; m < 2u; m++) {
        const uint e = l + GROUP * m;
        const uint r = e / 4u, c = col0 + (e % 4u) * 4u;  // row (token) r of the tile, columns c .. c + 3
        nextW[m] = rowBase + r < pc.O && c < pc.I ? loadWeights4(rowBase + r, c) : vec4(0.0);
        nextX[m] = tokBase + r < pc.S && c < pc.I ? loadX4(tokBase + r, c, xAligned) : vec4(0.0);
    }
}

void main() {
    const bool xAligned = ((pc.xOffset | pc.I) & 3u) == 0u;
    const uint t = gl_LocalInvocationIndex;
    const uint g = t / GROUP, l = t % GROUP;
    const uint ty = l / 8u, tx = l % 8u;  // this thread's rows ty * 4 .., tokens tx * 4 ..
    // group g's columns: [g * per, (g + 1) * per), per a whole number of steps (the same count for every group)
    const uint per = ((pc.I + GROUPS * BK - 1u) / (GROUPS * BK)) * BK;
    const uint col0 = g * per;
    float acc[4][4];
    [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;

    loadStep(col0, l, xAligned);
    for (uint k0 = 0u; k0 < per; k0 += BK) {
        [[unroll]] for (uint m = 0u; m < 2u; m++) {
            const uint e = l + GROUP * m;
            const uint r = e / 4u, c = (e % 4u) * 4u;
            [[unroll]] for (uint q = 0u; q < 4u; q++) {
                wTile[g][c + q][r / 4u][r % 4u] = nextW[m][q];
                xTile[g][c + q][r / 4u][r % 4u] = nextX[m][q];
            }
        }
        barrier();
        if (k0 + BK < per) loadStep(col0 + k0 + BK, l, xAligned);  // uniform
        [[unroll]] for (uint k = 0u; k < BK; k++) {
            const vec4 a = wTile[g][k][ty];
            const vec4 b = xTile[g][k][tx];
            [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        barrier();
    }
    if (g > 0u) {
        [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) red[((g - 1u) * 16u + i * 4u + j) * GROUP + l] = acc[i][j];
    }
    barrier();
    if (g != 0u) return;
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        const uint s = gl_WorkGroupID.y * BN + tx * 4u + j;
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            float v = acc[i][j];
            [[unroll]] for (uint h = 0u; h < GROUPS - 1u; h++) v += red[(h * 16u + i * 4u + j) * GROUP + l];
            const uint row = gl_WorkGroupID.x * BM + ty * 4u + i;
            if (s < pc.S && row < pc.O) yb[pc.yOffset + s * pc.O + row] = v;
        }
    }
}
