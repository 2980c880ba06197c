#version 450
// dec_gemv_ggml: y[s, o] = sum_i W[o, i] * x[s, i] for S = 1..64 tokens, W a [O][I] tensor of a GGML
// block type (FORMAT: Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, ggml_blocks.glsl's GGML_FMT_*) in the GGUF
// file's own layout from byte blockOffset; x f32 [S][I] at xOffset, y f32 [S][O] at yOffset; float
// path: each weight formed exactly as GGML's dequantize_row_* forms it (ggml_blocks.glsl), then
// multiplied by x with f32 accumulation (fma).
//
// The format is a specialization constant (one pipeline per type; the other formats' code folds
// away). One workgroup per ROWS_PER_WG rows; thread t takes the 32-column units t, t + WG, ... of
// every row of its block (a unit: a whole 32-element block, or a sub-block of 32 (Q4_K/Q5_K) or two
// of 16 (Q6_K) of a super-block), so consecutive threads read consecutive bytes of a row. x goes
// through shared memory (coalesced loads) into registers, once per unit for all R rows. Tokens in
// chunks of TOKENS: a unit is dequantized once per row per chunk into 32 registers and dotted with
// each token of the chunk. Then subgroupAdd and shared memory across subgroups (or a shared tree).
// Shared memory: TOKENS * WG * 144 + WG * R * TOKENS * 4 bytes.
// Rows past O read row O-1 (not stored). blockOffset: a multiple of 16 for Q4_K/Q5_K, 4 for
// Q4_1/Q5_1, 2 for Q5_0/Q6_K; 4 readable bytes past the last block (ggml_blocks.glsl). x is read
// as vec4 only (xOffset % 4 == 0; I is a multiple of 32): a scalar variant doubled the unrolled
// code, and with it the pipeline's compile time on Lavapipe (LLVM), for offsets no caller uses.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS_PER_WG = 4u;
layout(constant_id = 2) const bool USE_SUBGROUP = true;
layout(constant_id = 3) const uint FORMAT = 3u;  // GGML_FMT_*
layout(constant_id = 4) const uint TOKENS = 1u;  // tokens per register chunk, 1..8

const uint WG = gl_WorkGroupSize.x;
const uint R = ROWS_PER_WG;

layout(std430, binding = 0) readonly restrict buffer WB { uint wb[]; };
layout(std430, binding = 0) readonly restrict buffer WV { uvec4 wv[]; };
layout(std430, binding = 1) readonly restrict buffer XV { vec4 xv[]; };
layout(std430, binding = 2) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;            // a multiple of the block's elements
    uint S;            // 1..64
    uint blockOffset;  // bytes
    uint xOffset;      // floats, a multiple of 4 (vec4 loads)
    uint yOffset;      // floats
} pc;

#define GGML_WORD(i) wb[i]
#define GGML_VEC4(i) wv[i]
#include "ggml_blocks.glsl"

const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint UNITS_PER_BLOCK = GGML_BLOCK_ELEMENTS(FORMAT) / 32u;

shared float red[WG * R * TOKENS];
// x of the WG units a chunk of columns covers, per token: unit v at vec4 (k * WG + v) * 9, 32 floats
// and one vec4 of padding, so the 8 threads of a 128-bit shared access hit distinct banks.
shared vec4 xsh[TOKENS * WG * 9u];
float acc[R][TOKENS];
vec4 xr[TOKENS][8];

void main() {
    const uint block = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint rowBase = block * R;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform
    const uint t = gl_LocalInvocationIndex;
    const uint I = pc.I;
    const uint units = I >> 5u;
    const uint rowBytes = (units / UNITS_PER_BLOCK) * BLOCK_BYTES;

    uint rowAddr[R];
    [[unroll]] for (uint r = 0u; r < R; ++r) rowAddr[r] = pc.blockOffset + min(rowBase + r, pc.O - 1u) * rowBytes;

    for (uint tok0 = 0u; tok0 < pc.S; tok0 += TOKENS) {
        const uint nt = min(TOKENS, pc.S - tok0);
        [[unroll]] for (uint r = 0u; r < R; ++r)
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[r][k] = 0.0;

        for (uint c0 = 0u; c0 < units; c0 += WG) {  // uniform
            // Stage x of units c0 .. c0+WG-1 through shared memory: the global loads are coalesced
            // (consecutive threads, consecutive vec4), where each thread reading its own unit's 128
            // bytes would touch 32 lines per warp load (the L1 then bounds the whole kernel).
            barrier();  // the previous chunk's readers are done
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                if (k < nt) {  // uniform
                    const uint xrow = (pc.xOffset + (tok0 + k) * I) >> 2u;
                    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
                        const uint v = i * WG + t;  // vec4 v of the chunk: unit v / 8, part v % 8
                        if (c0 + v / 8u < units) xsh[(k * WG + v / 8u) * 9u + v % 8u] = xv[xrow + 8u * c0 + v];
                    }
                }
            }
            barrier();
            const uint u = c0 + t;
            if (u < units) {
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k)
                    if (k < nt) [[unroll]] for (uint q = 0u; q < 8u; ++q) xr[k][q] = xsh[(k * WG + t) * 9u + q];
                const uint blk = u / UNITS_PER_BLOCK, j = u % UNITS_PER_BLOCK;
                [[unroll]] for (uint r = 0u; r < R; ++r) {
                    float w[32];
                    ggml_dequant32(FORMAT, rowAddr[r] + blk * BLOCK_BYTES, j, w);
                    [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                        if (k < nt) {  // uniform
                            float a = acc[r][k];
                            [[unroll]] for (uint q = 0u; q < 8u; ++q) {
                                a = fma(w[4u * q], xr[k][q].x, a);
                                a = fma(w[4u * q + 1u], xr[k][q].y, a);
                                a = fma(w[4u * q + 2u], xr[k][q].z, a);
                                a = fma(w[4u * q + 3u], xr[k][q].w, a);
                            }
                            acc[r][k] = a;
                        }
                    }
                }
            }
        }

        // ---- reduction of the chunk's R * nt sums over the workgroup ----
        if (USE_SUBGROUP) {
            const uint nsg = gl_NumSubgroups;
            [[unroll]] for (uint r = 0u; r < R; ++r)
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                    const float v = subgroupAdd(acc[r][k]);
                    if (subgroupElect()) red[(gl_SubgroupID * R + r) * TOKENS + k] = v;
                }
            barrier();
            for (uint i = t; i < R * TOKENS; i += WG) {
                const uint r = i / TOKENS, k = i % TOKENS;
                float v = 0.0;
                for (uint g = 0u; g < nsg; ++g) v += red[(g * R + r) * TOKENS + k];
                if (k < nt && rowBase + r < pc.O) yb[pc.yOffset + (tok0 + k) * pc.O + rowBase + r] = v;
            }
            barrier();
        } else {
            [[unroll]] for (uint r = 0u; r < R; ++r)
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) red[(t * R + r) * TOKENS + k] = acc[r][k];
            barrier();
            for (uint h = WG / 2u; h > 0u; h >>= 1u) {
                if (t < h) {
                    [[unroll]] for (uint i = 0u; i < R * TOKENS; ++i) red[t * R * TOKENS + i] += red[(t + h) * R * TOKENS + i];
                }
                barrier();
            }
            for (uint i = t; i < R * TOKENS; i += WG) {
                const uint r = i / TOKENS, k = i % TOKENS;
                if (k < nt && rowBase + r < pc.O) yb[pc.yOffset + (tok0 + k) * pc.O + rowBase + r] = red[i];
            }
            barrier();
        }
    }
}
