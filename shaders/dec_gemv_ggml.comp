#version 450
// dec_gemv_ggml: y[s, o] = sum_i W[o, i] * x[s, i] for S = 1..64 tokens, W a [O][I] tensor of a GGML
// block type (FORMAT: Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, ggml_blocks.glsl's GGML_FMT_*) in the GGUF
// file's own layout from byte blockOffset; x f32 [S][I] at xOffset, y f32 [S][O] at yOffset; float
// path: each weight formed exactly as GGML's dequantize_row_* forms it (ggml_blocks.glsl), then
// multiplied by x with f32 accumulation (fma).
//
// Laid out for bandwidth, as llama.cpp's mul_mat_vec shaders are: the format is a specialization
// constant (one pipeline per type, no per-weight branch on it); one workgroup per ROWS_PER_WG rows;
// lane t takes the slices t, t + WG, ... of every row of its workgroup (ggml_blocks.glsl: 32 weights
// from 16 consecutive quant bytes, its scales decoded once), so consecutive lanes read consecutive
// 16-byte words of a row and no byte is read twice. x is read from global memory (L1/L2-resident:
// every workgroup reads the same x) into registers once per slice and reused for all R rows; no
// shared-memory staging, so the column loop has no barrier. Tokens in chunks of TOKENS: a slice is
// dequantized once per row per chunk and dotted with each token of the chunk. Then subgroupAdd and
// shared memory across subgroups (or a shared tree). Shared memory: WG * R * TOKENS * 4 bytes.
// FACTORED (off by default): per run, d * sum((q - off) x) + m * sum(x) instead of sum(w x) with each
// weight w = q*d + m formed first: one f32 op a weight fewer (the float path is issue-bound on the
// H200 at ~5 ops a weight), the same products d*sc and dmin*m, and one-hot inputs still give GGML's
// weights bit for bit (d*q is exact, so d*q + m rounds once either way); other x round differently
// at the f32 level (not GGML's weights times x, summed). sum(x) of a run is formed once per token
// for all R rows.
// Rows past O read row O-1 (not stored). blockOffset: a multiple of 16 for Q4_K/Q5_K, 4 for
// Q4_1/Q5_1, 2 for Q5_0/Q6_K; 4 readable bytes past the last block (ggml_blocks.glsl). x is read
// as vec4 only (xOffset % 4 == 0; I is a multiple of 32): a scalar variant doubled the unrolled
// code, and with it the pipeline's compile time on Lavapipe (LLVM), for offsets no caller uses.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 32, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS_PER_WG = 4u;
layout(constant_id = 2) const bool USE_SUBGROUP = true;
layout(constant_id = 3) const uint FORMAT = 3u;  // GGML_FMT_*
layout(constant_id = 4) const uint TOKENS = 1u;  // tokens per register chunk, 1..8
layout(constant_id = 5) const bool FACTORED = false;
layout(constant_id = 6) const uint SLICES_PER_LANE = 1u;  // consecutive slices a lane takes a step, 1 or 2

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
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT) / 4u;  // vec4s from a slice's first run to its second
const bool HAS_MIN = FORMAT == GGML_FMT_Q4_1 || FORMAT == GGML_FMT_Q5_1 || FORMAT == GGML_FMT_Q4_K || FORMAT == GGML_FMT_Q5_K;

shared float red[WG * R * TOKENS];
float acc[R][TOKENS];
vec4 xr[TOKENS][8];
vec2 xsumr[TOKENS];  // FACTORED with a min: sum of x over each run

void main() {
    const uint block = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint rowBase = block * R;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform
    const uint t = gl_LocalInvocationIndex;
    const uint I = pc.I;
    const uint slices = I >> 5u;
    const uint rowBytes = (I / BLOCK_ELEMENTS) * BLOCK_BYTES;

    uint rowAddr[R];
    [[unroll]] for (uint r = 0u; r < R; ++r) rowAddr[r] = pc.blockOffset + min(rowBase + r, pc.O - 1u) * rowBytes;

    for (uint tok0 = 0u; tok0 < pc.S; tok0 += TOKENS) {
        const uint nt = min(TOKENS, pc.S - tok0);
        [[unroll]] for (uint r = 0u; r < R; ++r)
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[r][k] = 0.0;

        for (uint u0 = t * SLICES_PER_LANE; u0 < slices; u0 += WG * SLICES_PER_LANE) {
            [[unroll]] for (uint p = 0u; p < SLICES_PER_LANE; ++p) {
                const uint u = u0 + p;
                if (SLICES_PER_BLOCK == 1u && p > 0u && u >= slices) break;  // 32-element blocks: an odd slice count
                const uint blk = u / SLICES_PER_BLOCK, s = u % SLICES_PER_BLOCK;
                const uint col = blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s);
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                    if (k < nt) {  // uniform
                        const uint xa = (pc.xOffset + (tok0 + k) * I + col) >> 2u;
                        [[unroll]] for (uint q = 0u; q < 4u; ++q) {
                            xr[k][q] = xv[xa + q];
                            xr[k][4u + q] = xv[xa + GAP + q];
                        }
                        if (FACTORED && HAS_MIN) {
                            vec4 s0 = (xr[k][0] + xr[k][1]) + (xr[k][2] + xr[k][3]), s1 = (xr[k][4] + xr[k][5]) + (xr[k][6] + xr[k][7]);
                            xsumr[k] = vec2((s0.x + s0.y) + (s0.z + s0.w), (s1.x + s1.y) + (s1.z + s1.w));
                        }
                    }
                }
                [[unroll]] for (uint r = 0u; r < R; ++r) {
                    uvec4 q0, q1;
                    vec2 d, m;
                    ggml_slice(FORMAT, rowAddr[r] + blk * BLOCK_BYTES, s, q0, q1, d, m);
                    float w[32];
                    if (FACTORED) {
                        ggml_slice_quants(FORMAT, q0, q1, w);
                        [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                            if (k < nt) {  // uniform
                                float a = acc[r][k];
                                [[unroll]] for (uint run = 0u; run < 2u; ++run) {
                                    float even = 0.0, odd = 0.0;  // odd: quants read at bit 8 (x 256)
                                    [[unroll]] for (uint q = 0u; q < 4u; ++q) {
                                        const vec4 xq4 = xr[k][4u * run + q];
                                        even = fma(w[16u * run + 4u * q], xq4.x, even);
                                        odd = fma(w[16u * run + 4u * q + 1u], xq4.y, odd);
                                        even = fma(w[16u * run + 4u * q + 2u], xq4.z, even);
                                        odd = fma(w[16u * run + 4u * q + 3u], xq4.w, odd);
                                    }
                                    a = fma(d[run], fma(odd, 1.0 / 256.0, even), a);
                                    if (HAS_MIN) a = fma(m[run], xsumr[k][run], a);
                                }
                                acc[r][k] = a;
                            }
                        }
                        continue;
                    }
                    ggml_slice_weights(FORMAT, q0, q1, d, m, w);
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
