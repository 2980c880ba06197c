#version 450
// dec_delta_rule: S tokens (1..64, in order) through the gated delta rule, recurrent form, as
// src/model/linear-attention.ts gatedDeltaRuleRecurrent, with what surrounds it in the layer fused in:
// - q and k of each token L2-normalised per key head (x / sqrt(sum x^2 + 1e-6)), q also scaled by
//   1/sqrt(KEY_DIM); value head h reads key head h / (valueHeads / keyHeads);
// - the gates from the projections (unless flags bit 1): beta = sigmoid(b),
//   g = negA[h] * softplus(a + dtBias[h]) (negA = -exp(A_log)), as src/model/hybrid-decoder.ts;
// - per token: state *= exp(g); kv = state^T k; delta = (v - kv) * beta; state += k delta^T;
//   o = state^T q;
// - with flags bit 0, the gated RMSNorm of each head's output (Qwen3_5MoeRMSNormGated, as
//   linear-attention.ts gatedRmsNorm): y = w * (o / sqrt(mean(o^2) + eps)) * silu(z).
// A workgroup owns one value head: WG = VALUE_DIM * PARTS invocations, invocation (j, p) =
// (li % VALUE_DIM, li / VALUE_DIM) holds rows p*ROWS .. p*ROWS+ROWS-1 of the state's column j in
// registers for the whole call (ROWS = KEY_DIM / PARTS), so the state [valueHeads][KEY_DIM][VALUE_DIM]
// is read once and written once, coalesced (a subgroup reads consecutive j of one row). The two
// per-token sums over the key rows (kv, o) are PARTS partials added in shared memory, in the same
// order by every invocation of a column, so all of them hold the same delta; the L2 norms of q
// and k come from the same partials (the normalisation is a scalar per token: kv and o are
// computed on the raw k, q and scaled after). Two barriers per token (two more with the norm).
// A head's output row is one workgroup's, which is what lets the gated norm fuse in.
// The tokens run one after another inside the workgroup: a prompt chunk costs S dependent steps
// (a chunk-parallel prefill kernel is another shader).
// Runs mode (flags bit 2, a batch of sequences): workgroup (h, r) runs head h of run r of the runs
// table (dec_runs.glsl): one sequence's tokens in order, on that sequence's state at stateOffset +
// stateIndex * stateStride, so a decode round of S sequences is S x valueHeads independent
// workgroups rather than S dependent steps; a run of 0 tokens does nothing. The runs of one call
// have distinct states (each state block is one workgroup's).
// Conv fold (flags bit 3, the recurrent decode path): qkv holds the raw in_proj_qkv output (pre-conv)
// and the workgroup runs the causal conv1d + SiLU itself (conv1d.glsl, the arithmetic of dec_conv1d)
// on exactly the channels it reads: its key head's q and k, its value head's v. Invocation li owns
// channels li, li + WG, ... of those 2 KEY_DIM + VALUE_DIM, their windows in registers across the
// tokens, and writes each token's outputs to shared memory (one barrier more per token). The conv
// state [channels][CONV_KERNEL-1] (binding 8) is read only: the value heads of one key head all read
// its q and k channels, so none may write them; dec_conv1d's advance mode moves the state on after.
// Quantized output (flags bit 4): each token's head output also as the integer-dot GEMVs read it
// (quantize_group16.glsl: groups of 16 columns from outOffset + h * VALUE_DIM, row t of
// qGroupsPerRow groups; bindings 9-11), so out_proj needs no quantize step of its own.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 512, local_size_x_id = 0) in;
layout(constant_id = 1) const uint KEY_DIM = 128;
layout(constant_id = 2) const uint PARTS = 4;  // invocations per state column; divides KEY_DIM
layout(constant_id = 3) const bool USE_SUBGROUP = true;
layout(constant_id = 4) const uint CONV_KERNEL = 4;  // conv fold: taps, 1..8

const uint WG = gl_WorkGroupSize.x;
const uint VALUE_DIM = WG / PARTS;
const uint ROWS = KEY_DIM / PARTS;
const float L2_EPS = 1e-6;
// conv fold: the channels a workgroup convolves (q | k | v) and each invocation's share of them
const uint FOLD_CHANNELS = 2u * KEY_DIM + VALUE_DIM;
const uint FOLD_SLOTS = (FOLD_CHANNELS + WG - 1u) / WG;

#include "dec_linear_attention.glsl"

layout(set = 0, binding = 0) readonly buffer QKV { float qkv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };
layout(set = 0, binding = 2) readonly buffer B { float b[]; };
layout(set = 0, binding = 3) readonly buffer Z { float z[]; };
layout(set = 0, binding = 4) readonly buffer Params { float params[]; };
layout(set = 0, binding = 5) buffer State { float state[]; };
layout(set = 0, binding = 6) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 7) readonly buffer Runs { uint runs[]; };
layout(set = 0, binding = 8) readonly buffer ConvState { float convState[]; };
layout(set = 0, binding = 9) writeonly buffer OutQ { uvec4 outQ[]; };
layout(set = 0, binding = 10) writeonly buffer OutScale { float outScale[]; };
layout(set = 0, binding = 11) writeonly buffer OutSum { int outSum[]; };

