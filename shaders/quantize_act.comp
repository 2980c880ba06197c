#version 450
// quantize_act: f32 activations x[S, I] -> per-group int8 (power-of-two scale) for the
// integer-dot GEMVs.  Per group of GROUP_SIZE columns of a token:
//   amax = max |x|;  amax == 0 -> scale 0, q 0;
//   else amax = m * 2^e (m in [0.5, 1), frexp), scale = 2^(e-7),
//        q = clamp(roundEven(x * 2^(7-e)), -127, 127)   (exact: ldexp by a power of two)
// Outputs: xq (token s row at word s*xqRowWords, column 4w+j = byte j of word w, padding 0),
//          xscale[s*groupsPerRow + g] (f32), xsum[s*groupsPerRow + g] (int, sum of q).
// Dispatch: one thread per output word slot: S * groupsPerRow * (GROUP_SIZE/4) threads,
// ceil(that / WG) workgroups (x, optionally split over y); WG a multiple of GROUP_SIZE/4.
layout(local_size_x = 128, local_size_x_id = 0) in;
layout(constant_id = 4) const uint GROUP_SIZE = 32u;

const uint WG = gl_WorkGroupSize.x;
const uint TPG = GROUP_SIZE / 4u;  // threads per group, one packed word each

layout(std430, binding = 0) readonly restrict buffer XB { float x[]; };
layout(std430, binding = 1) writeonly restrict buffer XQ { uint xq[]; };
layout(std430, binding = 2) writeonly restrict buffer XS { float xscale[]; };
layout(std430, binding = 3) writeonly restrict buffer XU { int xsum[]; };
layout(push_constant, std430) uniform PC {
    uint I;
    uint S;
    uint groupsPerRow;
    uint xOffset;     // floats
    uint xqRowWords;  // words per token row of xq (ceil(I/16)*4)
} pc;

shared float redMax[WG];
shared int redSum[WG];

void main() {
    const uint lid = gl_LocalInvocationIndex;
    const uint wgi = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint gid = wgi * WG + lid;   // WG % TPG == 0: a group never straddles workgroups
    const uint slot = gid / TPG;       // (token, group)
    const uint k = gid % TPG;          // word within the group
    const uint s = slot / pc.groupsPerRow;
    const uint g = slot % pc.groupsPerRow;
    const bool valid = s < pc.S;       // no early return: every thread reaches the barriers

    const uint col0 = g * GROUP_SIZE + 4u * k;
    float v[4];
    float amax = 0.0;
    for (uint j = 0u; j < 4u; ++j) {
        const uint col = col0 + j;
        v[j] = (valid && col < pc.I) ? x[pc.xOffset + s * pc.I + col] : 0.0;
        amax = max(amax, abs(v[j]));
    }

    // group max over the TPG consecutive threads (tree in shared memory)
    redMax[lid] = amax;
    for (uint st = TPG >> 1u; st > 0u; st >>= 1u) {
        barrier();
        if (k < st) redMax[lid] = max(redMax[lid], redMax[lid + st]);
    }
    barrier();
    amax = redMax[lid - k];

    int e = 0;
    float scale = 0.0;
    int q[4] = int[4](0, 0, 0, 0);
    if (amax > 0.0) {
        frexp(amax, e);
        scale = ldexp(1.0, e - 7);
        for (uint j = 0u; j < 4u; ++j) {
            // ldexp(v, 7-e) == v * 2^(7-e) exactly, without forming 2^(7-e) (which can overflow)
            q[j] = int(clamp(roundEven(ldexp(v[j], 7 - e)), -127.0, 127.0));
        }
    }
    int qs = q[0] + q[1] + q[2] + q[3];

    redSum[lid] = qs;
    for (uint st = TPG >> 1u; st > 0u; st >>= 1u) {
        barrier();
        if (k < st) redSum[lid] += redSum[lid + st];
    }
    barrier();

    if (valid) {
        const uint w = g * TPG + k;  // word within the token row
        if (w < pc.xqRowWords) {
            xq[s * pc.xqRowWords + w] = (uint(q[0]) & 0xFFu) | ((uint(q[1]) & 0xFFu) << 8u) |
                                        ((uint(q[2]) & 0xFFu) << 16u) | (uint(q[3]) << 24u);
        }
        if (k == 0u) {
            xscale[s * pc.groupsPerRow + g] = scale;
            xsum[s * pc.groupsPerRow + g] = redSum[lid];
        }
    }
}
