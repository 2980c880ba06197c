// moe_pool_cm.glsl: the body of moe_pool_{bda,desc}_cm.comp and their test variants (CM_EMULATE).
// moe_pool_cm: moe_rows.glsl (a prompt chunk's experts, lists grouped by expert, on the q4/q8 expert
// pool) on the matrix cores. Why: the rows kernels pay every product on the ALUs and dequantize an
// expert's weights once per few slots; here a workgroup dequantizes a weight step once for BN slots
// and the products are the matrix cores'.
//
// A workgroup: cm_slice_tile.glsl's tile (128 weight rows x BN slots, 32 columns a step), walking
// its work item BN slots at a time (cm_expert_item.glsl). GATEUP: the tile's rows are 64 gate rows
// then the same 64 up rows (one pass gives both, and the epilogue forms the SwiGLU with moe_rows'
// optional clamp), so a workgroup owns 64 output rows; down: 128 output rows. Each thread
// dequantizes its row's 32 columns a step: q times its group's scale (gate/up stored by rows, down
// by column blocks: pool/expert-layout.ts), 0 past the row's end. Bindings, push constants, work list and outputs are moe_rows.glsl's
// (moe.glsl's float path), so the same descriptor sets fit; grid (row tiles, work items).
#extension GL_GOOGLE_include_directive : require
#include "cm_extensions.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 1) const bool GATEUP = true;
layout(constant_id = 2) const uint QBITS = 4u;        // 4 or 8
layout(constant_id = 3) const bool SCALE_F16 = false;
layout(constant_id = 4) const uint GROUP_SIZE = 32u;  // 32, 64 or 128
layout(constant_id = 5) const uint BN = 8u;           // slots a tile: 8, 16, 32 or 64

#include "moe.glsl"
#include "cm_slice_tile.glsl"


// moe_rows.glsl's SwiGLU with the optional clamp
float cmSwiGLU(float gv, float uv) {
    if (pc.limit > 0.0) {
        gv = min(gv, pc.limit);
        uv = clamp(uv, -pc.limit, pc.limit);
    }
    return gv / (1.0 + exp(-gv)) * uv;
}

// This thread's row: its first uvec4 (gate/up rows: step u's at wAt + u * QBITS / 4; down's column
// blocks: at wAt + block * O), its scales (index sAt + group * sStride), and the step's loads.
uint wAt;
uint scaleOffset;
uint sAt;
uint sStride;
uvec4 nextQ[2];
float nextScale;
uint nextK0;
uint slotRow[X_PER_THREAD];
#include "cm_expert_item.glsl"

void tileLoadW(uint u) {
    const uint k0 = u * BK;
    nextK0 = k0;
    nextScale = BLOB_SCALE(scaleOffset, sAt + (k0 / GROUP_SIZE) * sStride);
    // a q4 uvec4 is 32 columns, a q8 one 16: a q8 step reads two (the second past a row of I <= 16 more columns is not read)
    [[unroll]] for (uint i = 0u; i < QBITS / 4u; i++) {
        const uint block = u * (QBITS / 4u) + i;
        nextQ[i] = block * (QBITS == 4u ? 32u : 16u) < pc.I ? BLOB_V(GATEUP ? wAt + block : wAt + block * pc.O) : uvec4(0u);
    }
}

void tileWeights(out float w[32]) {
    float q[32];
    if (QBITS == 4u) {
        // word wi: columns 8wi + j in byte j's low nibble, 8wi + 4 + j in its high nibble
        [[unroll]] for (uint wi = 0u; wi < 4u; wi++) [[unroll]] for (uint j = 0u; j < 4u; j++) {
            q[8u * wi + j] = float(int((nextQ[0][wi] >> (8u * j)) & 15u) - 8);
            q[8u * wi + 4u + j] = float(int((nextQ[0][wi] >> (8u * j + 4u)) & 15u) - 8);
        }
    } else {
        [[unroll]] for (uint i = 0u; i < 2u; i++) [[unroll]] for (uint wi = 0u; wi < 4u; wi++) [[unroll]] for (uint j = 0u; j < 4u; j++) {
            q[16u * i + 4u * wi + j] = float(bitfieldExtract(int(nextQ[i][wi]), int(8u * j), 8));
        }
    }
    const bool tail = nextK0 + BK > pc.I;  // the padding past I may hold any quants
    [[unroll]] for (uint k = 0u; k < 32u; k++) w[k] = tail && nextK0 + k >= pc.I ? 0.0 : nextScale * q[k];
}

uint tileXCol(uint u, uint v) { return u * BK + 4u * v; }

vec4 tileLoadX(uint m, uint col) {
    if (slotRow[m] == NO_SLOT) return vec4(0.0);
    const uint i = slotRow[m] + col;
    if ((pc.I & 3u) == 0u && col + 4u <= pc.I) return xv[i >> 2u];
    vec4 v;
    [[unroll]] for (uint k = 0u; k < 4u; k++) v[k] = col + k < pc.I ? xs[i + k] : 0.0;
    return v;
}

void main() {
    const uint t = gl_LocalInvocationIndex;
    const uvec4 header = work[0];
    if (gl_WorkGroupID.y >= header.z) return;  // uniform: an item past the end of this call's list
    const uvec4 item = work[1u + gl_WorkGroupID.y];
    setBlob(item.xy);
    const uint K = header.y;
    const uint rowBase = gl_WorkGroupID.x * OUT_ROWS;
    if (rowBase >= pc.O) return;  // uniform
    // this thread's weight row: GATEUP threads 0..63 the gate rows, 64..127 the up rows
    const uint r = min(rowBase + (GATEUP ? t % 64u : t), pc.O - 1u);
    const bool up = GATEUP && t >= 64u;
    if (GATEUP) {
        wAt = (up ? pc.upWeightOffset : pc.gateWeightOffset) + r * (pc.rowWords >> 2u);
        scaleOffset = up ? pc.upScaleOffset : pc.gateScaleOffset;
        sAt = r * pc.groupsPerRow;
        sStride = 1u;
    } else {
        wAt = pc.gateWeightOffset + r;  // down: column blocks, block c of row r at c * O + r
        scaleOffset = pc.gateScaleOffset;
        sAt = r;
        sStride = pc.O;
    }
    const uint steps = (pc.I + BK - 1u) / BK;
    cmExpertItem(item, K, rowBase, pc.O, pc.I, steps);
}