#include "dec_runs.glsl"
#define CONV_TAPS CONV_KERNEL
#include "conv1d.glsl"
#include "quantize_group16.glsl"

layout(push_constant) uniform Push {
    uint S;
    uint keyHeads;
    uint valueHeads;
    uint qOffset;       // floats: token t's key head kh at qOffset + t * qkvStride + kh * KEY_DIM
    uint kOffset;       // likewise
    uint vOffset;       // floats: value head h at vOffset + t * qkvStride + h * VALUE_DIM
    uint qkvStride;     // floats between tokens of q, k and v (the conv output's row)
    uint aOffset;       // floats: a (or g) of (t, h) at aOffset + t * aStride + h
    uint aStride;
    uint bOffset;       // floats: b (or beta) likewise
    uint bStride;
    uint zOffset;       // floats: z of (t, h) at zOffset + t * zStride + h * VALUE_DIM (flags bit 0)
    uint zStride;
    uint outOffset;     // floats: (t, h) at outOffset + t * outStride + h * VALUE_DIM
    uint outStride;
    uint stateOffset;   // floats: [valueHeads][KEY_DIM][VALUE_DIM]
    uint negAOffset;    // floats in params: valueHeads of -exp(A_log) (unless flags bit 1)
    uint dtBiasOffset;  // floats in params: valueHeads (unless flags bit 1)
    uint normOffset;    // floats in params: VALUE_DIM norm weights (flags bit 0)
    float eps;          // the gated norm's (flags bit 0)
    uint flags;         // bit 0: gated RMSNorm of the output; bit 1: a, b hold g and beta as they are; bit 2: runs mode; bit 3: conv fold
    uint stateStride;   // runs mode: floats between sequences' states
    uint rowOffset;     // conv fold: floats: token t's qkv row starts at rowOffset + t * qkvStride, channel c at + c
    uint convWOffset;   // conv fold: floats in params: the taps [channels][CONV_KERNEL]
    uint convStateOffset;  // conv fold: floats: [channels][CONV_KERNEL-1]
    uint convStateStride;  // conv fold, runs mode: floats between sequences' conv states
    uint qGroupsPerRow;    // quantized output: groups of 16 in a token's row (its columns / 16)
} pc;

shared float kvPart[WG];
shared float oPart[WG];
shared float kSquares[PARTS];
shared float qSquares[PARTS];
shared float mixedConv[FOLD_CHANNELS];  // conv fold: the current token's q | k | v
shared float headOut[VALUE_DIM];        // quantized output: the token's head output

