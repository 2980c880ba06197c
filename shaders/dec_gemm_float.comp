#version 450
// dec_gemm_float: y[s, o] = sum_i W[o, i] * x[s, i] for a prompt chunk of any S tokens on float
// weights laid out as dec_gemv_half reads them: 16-bit floats (f16, or bf16 with flags bit 0)
// packed two per uint, element 2j of the flat array in the low half (with I odd, rows start
// mid-word), or with flags bit 1 f32, one element per uint (weightOffset then counts f32
// elements).  x f32 [S][I] at xOffset, y f32 [S][O] at yOffset, f32 sums.  dec_gemv_half takes at
// most 8 tokens a dispatch, reading each weight once per 8 tokens; this reads it once per tile.
//
// Two shapes, by the spec constant NARROW_ROWS:
// - 0, the tile (dec_gemm_quant's): a workgroup of 128 threads per BM = 32 rows x BN = 64 tokens
//   walks the columns BK = 32 at a time, the weight tile converted to f32 in shared memory once
//   for all 64 tokens and the x tile once for all 32 rows; each thread accumulates a 4 x 4 (rows x
//   tokens) register tile.  The next step's weights and x are loaded into registers while the
//   current step computes.  Grid ceil(O / 32) x ceil(S / 64).
// - 1..4, for matrices of fewer rows than a tile (the shared expert's 1-row gate: a 32-row tile
//   would compute 31 rows for nothing, in only S / 64 workgroups): a workgroup per NARROW_ROWS rows
//   x NT = 8 tokens, so the tokens spread over S / 8 workgroups.  Thread (g, k) = (t / 32, t % 32)
//   takes the 4-column chunks k, k + 32, ... of tokens 2g, 2g + 1, each weight chunk (read from
//   global memory: a few rows stay in cache) serving both tokens; the 32 partials of each output
//   are then added in shared memory, in order.  Grid ceil(O / NARROW_ROWS) x ceil(S / 8).
// Rows past O, tokens past S and columns past I compute zeros that are never stored (weights and
// x past I are read as 0, nothing past the matrix or x is read).
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint NARROW_ROWS = 0u;  // 0: the 32 x 64 tile; 1..4: the narrow shape's rows

const uint WG = 128u;
const uint BM = 32u;  // tile: rows per workgroup
const uint BN = 64u;  // tile: tokens per workgroup
const uint BK = 32u;  // tile: columns per step
const uint KS = 32u;  // narrow: threads over a token's columns
const uint TN = 2u;   // narrow: tokens per thread
const uint NT = (WG / KS) * TN;  // narrow: tokens per workgroup (8)
const uint MAX_NARROW = 4u;

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

// tile: [column][row / 4] and [column][token / 4], one vec4 of each read per column per thread
shared vec4 wTile[BK][BM / 4u];
shared vec4 xTile[BK][BN / 4u];
// narrow: each thread's partials [row][token of the thread][thread]
shared float red[MAX_NARROW * TN * WG];

bool bf16() { return (pc.flags & 1u) != 0u; }
bool f32w() { return (pc.flags & 2u) != 0u; }

// The two 16-bit floats of word w: (element of the low half, element of the high half).
vec2 decode2(uint w) {
    if (bf16()) return vec2(uintBitsToFloat(w << 16u), uintBitsToFloat(w & 0xFFFF0000u));
    return unpackHalf2x16(w);
}

// Half element h (index into the flat array of halves, weightOffset included) as a float.
float loadHalf(uint h) {
    const uint w = w1[h >> 1u];
    const uint b = ((h & 1u) != 0u) ? (w >> 16u) : (w & 0xFFFFu);
    return bf16() ? uintBitsToFloat(b << 16u) : unpackHalf2x16(b).x;
}

// Columns col .. col + 3 of row `row` (< O) as floats, 0 past I: 16-byte loads where the f32
// elements are 16-byte aligned, word loads where the halves start a word, else half by half.
vec4 loadWeights4(uint row, uint col) {
    if (col + 4u <= pc.I) {
        if (f32w()) {
            const uint e = pc.weightOffset + row * pc.I + col;
            if ((e & 3u) == 0u) return uintBitsToFloat(w4[e >> 2u]);
            return uintBitsToFloat(uvec4(w1[e], w1[e + 1u], w1[e + 2u], w1[e + 3u]));
        }
        const uint h = 2u * pc.weightOffset + row * pc.I + col;
        if ((h & 1u) == 0u) return vec4(decode2(w1[h >> 1u]), decode2(w1[(h >> 1u) + 1u]));
        return vec4(loadHalf(h), loadHalf(h + 1u), loadHalf(h + 2u), loadHalf(h + 3u));
    }
    vec4 v = vec4(0.0);
    [[unroll]] for (uint q = 0u; q < 4u; q++) {
        if (col + q < pc.I) {
            v[q] = f32w() ? uintBitsToFloat(w1[pc.weightOffset + row * pc.I + col + q])
                          : loadHalf(2u * pc.weightOffset + row * pc.I + col + q);
        }
    }
    return v;
}

// Columns col .. col + 3 of token s (< S) of x, 0 past I.
vec4 loadX4(uint s, uint col, bool xAligned) {
    const uint xb = pc.xOffset + s * pc.I + col;
    if (xAligned && col + 4u <= pc.I) return xv[xb >> 2u];
    vec4 v = vec4(0.0);
    [[unroll]] for (uint q = 0u; q < 4u; q++) v[q] = col + q < pc.I ? xs[xb + q] : 0.0;
    return v;
}

