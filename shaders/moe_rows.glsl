// moe_rows.glsl: the grouped MoE GEMVs of a prompt chunk on the q4/q8 expert pool (work items
// grouped by expert by dec_group_experts, a few to tens of slots each), with a row per lane; the
// GGML-block counterpart is moe_ggml_rows.comp. The including .comp defines:
//   QBITS          4 or 8
//   GATEUP         h[slot][row] = silu(gate_row x) * (up_row x)   (gate and up stored by rows), or
//   COLUMN_BLOCKS  down: ypair[slot][row] = slotWeight[slot] * (down_row h[slot])
//                  (stored by column blocks, pool/expert-layout.ts: uvec4 (row, c) at c * O + row)
//   ADDR_BDA       (optional) experts located by device address, else (slab, offset)
// Bindings, push constants, work list and outputs are moe.glsl's float path, so the same
// descriptor sets fit (on the integer-dot path the host binds the float x at 0: no quantize_act).
//
// Why: gemv_float.glsl's grouped kernels spread a row's columns over the lanes and reduce every
// row's sums across them per chunk of slots, which suits few slots an item; at a prompt chunk's
// 2..20 slots an item the reductions and barriers dominate. Here lane t owns row rowBase + t whole:
// it walks the row's 16-byte steps (32 q4 / 16 q8 columns), dequantizes each weight once (both
// matrices for gate+up) and multiplies it with the chunk's TOKENS slots. No reduction, no barrier,
// no shared memory; the x / h values every lane reads are the same address (a broadcast). Down's
// column blocks make the lanes' weight loads contiguous; gate/up rows are rowWords apart, so a
// lane's 16-byte loads use their cache line over the next steps.
//
// Weights: q exactly, as q/16 (q4) or q/256 (q8), from the mantissa of 1.0 as gemv_float.glsl
// unpacks them (no int->float conversion); f32 fma per column into the step's sum, which is then
// scaled by its group's scale (x 16 or 256, exact) and added to the slot's accumulator.
//
// Workgroup (x, y) = (64 rows, work item y). Rows past O read row O-1 and are not stored.
#extension GL_EXT_control_flow_attributes : require

#if QBITS == 4
const uint COLS_PER_VEC = 32u;   // one uvec4 = 4 words = 32 q4 columns
const float STEP_UNIT = 16.0;    // weights below are q / 16
#elif QBITS == 8
const uint COLS_PER_VEC = 16u;   // one uvec4 = 16 q8 columns
const float STEP_UNIT = 256.0;   // weights below are q / 256
#else
#error "QBITS must be 4 or 8"
#endif

#ifdef GATEUP
const uint NMAT = 2u;
#elif defined(COLUMN_BLOCKS)
const uint NMAT = 1u;
#else
#error "define GATEUP (gate+up) or COLUMN_BLOCKS (down)"
#endif

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 3) const bool SCALE_F16 = false;
layout(constant_id = 4) const uint GROUP_SIZE = 32u;
layout(constant_id = 7) const uint TOKENS = 8u;  // slots per register chunk, 1..8

#include "moe.glsl"

// common.glsl's siluGate (not included: it brings the cross-lane reduction's shared memory).
float siluGate(float gv, float uv, float limit) {
    if (limit > 0.0) {
        gv = min(gv, limit);
        uv = clamp(uv, -limit, limit);
    }
    return gv / (1.0 + exp(-gv)) * uv;
}

// The nibble at bit b of w, u = q + 8, as q / 16 exactly: u goes to mantissa bits 19..22 of 1.0
// (f = 1 + u/16) and f - 1.5 = (u - 8) / 16 is exact (Sterbenz). b is a constant after unrolling.
float q4Weight(uint w, uint b) {
    const uint m = (b <= 19u) ? (w << (19u - b)) : (w >> (b - 19u));
    return uintBitsToFloat((m & 0x00780000u) | 0x3F800000u) - 1.5;
}
// The int8 at bit b of w as q / 256 exactly: its byte to mantissa bits 15..22, the xor flips the
// top bit (q + 128) and sets 1.0's exponent, f = 1 + (q + 128)/256, f - 1.5 = q / 256.
float q8Weight(uint w, uint b) {
    const uint m = (b <= 15u) ? (w << (15u - b)) : (w >> (b - 15u));
    return uintBitsToFloat((m & 0x007F8000u) ^ 0x3FC00000u) - 1.5;
}

// x load modes of one step (gemv_float.glsl's)
const uint XM_VEC4 = 0u;    // full step, input rows 16-byte aligned: vec4 loads
const uint XM_SCALAR = 1u;  // full step, unaligned rows: scalar loads
const uint XM_TAIL = 2u;    // last, partial step: scalar loads, 0 past the row's end

// 4 inputs of the row starting at float xb, columns col..col+3 (col a multiple of 4).
vec4 loadX4(uint mode, uint xb, uint col) {
    const uint i = xb + col;
    if (mode == XM_VEC4) return X_VEC4(i >> 2u);
    if (mode == XM_SCALAR) return vec4(X_SCALAR(i), X_SCALAR(i + 1u), X_SCALAR(i + 2u), X_SCALAR(i + 3u));
    vec4 v;
    [[unroll]] for (uint k = 0u; k < 4u; ++k) v[k] = (col + k < pc.I) ? X_SCALAR(i + k) : 0.0;
    return v;
}

