// moe.glsl: bindings and addressing of the grouped MoE GEMVs, included by gemv_float.glsl and
// gemv_idp.glsl when MOE is defined. One dispatch covers every (token, expert) pair of a layer call:
//   workgroup (x, y) = (block of ROWS_PER_WG rows, work item u = one distinct expert);
//   the item's tokens are gathered through `pairs`, so each expert's weights are read once.
// GATEUP: h[slot][row] = silu(x[token]·gate) * (x[token]·up), token = slot / slotsPerToken.
// SHARED_SLOT (with FUSED; moe_fused_shared_*): the grid has one slot a token more than the router
//   gave, the layer's shared expert (its blob at pc.sharedExpertLo/Hi, same layout as a routed expert's),
//   weighted by sigmoid(x[token] . its shared_expert_gate row), computed by each of its workgroups.
// FUSED (calls of few tokens, one dispatch): workgroup (x, y, z) = (block of ROWS_PER_WG rows of I,
//   slot j of token z; slot = z * slotsPerToken + j): h of the block's rows for the slot's expert (gate+up, kept in shared memory), then the
//   block's columns of down times h, added to yacc[token] with float atomics (split over I); the
//   last workgroup moves yacc to y, zeroes it for the next call and writes the completion word.
//   Each slot's expert is located through slotExpert (the work list's (a, b) of its item).
// else (down): ypair[slot][row] = slotWeight[slot] * (h[slot]·down).
// Work list (binding 1, uvec4): [0] = (S, slotsPerToken, items, call sequence number);
//   [1 + u] = (a, b, pairStart, pairCount) with (a, b) = the expert blob's device address
//   (lo, hi) under ADDR_BDA, else (slab index, blob offset in uvec4 units).
// Blob-relative offsets of the matrices come as push constants (same for every expert).
#extension GL_EXT_control_flow_attributes : require

#if !defined(MOE_IDP) || defined(FUSED)
// x (gate+up, fused) or h (down). The grouped integer-dot gate+up declares its own binding 0 (xq)
// and 5, 6 (xscale, xsum).
layout(std430, binding = 0) readonly restrict buffer XS { float xs[]; };
layout(std430, binding = 0) readonly restrict buffer XV { vec4 xv[]; };
#endif
#ifdef FUSED
// PRELAUNCHED: the kernel is submitted before its call's inputs are written and waits for the
// host's doorbell (moe_fused.glsl), so it reads its inputs through coherent declarations: from a
// readonly restrict buffer a compiler may load before the wait (Lavapipe does). The weights need
// none: their addresses come from slotExpert.
layout(constant_id = 10) const bool PRELAUNCHED = false;
layout(std430, binding = 0) coherent readonly buffer XSC { float xsCoherent[]; };
layout(std430, binding = 0) coherent readonly buffer XVC { vec4 xvCoherent[]; };
#define X_SCALAR(i) (PRELAUNCHED ? xsCoherent[i] : xs[i])
#define X_VEC4(i) (PRELAUNCHED ? xvCoherent[i] : xv[i])
layout(std430, binding = 1) coherent readonly buffer WK { uvec4 work[]; };
layout(std430, binding = 2) coherent readonly buffer SE { uvec2 slotExpert[]; };
#else
#define X_SCALAR(i) xs[i]
#define X_VEC4(i) xv[i]
layout(std430, binding = 1) readonly restrict buffer WK { uvec4 work[]; };
layout(std430, binding = 2) readonly restrict buffer PR { uint pairs[]; };
#endif
layout(std430, binding = 3) writeonly restrict buffer YB { float yb[]; };
#ifdef FUSED
layout(std430, binding = 4) coherent readonly buffer SW { float slotWeight[]; };
#else
layout(std430, binding = 4) readonly restrict buffer SW { float slotWeight[]; };
#endif
#ifdef FUSED
// The call's sequence number (work header .w), written by the last workgroup to finish: a hint
// the host may poll instead of sleeping in the driver; it still waits on the fence before reading y.
layout(std430, binding = 5) writeonly restrict buffer DN { uint done[]; };
// Workgroups finished this call; the last one sets it back to 0 for the next call.
layout(std430, binding = 6) coherent restrict buffer AR { uint arrived[]; };
#endif
#ifdef FUSED
#extension GL_EXT_shader_atomic_float : require
// The call's per-token sums, added to with float atomics; 0 between calls (the last workgroup
// moves them to y and zeroes them).
layout(std430, binding = 7) coherent restrict buffer AC { float yacc[]; };
// A pre-launched call (PRELAUNCHED): [0] = the sequence number it serves, [1] = the doorbell, which
// the host sets to that number once the inputs are written (or to GATE_CANCEL). Host-written while
// the kernel runs: volatile.
layout(std430, binding = 8) coherent volatile readonly buffer GT { uint gate[]; };
#define MOE_SLAB_BINDING 9
#ifdef SHARED_SLOT
#ifndef ADDR_BDA
#error "SHARED_SLOT: the shared expert's blob is located by its device address (ADDR_BDA)"
#endif
// The layers' shared_expert_gate rows (D floats each; this call's at pc.sharedGateOffset).
layout(std430, binding = 9) readonly restrict buffer SGV { float sharedGateRow[]; };
#endif
#elif defined(MOE_IDP)
#define MOE_SLAB_BINDING 7
#else
#define MOE_SLAB_BINDING 5
#endif
layout(push_constant, std430) uniform PC {
    uint O;                 // rows: I for gate+up, D for down
    uint I;                 // cols: D for gate+up, I for down
    uint rowWords;
    uint groupsPerRow;
    uint gateWeightOffset;  // blob-relative, uvec4 units (down: the down matrix)
    uint gateScaleOffset;   // blob-relative, words
    uint upWeightOffset;
    uint upScaleOffset;
    float limit;            // <= 0: none
#ifdef FUSED
    uint downRowWords;      // the down matrix (D rows of I columns): O above is I, I is D
    uint downGroupsPerRow;
    uint downWeightOffset;  // blob-relative, uvec4 units
    uint downScaleOffset;   // blob-relative, words
#endif
#ifdef SHARED_SLOT
    uint sharedExpertLo;    // the shared expert's blob (device address lo, hi; not a uvec2: that
    uint sharedExpertHi;    // would be 8-aligned, a gap after word 12): the grid's last slot
    uint sharedGateOffset;  // floats: its shared_expert_gate row in sharedGateRow
#endif
} pc;

