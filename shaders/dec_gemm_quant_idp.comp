#version 450
// dec_gemm_quant_idp: the integer-dot path of dec_gemm_quant. y[s, o] = sum_i dequant(W)[o, i] * x[s, i]
// for a prompt chunk of S tokens on q4/q8 weights in the pool format (FORMATS.md: a row of uvec4s,
// 32 q4 or 16 q8 columns each, and a scale per group of GROUP_SIZE columns), x given quantized as
// dec_gemm_ggml_idp takes it (quantize_act with GROUP_SIZE 16: int8 xq [S][I], f32 power-of-two
// scales and int sums per 16 columns); y f32 [S][O] at yOffset. The tile is dec_gemm_ggml_idp's
// (gemm_idp_tile.glsl); a 32-column slice is one q4 uvec4 or two q8 uvec4s of the row, read as two
// runs of 16 unsigned bytes in column order: q4 nibbles (q + 8: OFF 8; word w's low nibbles are
// columns 8w..8w+3, its high ones 8w+4..8w+7), q8 bytes with their top bit flipped (q + 128: OFF 128);
// d is the slice's group scale for both runs (every group size is a multiple of 32). The products are
// exact int32 as in dec_gemm_ggml_idp (|dot| <= 16 * 127 * 255 + 128 * 2032 < 2^22).
// I is a multiple of 32. Split over the columns as dec_gemm_quant (pc.splits > 1, grid z).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_spirv_intrinsics : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint QBITS = 4u;        // 4 or 8
layout(constant_id = 1) const bool SCALE_F16 = true;
layout(constant_id = 2) const uint GROUP_SIZE = 32u;  // 32, 64 or 128
layout(constant_id = 3) const uint STEP = 1u;         // slices a step (between two barriers), 1..4

const uint BM = 32u;  // rows per workgroup
const uint BN = 64u;  // tokens per workgroup

// OpSUDot (SPV_KHR_integer_dot_product) as gemv_idp.glsl declares it.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4x8(uint a, uint b, spirv_literal int packedFormat);  // signed a x unsigned b

layout(std430, binding = 0) readonly restrict buffer WV { uvec4 wv[]; };
layout(std430, binding = 1) readonly restrict buffer SC { uint sWords[]; };
layout(std430, binding = 2) readonly restrict buffer XQ { uvec4 xq[]; };
layout(std430, binding = 3) readonly restrict buffer XSC { float xscale[]; };
layout(std430, binding = 4) readonly restrict buffer XSU { int xsum[]; };
layout(std430, binding = 5) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;             // a multiple of 32
    uint S;
    uint rowWords;
    uint groupsPerRow;
    uint weightOffset;  // uvec4 units
    uint scaleOffset;   // words
    uint yOffset;       // floats
    uint splits;        // column runs a tile is split into (grid z); 1: no split
    uint splitCols;     // columns a run, a multiple of 32
} pc;

// split runs only: partial tiles and arrival words
#define SPLIT_PART_BINDING 6
#define SPLIT_ARRIVED_BINDING 7
#include "gemm_split.glsl"

const uint GAP = 1u;                          // the second run: the next 16 columns
const int OFF = QBITS == 4u ? 8 : 128;
const bool MINS = false;

// the tile's hooks (gemm_idp_tile.glsl): a row by its index
uint rowHandle(uint row) { return row; }
void loadSlice(uint row, uint u, out uvec4 q0, out uvec4 q1, out vec2 d, out vec2 m) {
    const uint rowVec = pc.weightOffset + row * (pc.rowWords >> 2u);
    if (QBITS == 4u) {
        const uvec4 w = wv[rowVec + u];
        const uint M = 0x0F0F0F0Fu;
        q0 = uvec4(w.x & M, (w.x >> 4u) & M, w.y & M, (w.y >> 4u) & M);  // columns 0..15 of the slice
        q1 = uvec4(w.z & M, (w.z >> 4u) & M, w.w & M, (w.w >> 4u) & M);  // 16..31
    } else {
        q0 = wv[rowVec + 2u * u] ^ uvec4(0x80808080u);
        q1 = wv[rowVec + 2u * u + 1u] ^ uvec4(0x80808080u);
    }
    const uint k = row * pc.groupsPerRow + (32u * u) / GROUP_SIZE;
    const float s = SCALE_F16 ? unpackHalf2x16(sWords[pc.scaleOffset + (k >> 1u)])[k & 1u] : uintBitsToFloat(sWords[pc.scaleOffset + k]);
    d = vec2(s);
    m = vec2(0.0);
}
uint sliceGroup(uint u) { return 2u * u; }

#include "gemm_idp_tile.glsl"