// ---- the tile ----

// The next step's inputs, loaded into registers while the current step computes.
vec4 nextW[2];
vec4 nextX[4];

// Thread t's part of step k0: 8 weights (columns lc .. lc + 7 of row wRow) and 4 vec4s of x.
void loadStep(uint k0, uint wRow, uint lc, bool xAligned) {
    const uint t = gl_LocalInvocationIndex;
    nextW[0] = vec4(0.0);
    nextW[1] = vec4(0.0);
    if (wRow < pc.O) {
        nextW[0] = loadWeights4(wRow, k0 + lc);
        nextW[1] = loadWeights4(wRow, k0 + lc + 4u);
    }
    // x: 64 tokens x 32 columns, 4 vec4s per thread
    [[unroll]] for (uint m = 0u; m < 4u; m++) {
        const uint e = t + WG * m;
        const uint tok = e / 8u, c = (e % 8u) * 4u;
        const uint s = gl_WorkGroupID.y * BN + tok;
        nextX[m] = s < pc.S ? loadX4(s, k0 + c, xAligned) : vec4(0.0);
    }
}

void tileMain(bool xAligned) {
    const uint t = gl_LocalInvocationIndex;
    const uint rowBase = gl_WorkGroupID.x * BM;
    const uint tokBase = gl_WorkGroupID.y * BN;
    const uint ty = t / 16u, tx = t % 16u;  // this thread's rows ty*4.., tokens tx*4..
    const uint lr = t / 4u, lc = (t % 4u) * 8u;  // the weight tile: row lr, columns lc .. lc + 7 of each step
    const uint wRow = rowBase + lr;
    float acc[4][4];
    [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;

    loadStep(0u, wRow, lc, xAligned);
    for (uint k0 = 0u; k0 < pc.I; k0 += BK) {
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            wTile[lc + i][lr / 4u][lr % 4u] = nextW[0][i];
            wTile[lc + 4u + i][lr / 4u][lr % 4u] = nextW[1][i];
        }
        [[unroll]] for (uint m = 0u; m < 4u; m++) {
            const uint e = t + WG * m;
            const uint tok = e / 8u, c = (e % 8u) * 4u;
            [[unroll]] for (uint q = 0u; q < 4u; q++) xTile[c + q][tok / 4u][tok % 4u] = nextX[m][q];
        }
        barrier();
        if (k0 + BK < pc.I) loadStep(k0 + BK, wRow, lc, xAligned);  // uniform
        [[unroll]] for (uint k = 0u; k < BK; k++) {
            const vec4 a = wTile[k][ty];
            const vec4 b = xTile[k][tx];
            [[unroll]] for (uint i = 0u; i < 4u; i++) [[unroll]] for (uint j = 0u; j < 4u; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        barrier();
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

// ---- the narrow shape ----

void narrowMain(bool xAligned) {
    const uint t = gl_LocalInvocationIndex;
    const uint R = NARROW_ROWS;
    const uint rowBase = gl_WorkGroupID.x * R;
    const uint g = t / KS, k = t % KS;
    const uint tokBase = gl_WorkGroupID.y * NT + g * TN;  // this thread's tokens tokBase, tokBase + 1
    float acc[MAX_NARROW][TN];
    [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++) [[unroll]] for (uint j = 0u; j < TN; j++) acc[r][j] = 0.0;

    for (uint col = 4u * k; col < pc.I; col += 4u * KS) {
        vec4 w[MAX_NARROW];
        [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++) {
            w[r] = vec4(0.0);
            if (r < R && rowBase + r < pc.O) w[r] = loadWeights4(rowBase + r, col);
        }
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            if (tokBase + j < pc.S) {
                const vec4 xc = loadX4(tokBase + j, col, xAligned);
                [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++) {
                    if (r < R) {
                        acc[r][j] = fma(w[r].x, xc.x, acc[r][j]);
                        acc[r][j] = fma(w[r].y, xc.y, acc[r][j]);
                        acc[r][j] = fma(w[r].z, xc.z, acc[r][j]);
                        acc[r][j] = fma(w[r].w, xc.w, acc[r][j]);
                    }
                }
            }
        }
    }
    [[unroll]] for (uint r = 0u; r < MAX_NARROW; r++)
        [[unroll]] for (uint j = 0u; j < TN; j++) red[(r * TN + j) * WG + t] = acc[r][j];
    barrier();
    // thread o < R * NT adds the KS partials of output (row o / NT, token o % NT) in column order
    if (t < R * NT) {
        const uint r = t / NT, tok = t % NT;
        const uint gg = tok / TN, j = tok % TN;
        const uint s = gl_WorkGroupID.y * NT + tok, row = rowBase + r;
        float v = 0.0;
        for (uint kk = 0u; kk < KS; kk++) v += red[(r * TN + j) * WG + gg * KS + kk];
        if (s < pc.S && row < pc.O) yb[pc.yOffset + s * pc.O + row] = v;
    }
}

void main() {
    const bool xAligned = ((pc.xOffset | pc.I) & 3u) == 0u;
    if (NARROW_ROWS == 0u) tileMain(xAligned);
    else narrowMain(xAligned);
}
