#version 450
// dec_gemv_ggml_idp: the integer-dot path of dec_gemv_ggml. y[s, o] = sum_i W[o, i] * x[s, i], W a
// GGML block tensor (FORMAT, GGML_FMT_*) in the file's own layout from byte blockOffset, x given as
// quantize_act's output with GROUP_SIZE 16: int8 xq [S][I] (row pitch I/4 words), a power-of-two
// f32 scale and the int sum of the q per 16 columns (xscale, xsum [S][I/16]); y f32 [S][O] at yOffset.
//
// Groups of 16, not q8_1's 32: every run of a slice (ggml_blocks.glsl: 16 columns with one weight
// scale and min) is then one x group with its own scale and sum, which the mins need; Q6_K's own
// scales cover 16 columns. Per run: dot = sum q_w * q_x over 4 OpSUDot (signed x, unsigned weight
// bytes, exact int32), then y += xs * (d * (dot - off * xsum) + m * xsum) in f32, d, m and off the
// run's weight scale, min and offset (ggml_slice). Layout as dec_gemv_ggml: lane t takes slices
// t, t + WG, ... of the workgroup's R rows, the x words of a slice loaded once for all R rows.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 32, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS_PER_WG = 4u;
layout(constant_id = 2) const bool USE_SUBGROUP = true;
layout(constant_id = 3) const uint FORMAT = 3u;  // GGML_FMT_*
layout(constant_id = 4) const uint TOKENS = 1u;  // tokens per register chunk, 1..8
layout(constant_id = 5) const uint SLICES_PER_LANE = 1u;  // consecutive slices a lane takes a step, 1 or 2

const uint WG = gl_WorkGroupSize.x;
const uint R = ROWS_PER_WG;

// OpSUDot (SPV_KHR_integer_dot_product) as gemv_idp.glsl declares it: capabilities DotProduct
// (6019), DotProductInput4x8BitPacked (6018); last operand PackedVectorFormat4x8Bit (0).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4x8(uint a, uint b, spirv_literal int packedFormat);  // signed a x unsigned b

layout(std430, binding = 0) readonly restrict buffer WB { uint wb[]; };
layout(std430, binding = 0) readonly restrict buffer WV { uvec4 wv[]; };
layout(std430, binding = 1) readonly restrict buffer XQ { uvec4 xq[]; };
layout(std430, binding = 2) readonly restrict buffer XSC { float xscale[]; };
layout(std430, binding = 3) readonly restrict buffer XSU { int xsum[]; };
layout(std430, binding = 4) writeonly restrict buffer YB { float yb[]; };

layout(push_constant, std430) uniform PC {
    uint O;
    uint I;            // a multiple of the block's elements
    uint S;            // 1..64
    uint blockOffset;  // bytes
    uint yOffset;      // floats
} pc;

#define GGML_WORD(i) wb[i]
#define GGML_VEC4(i) wv[i]
#include "ggml_blocks.glsl"

const uint BLOCK_BYTES = GGML_BLOCK_BYTES(FORMAT);
const uint BLOCK_ELEMENTS = GGML_BLOCK_ELEMENTS(FORMAT);
const uint SLICES_PER_BLOCK = BLOCK_ELEMENTS / 32u;
const uint GAP = GGML_SLICE_GAP(FORMAT) / 16u;  // x groups from a slice's first run to its second
const int OFF = int(GGML_SLICE_OFFSET(FORMAT));

shared float red[WG * R * TOKENS];
float acc[R][TOKENS];
uvec4 xa[TOKENS][2];
vec2 xs[TOKENS];
ivec2 xsm[TOKENS];

int dot16(uvec4 a, uvec4 w) {
    return sudot4x8(a.x, w.x, 0) + sudot4x8(a.y, w.y, 0) + sudot4x8(a.z, w.z, 0) + sudot4x8(a.w, w.w, 0);
}

void main() {
    const uint block = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint rowBase = block * R;
    if (rowBase >= pc.O) return;  // whole workgroup: uniform
    const uint t = gl_LocalInvocationIndex;
    const uint I = pc.I;
    const uint slices = I >> 5u;
    const uint groups = I >> 4u;  // x groups a token (also its xq row in uvec4s)
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
                const uint g = (blk * BLOCK_ELEMENTS + ggml_slice_col(FORMAT, s)) >> 4u;
                [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                    if (k < nt) {  // uniform
                        const uint at = (tok0 + k) * groups + g;
                        xa[k][0] = xq[at];
                        xa[k][1] = xq[at + GAP];
                        xs[k] = vec2(xscale[at], xscale[at + GAP]);
                        xsm[k] = ivec2(xsum[at], xsum[at + GAP]);
                    }
                }
                [[unroll]] for (uint r = 0u; r < R; ++r) {
                    uvec4 q0, q1;
                    vec2 d, m;
                    ggml_slice(FORMAT, rowAddr[r] + blk * BLOCK_BYTES, s, q0, q1, d, m);
                    [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                        if (k < nt) {  // uniform
                            const int d0 = dot16(xa[k][0], q0) - OFF * xsm[k].x;
                            const int d1 = dot16(xa[k][1], q1) - OFF * xsm[k].y;
                            float a = acc[r][k];
                            a = fma(xs[k].x, fma(d.x, float(d0), m.x * float(xsm[k].x)), a);
                            a = fma(xs[k].y, fma(d.y, float(d1), m.y * float(xsm[k].y)), a);
                            acc[r][k] = a;
                        }
                    }
                }
            }
        }

        // ---- reduction of the chunk's R * nt sums over the workgroup (as dec_gemv_ggml) ----
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
                for (uint gi = 0u; gi < nsg; ++gi) v += red[(gi * R + r) * TOKENS + k];
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