void main() {
    const uint h = gl_WorkGroupID.x;
    if (h >= pc.valueHeads) return;  // uniform per workgroup
    const bool batched = (pc.flags & 4u) != 0u;
    const uint run = gl_WorkGroupID.y;
    const uint count = batched ? runs[RUN_COUNT + run] : pc.S;
    if (count == 0u) return;  // uniform per workgroup
    const uint first = batched ? runs[RUN_FIRST + run] : 0u;
    const uint li = gl_LocalInvocationIndex;
    const uint j = li % VALUE_DIM, p = li / VALUE_DIM;
    const uint kh = h / (pc.valueHeads / pc.keyHeads);
    const uint row0 = p * ROWS;
    const uint sAt = pc.stateOffset + (batched ? runs[RUN_STATE + run] * pc.stateStride : 0u) + (h * KEY_DIM + row0) * VALUE_DIM + j;  // + r * VALUE_DIM
    const bool gatedNorm = (pc.flags & 1u) != 0u;
    const bool gatesGiven = (pc.flags & 2u) != 0u;
    const float qScale = 1.0 / sqrt(float(KEY_DIM));
    const bool convFold = (pc.flags & 8u) != 0u;
    const bool quantOut = (pc.flags & 16u) != 0u;

    // conv fold: channel of each slot (a row position), its taps and window
    const uint convAt = pc.convStateOffset + (batched ? runs[RUN_STATE + run] * pc.convStateStride : 0u);
    const uint H = CONV_KERNEL - 1u;
    uint channel[FOLD_SLOTS];
    float taps[FOLD_SLOTS][CONV_KERNEL], window[FOLD_SLOTS][CONV_KERNEL];
    if (convFold) {
        for (uint u = 0u; u < FOLD_SLOTS; u++) {
            const uint lc = li + u * WG;
            if (lc >= FOLD_CHANNELS) break;
            channel[u] = lc < KEY_DIM ? pc.qOffset + kh * KEY_DIM + lc
                : lc < 2u * KEY_DIM ? pc.kOffset + kh * KEY_DIM + (lc - KEY_DIM)
                : pc.vOffset + h * VALUE_DIM + (lc - 2u * KEY_DIM);
            channel[u] -= pc.rowOffset;
            for (uint jj = 0u; jj < CONV_KERNEL; jj++) taps[u][jj] = params[pc.convWOffset + channel[u] * CONV_KERNEL + jj];
            for (uint jj = 0u; jj < H; jj++) window[u][jj] = convState[convAt + channel[u] * H + jj];
        }
    }

    float s[ROWS];
    for (uint r = 0u; r < ROWS; r++) s[r] = state[sAt + r * VALUE_DIM];

    for (uint i = 0u; i < count; i++) {
        const uint t = batched ? runs[RUN_TOKENS + first + i] : i;
        const float ga = a[pc.aOffset + t * pc.aStride + h];
        const float gb = b[pc.bOffset + t * pc.bStride + h];
        const float g = gatesGiven ? ga : params[pc.negAOffset + h] * softplus(ga + params[pc.dtBiasOffset + h]);
        const float beta = gatesGiven ? gb : sigmoid(gb);
        const float decay = exp(g);

        if (convFold) {
            for (uint u = 0u; u < FOLD_SLOTS; u++) {
                const uint lc = li + u * WG;
                if (lc >= FOLD_CHANNELS) break;
                const float xt = qkv[pc.rowOffset + t * pc.qkvStride + channel[u]];
                mixedConv[lc] = convSilu(taps[u], window[u], xt);
                convShift(window[u], xt);
            }
            // this token's q | k | v in place before any is read (the previous token's were all read
            // before its second barrier, which every writer here has passed)
            barrier();
        }

        // decay the state; partial kv = sum_r state[r][j] k[r] over this invocation's rows (k raw)
        const uint qkAt = t * pc.qkvStride + kh * KEY_DIM + row0;
        float kr[ROWS], qr[ROWS];
        float kv = 0.0, kk = 0.0, qq = 0.0;
        for (uint r = 0u; r < ROWS; r++) {
            kr[r] = convFold ? mixedConv[KEY_DIM + row0 + r] : qkv[pc.kOffset + qkAt + r];
            qr[r] = convFold ? mixedConv[row0 + r] : qkv[pc.qOffset + qkAt + r];
            s[r] *= decay;
            kv += s[r] * kr[r];
            kk += kr[r] * kr[r];
            qq += qr[r] * qr[r];
        }
        kvPart[li] = kv;
        if (j == 0u) {
            kSquares[p] = kk;
            qSquares[p] = qq;
        }
        barrier();
        float kvSum = 0.0, kSum = 0.0, qSum = 0.0;
        for (uint part = 0u; part < PARTS; part++) {
            kvSum += kvPart[part * VALUE_DIM + j];
            kSum += kSquares[part];
            qSum += qSquares[part];
        }
        const float ik = 1.0 / sqrt(kSum + L2_EPS);
        const float iq = qScale / sqrt(qSum + L2_EPS);

        // delta_j = (v_j - kv_j) beta; state += k_normalised delta^T; partial o = sum_r state[r][j] q[r]
        const float v = convFold ? mixedConv[2u * KEY_DIM + j] : qkv[pc.vOffset + t * pc.qkvStride + h * VALUE_DIM + j];
        const float kDelta = (v - kvSum * ik) * beta * ik;
        float o = 0.0;
        for (uint r = 0u; r < ROWS; r++) {
            s[r] += kr[r] * kDelta;
            o += s[r] * qr[r];
        }
        oPart[li] = o;
        barrier();
        float oSum = 0.0;
        for (uint part = 0u; part < PARTS; part++) oSum += oPart[part * VALUE_DIM + j];
        float y = oSum * iq;

        if (gatedNorm) {
            // the head's VALUE_DIM outputs, each counted once (by the p = 0 invocations)
            const float total = workgroupSum(p == 0u ? y * y : 0.0, VALUE_DIM);
            const float inv = 1.0 / sqrt(total / float(VALUE_DIM) + pc.eps);
            const float zj = z[pc.zOffset + t * pc.zStride + h * VALUE_DIM + j];
            y = (params[pc.normOffset + j] * (y * inv)) * silu(zj);
        }
        if (p == 0u) outv[pc.outOffset + t * pc.outStride + h * VALUE_DIM + j] = y;
        if (quantOut) {
            // the next token writes headOut after this token's later barriers, which its readers pass first
            if (p == 0u) headOut[j] = y;
            barrier();
            if (li < VALUE_DIM / 16u) {
                float v[16];
                for (uint c = 0u; c < 16u; c++) v[c] = headOut[16u * li + c];
                uvec4 words;
                float scale;
                int qsum;
                quantizeGroup16(v, words, scale, qsum);
                const uint g = t * pc.qGroupsPerRow + (pc.outOffset + h * VALUE_DIM) / 16u + li;
                outQ[g] = words;
                outScale[g] = scale;
                outSum[g] = qsum;
            }
        }
    }

    for (uint r = 0u; r < ROWS; r++) state[sAt + r * VALUE_DIM] = s[r];
}
