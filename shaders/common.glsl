// common.glsl: specialization constants, thread layout and the cross-thread row reduction
// shared by the GEMV shaders of vkmoe.
// Included by gemv_float.glsl and gemv_idp.glsl (GL_GOOGLE_include_directive).
//
// Thread layout of one workgroup (WG threads, ROWS_PER_WG rows):
//   logical thread t = ks * (COL_THREADS * ROW_LANES) + rg * COL_THREADS + cl
//   cl in [0, COL_THREADS): threads that read consecutive uvec4 of the same row,
//   rg in [0, ROW_LANES):   row groups interleaved in one block of COL_THREADS*ROW_LANES threads,
//   ks in [0, KSPLIT):      blocks that split the columns of the same rows.
// Each thread owns RPT = ROWS_PER_WG / ROW_LANES rows (rows rowBase + r*ROW_LANES + rg) and keeps
// their partial sums in registers, so one x value loaded feeds RPT rows.  A row's uvec4
// columns c = ks*COL_THREADS + cl + k*CSTEP, CSTEP = COL_THREADS*KSPLIT.
// Defaults (COL_THREADS = 0 -> WG, ROW_LANES = 1): every thread of the workgroup strides over
// the same ROWS_PER_WG rows.
//
// The SPIR-V declares the GroupNonUniform, ...Arithmetic and ...Shuffle capabilities even when
// USE_SUBGROUP is 0.  For a device without subgroup arithmetic/shuffle in compute, compile with
// -DNO_SUBGROUP_OPS: the shared-memory reduction only, and no subgroup capability at all.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifndef NO_SUBGROUP_OPS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

layout(local_size_x = 128, local_size_x_id = 0) in;

layout(constant_id = 1) const uint ROWS_PER_WG = 4u;
#ifndef NO_SUBGROUP_OPS
layout(constant_id = 2) const bool USE_SUBGROUP = true;
#else
const bool USE_SUBGROUP = false;
#endif
layout(constant_id = 3) const bool SCALE_F16 = false;
layout(constant_id = 4) const uint GROUP_SIZE = 32u;
// Optional layout constants (powers of two; COL_THREADS*ROW_LANES must divide WG and ROW_LANES
// must divide ROWS_PER_WG).  0 for COL_THREADS means WG / ROW_LANES.
layout(constant_id = 5) const uint COL_THREADS_ = 0u;
layout(constant_id = 6) const uint ROW_LANES = 1u;

const uint WG = gl_WorkGroupSize.x;
const uint COL_THREADS = (COL_THREADS_ == 0u) ? (WG / ROW_LANES) : COL_THREADS_;
const uint KSPLIT = WG / (COL_THREADS * ROW_LANES);
const uint CSTEP = COL_THREADS * KSPLIT;
const uint RPT = ROWS_PER_WG / ROW_LANES;

// Logical thread index.  With subgroups, derived from the subgroup ids so that a cluster of
// COL_THREADS (or a whole subgroup) is made of lanes of one subgroup whatever its size.
uint logicalThread() {
#ifndef NO_SUBGROUP_OPS
    if (USE_SUBGROUP) return gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
#endif
    return gl_LocalInvocationIndex;
}

// Workgroup index; the host may split a large grid over y.
uint workgroupIndex() {
    return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}

// Scale k of a matrix whose scales start at word `off` of buffer `buf`.
#define LOAD_SCALE(buf, off, k) \
    (SCALE_F16 ? unpackHalf2x16(buf[(off) + ((k) >> 1u)])[(k) & 1u] : uintBitsToFloat(buf[(off) + (k)]))

// Bit moves of the float path's weight unpacking (gemv_float.glsl's colStep, moe_fused.glsl).
uint shiftTo15(uint w, uint j) {  // bit 8j of w -> bit 15 (so bit 8j+4 -> bit 19)
    return (j == 0u) ? (w << 15u) : (j == 1u) ? (w << 7u) : (j == 2u) ? (w >> 1u) : (w >> 9u);
}
uint shiftTo19(uint w, uint j) {  // bit 8j of w -> bit 19
    return (j == 0u) ? (w << 19u) : (j == 1u) ? (w << 11u) : (j == 2u) ? (w << 3u) : (w >> 5u);
}