#ifdef ADDR_BDA
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
layout(buffer_reference, std430, buffer_reference_align = 16) readonly restrict buffer BlobV { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly restrict buffer BlobW { uint v[]; };
BlobV blobV;
BlobW blobW;
#define BLOB_V(i) blobV.v[i]
#define BLOB_W(i) blobW.v[i]
#else
// Slabs bound as an array; the index must be uniform across the workgroup (one expert per
// workgroup: one expert per workgroup in every kernel).
layout(constant_id = 8) const uint MAX_SLABS = 8u;
layout(std430, binding = MOE_SLAB_BINDING) readonly restrict buffer Slab { uvec4 v[]; } slabs[MAX_SLABS];
uint slabIndex;
uint blobBase;  // uvec4 units
#define BLOB_V(i) slabs[slabIndex].v[blobBase + (i)]
#define BLOB_W(i) (slabs[slabIndex].v[blobBase + ((i) >> 2u)][(i) & 3u])
#endif

#define W_GATE(i) BLOB_V(i)
#define W_UP(i) BLOB_V(i)
#define BLOB_SCALE(off, k) (SCALE_F16 ? unpackHalf2x16(BLOB_W((off) + ((k) >> 1u)))[(k) & 1u] : uintBitsToFloat(BLOB_W((off) + (k))))
#define S_GATE(k) BLOB_SCALE(pc.gateScaleOffset, k)
#define S_UP(k) BLOB_SCALE(pc.upScaleOffset, k)

uint pairStart;
uint pairCount;
uint slotsPerToken;

// Points the blob macros at one expert: (lo, hi) device address, or (slab index, offset).
void setBlob(uvec2 e) {
#ifdef ADDR_BDA
    blobV = BlobV(e);
    blobW = BlobW(e);
#else
    slabIndex = e.x;
    blobBase = e.y;
#endif
}

// Reads this workgroup's work item; false when the item is past the end of the list.
bool moeBegin() {
    const uvec4 header = work[0];
    const uint u = gl_WorkGroupID.y;
    if (u >= header.z) return false;
    const uvec4 item = work[1u + u];
    slotsPerToken = header.y;
    pairStart = item.z;
    pairCount = item.w;
    setBlob(item.xy);
    return true;
}

uint rowBlock() { return gl_WorkGroupID.x; }
uint tokenCount() { return pairCount; }
bool xAligned() { return (pc.I & 3u) == 0u; }
// The input row of the item's tok-th pair: the token (gate+up reads x) or the slot (down reads h).
uint tokenOf(uint tok) {
#if defined(FUSED)
    return tok;  // already the token
#elif defined(GATEUP)
    return pairs[pairStart + tok] / slotsPerToken;
#else
    return pairs[pairStart + tok];
#endif
}
uint xRow(uint tok) { return tokenOf(tok) * pc.I; }
#ifdef FUSED
shared float hs[ROWS_PER_WG];  // h of the workgroup's block of rows (0 past I)
uint blockBase;                // first row of the block
#endif
void storeOut(uint tok, uint row, float v) {
#if defined(FUSED)
    hs[row - blockBase] = v;
#elif defined(GATEUP)
    yb[pairs[pairStart + tok] * pc.O + row] = v;
#else
    const uint slot = pairs[pairStart + tok];
    yb[slot * pc.O + row] = slotWeight[slot] * v;
#endif
}

#ifdef FUSED
shared bool lastToArrive;
// Called by every thread once its workgroup's atomics are issued: the last workgroup of the grid
// moves the S tokens' sums from yacc to y (zeroing yacc), resets the arrival count and the
// pre-launch decision, and writes the completion word `seq`: done[0] for a call that ran, done[1]
// for a pre-launched one that stopped without running (expired or cancelled; yacc untouched).
void arriveFused(uint seq, uint S, bool ran) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        const uint groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z;
        lastToArrive = atomicAdd(arrived[0], 1u) == groups - 1u;
    }
    barrier();
    if (!lastToArrive) return;  // uniform
    memoryBarrierBuffer();
    const uint n = ran ? S * pc.I : 0u;
    // Plain loads (coherent: from L2, where the atomics landed), all in flight at once; then y
    // and the zeroes for the next call.
    const uint WGS = gl_WorkGroupSize.x;
    for (uint base = gl_LocalInvocationIndex; base < n; base += 8u * WGS) {
        float v[8];
        [[unroll]] for (uint k = 0u; k < 8u; ++k) { const uint i = base + k * WGS; v[k] = i < n ? yacc[i] : 0.0; }
        [[unroll]] for (uint k = 0u; k < 8u; ++k) {
            const uint i = base + k * WGS;
            if (i < n) { yb[i] = v[k]; yacc[i] = 0.0; }
        }
    }
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        arrived[0] = 0u;
        arrived[1] = 0u;
        done[ran ? 0 : 1] = seq;
    }
}
#endif