uint wAt[NMAT];  // uvec4 index of the lane's row's step 0, per matrix
uint wStride;    // uvec4s from one step of the row to the next
uint sAt;        // scale index of the row's group 0
uint sStride;    // scale indices from one group to the next
uint xrow[TOKENS];          // first float of each slot's input row (the chunk's last one repeated)
float acc[NMAT][TOKENS];    // the lane's row's sums, per matrix and slot of the chunk
uint nt;                    // slots in the chunk

// Step c (columns c * COLS_PER_VEC ..) of the lane's row(s) for the chunk's slots.
void colStep(uint c, uint mode) {
    const uint g = (c * COLS_PER_VEC) / GROUP_SIZE;  // a step never straddles a group
    float w[NMAT][COLS_PER_VEC];
    float sc[NMAT];
    [[unroll]] for (uint m = 0u; m < NMAT; ++m) {
        const uvec4 q = BLOB_V(wAt[m] + c * wStride);
        sc[m] = BLOB_SCALE(m == 0u ? pc.gateScaleOffset : pc.upScaleOffset, sAt + g * sStride) * STEP_UNIT;
        [[unroll]] for (uint wi = 0u; wi < 4u; ++wi) {
#if QBITS == 4
            // word wi: columns 8wi + j in byte j's low nibble, 8wi + 4 + j in its high nibble
            [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                w[m][8u * wi + j] = q4Weight(q[wi], 8u * j);
                w[m][8u * wi + 4u + j] = q4Weight(q[wi], 8u * j + 4u);
            }
#else
            [[unroll]] for (uint j = 0u; j < 4u; ++j) w[m][4u * wi + j] = q8Weight(q[wi], 8u * j);
#endif
        }
    }
    [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
        if (k < nt) {  // uniform
            float p[NMAT];
            [[unroll]] for (uint m = 0u; m < NMAT; ++m) p[m] = 0.0;
            [[unroll]] for (uint v = 0u; v < COLS_PER_VEC / 4u; ++v) {
                const vec4 a = loadX4(mode, xrow[k], c * COLS_PER_VEC + 4u * v);
                [[unroll]] for (uint m = 0u; m < NMAT; ++m) {
                    p[m] = fma(w[m][4u * v], a.x, p[m]);
                    p[m] = fma(w[m][4u * v + 1u], a.y, p[m]);
                    p[m] = fma(w[m][4u * v + 2u], a.z, p[m]);
                    p[m] = fma(w[m][4u * v + 3u], a.w, p[m]);
                }
            }
            [[unroll]] for (uint m = 0u; m < NMAT; ++m) acc[m][k] = fma(sc[m], p[m], acc[m][k]);
        }
    }
}

void main() {
    if (!moeBegin()) return;  // an item past the end of this call's list: uniform
    const uint rowBase = gl_WorkGroupID.x * gl_WorkGroupSize.x;
    if (rowBase >= pc.O) return;  // uniform
    const uint row = rowBase + gl_LocalInvocationIndex;
    const uint r = min(row, pc.O - 1u);
#ifdef GATEUP
    wAt[0] = pc.gateWeightOffset + r * (pc.rowWords >> 2u);
    wAt[NMAT - 1u] = pc.upWeightOffset + r * (pc.rowWords >> 2u);
    wStride = 1u;
    sAt = r * pc.groupsPerRow;
    sStride = 1u;
#else
    wAt[0] = pc.gateWeightOffset + r;
    wStride = pc.O;
    sAt = r;
    sStride = pc.O;
#endif
    const uint nFull = pc.I / COLS_PER_VEC;  // steps with every column < I
    const bool hasTail = nFull * COLS_PER_VEC < pc.I;
    const bool aligned = xAligned();
    for (uint p0 = 0u; p0 < pairCount; p0 += TOKENS) {
        nt = min(TOKENS, pairCount - p0);
        [[unroll]] for (uint k = 0u; k < TOKENS; ++k) xrow[k] = xRow(p0 + min(k, nt - 1u));
        [[unroll]] for (uint m = 0u; m < NMAT; ++m) [[unroll]] for (uint k = 0u; k < TOKENS; ++k) acc[m][k] = 0.0;
        if (aligned) {
            for (uint c = 0u; c < nFull; ++c) colStep(c, XM_VEC4);
        } else {
            for (uint c = 0u; c < nFull; ++c) colStep(c, XM_SCALAR);
        }
        if (hasTail) colStep(nFull, XM_TAIL);
        if (row < pc.O) {
            [[unroll]] for (uint k = 0u; k < TOKENS; ++k) {
                if (k < nt) {
#ifdef GATEUP
                    storeOut(p0 + k, row, siluGate(acc[0][k], acc[NMAT - 1u][k], pc.limit));
#else
                    storeOut(p0 + k, row, acc[0][k]);
#endif
                }
            }
        }
    }
}