// SwiGLU epilogue of the fused gate+up: silu(gate) * up, with the optional clamp (limit <= 0: none).
float siluGate(float gv, float uv, float limit) {
    if (limit > 0.0) {
        gv = min(gv, limit);
        uv = clamp(uv, -limit, limit);
    }
    return gv / (1.0 + exp(-gv)) * uv;
}

// ---- reduction --------------------------------------------------------------------------
// NV values per thread (RPT rows x number of matrices) are summed over the COL_THREADS*KSPLIT
// threads of a row group.  One token per call.  red holds WG*NV floats.
#ifndef NMAT
#error "define NMAT (matrices per step) before including common.glsl"
#endif
const uint NV = RPT * NMAT;
shared float red[WG * NV];
float rv[NV];  // reduction operand / result (module scope: arrays sized by spec constants
               // cannot be passed as function parameters)

// Sums rv over the threads of this thread's row group.  Returns true on the one thread per
// row group that holds the totals in rv; rgOut is its row group.  Must be called by every
// thread of the workgroup in uniform control flow (contains barriers).
bool reduceRows(uint t, out uint rgOut) {
    const uint cl = t % COL_THREADS;
    const uint rg = (t / COL_THREADS) % ROW_LANES;
    const uint ks = t / (COL_THREADS * ROW_LANES);
#ifndef NO_SUBGROUP_OPS
    if (USE_SUBGROUP) {
        const uint sg = gl_SubgroupSize;
        // cluster = lanes of one subgroup that share a row group
        const uint cmin = min(COL_THREADS, sg);
        if (cmin == sg) {
            [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = subgroupAdd(rv[i]);
        } else {
            for (uint off = cmin >> 1u; off > 0u; off >>= 1u) {
                [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] += subgroupShuffleXor(rv[i], off);
            }
        }
        if (KSPLIT == 1u && COL_THREADS <= sg) {
            rgOut = rg;
            return cl == 0u;  // whole row group lives in one cluster
        }
        // one partial per cluster -> shared, then one thread per row group sums them
        const uint nPerRg = (COL_THREADS / cmin) * KSPLIT;
        barrier();  // previous round's readers are done with red
        if ((t % cmin) == 0u) {
            const uint slot = rg * nPerRg + ks * (COL_THREADS / cmin) + cl / cmin;
            [[unroll]] for (uint i = 0u; i < NV; ++i) red[slot * NV + i] = rv[i];
        }
        barrier();
        rgOut = t;
        if (t < ROW_LANES) {
            [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = 0.0;
            for (uint p = 0u; p < nPerRg; ++p) {
                [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] += red[(t * nPerRg + p) * NV + i];
            }
            return true;
        }
        return false;
    }
#endif
    {
        // shared-memory tree over the members m = ks*COL_THREADS + cl of the row group
        const uint nm = COL_THREADS * KSPLIT;
        const uint m = ks * COL_THREADS + cl;
        const uint base = rg * nm;
        barrier();
        [[unroll]] for (uint i = 0u; i < NV; ++i) red[(base + m) * NV + i] = rv[i];
        // first stride: largest power of two below nm (nm need not be a power of two)
        for (uint s = (nm > 1u) ? (1u << uint(findMSB(nm - 1u))) : 0u; s > 0u; s >>= 1u) {
            barrier();
            if (m < s && m + s < nm) {
                [[unroll]] for (uint i = 0u; i < NV; ++i) red[(base + m) * NV + i] += red[(base + m + s) * NV + i];
            }
        }
        barrier();
        rgOut = rg;
        if (m == 0u) {
            [[unroll]] for (uint i = 0u; i < NV; ++i) rv[i] = red[base * NV + i];
            return true;
        }
        return false;
    }
}
