/**
 * The delta rule's conv fold (shaders/dec_delta_rule.comp flags bit 3 with conv1d.glsl;
 * DeltaRuleKernel's `conv`) and dec_conv1d's advance mode (Conv1dKernel.recordAdvance), on the real
 * driver under the validation layer. The fold (delta rule on the raw in_proj_qkv rows, barrier, the
 * conv state advanced) against the separate steps (conv1d, barrier, delta rule on its output), call
 * after call with every state carried: the output, the recurrent state and the conv state equal bit
 * for bit after each call. Shapes: the tiny fixture's heads (2 key / 4 value of 32, conv 4: 96
 * channels over 32 invocations, 3 a thread), dims 128 at GQA 2 run as the graph runs llama.cpp's
 * tiled value heads (2 dispatches of 2 heads), 3 / 3 heads of keyDim 64 / valueDim 32 with conv 3,
 * and keyDim 16 at GQA 3 with conv 2 (3 channels a thread), rows at an offset and padded; calls of
 * 1, 1, 1, 3 and 1 tokens. Runs mode: 3 sequences of a 4-slot state buffer (states a stride apart
 * with gaps) over decode rounds and an interleaved round; the slot no token names stays as it was.
 * Both against the CPU layer (src/model/linear-attention.ts causalConv1dSilu, gatedDeltaRuleRecurrent,
 * gatedRmsNorm; f64 sums) with an NMSE bound.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { Conv1dKernel, DeltaRuleKernel, submitAndWait, type DeltaRuleArgs } from "../src/kernels/decoder/index.ts";
import { DeltaRuleChunkedKernel } from "../src/kernels/decoder/delta-rule.ts";
import { RUN_WORDS, writeRuns, type RunsBinding } from "../src/kernels/decoder/runs.ts";
import { causalConv1dSilu, gatedDeltaRuleRecurrent, gatedRmsNorm } from "../src/model/linear-attention.ts";
import { nmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { CommandBuffer } from "../src/vk/commands.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

/**
 * The fold against the CPU layer: the GPU's f32 sums against f64 ones. Measured at worst 9.6e-14 (out)
 * and 1.5e-13 (states) over these cases; bounded with ~60x room, far below what reading the conv
 * state one tap off gives (the negative control, once: out NMSE 1.0 to 1.8, delta state 7e-2 to 0.45).
 */
const CPU_BOUND = 1e-11;
const EPS = 1e-6;

const ctx = openTestContext();
const device = ctx.device;
const convKernels = new Map<number, Conv1dKernel>();
const deltaKernels = new Map<string, DeltaRuleKernel>();
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of deltaKernels.values()) k[Symbol.dispose]();
  for (const k of convKernels.values()) k[Symbol.dispose]();
  finish(ctx);
});

const convKernel = (K: number) => {
  let k = convKernels.get(K);
  if (!k) convKernels.set(K, (k = new Conv1dKernel(device, K)));
  return k;
};
const deltaKernel = (keyDim: number, valueDim: number, K: number) => {
  const key = `${keyDim}x${valueDim}/${K}`;
  let k = deltaKernels.get(key);
  if (!k) deltaKernels.set(key, (k = new DeltaRuleKernel(device, { keyDim, valueDim }, { convKernel: K })));
  return k;
};

let seed = 4001;
const random = (n: number, std = 1) => randomGaussianF32(n, seed++, std);
function bufferOf(data: Float32Array): Buffer {
  const b = hostBuffer(device, data.length);
  f32(b, data.length).set(data);
  return b;
}
const copyOf = (b: Buffer, n: number) => f32(b, n).slice();
/** The first index where two arrays' bits differ, or -1. */
function firstDiff(x: Float32Array, y: Float32Array): number {
  const a = new Uint32Array(x.buffer, x.byteOffset, x.length), b = new Uint32Array(y.buffer, y.byteOffset, y.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : a.length;
}

interface Shape {
  label: string;
  keyHeads: number;
  valueHeads: number;
  keyDim: number;
  valueDim: number;
  K: number;
  /** Delta-rule dispatches (the graph's tiled value heads: valueHeads / groups heads each, each its own key head). */
  groups: number;
  /** Token 0's row at rowOffset; rows rowPad floats longer than the channels. */
  rowOffset: number;
  rowPad: number;
}

const SHAPES: Shape[] = [
  { label: "tiny fixture (2 key / 4 value heads of 32), conv 4", keyHeads: 2, valueHeads: 4, keyDim: 32, valueDim: 32, K: 4, groups: 1, rowOffset: 0, rowPad: 0 },
  { label: "dims 128, GQA 2 (2 / 4 heads), conv 4, tiled: 2 dispatches of 2 heads", keyHeads: 2, valueHeads: 4, keyDim: 128, valueDim: 128, K: 4, groups: 2, rowOffset: 0, rowPad: 0 },
  { label: "keyDim 64 / valueDim 32, 3 / 3 heads, conv 3, rows from 5, padded by 3", keyHeads: 3, valueHeads: 3, keyDim: 64, valueDim: 32, K: 3, groups: 1, rowOffset: 5, rowPad: 3 },
  { label: "keyDim 16 / valueDim 16, GQA 3 (1 / 3 heads), conv 2, rows from 2, padded by 1", keyHeads: 1, valueHeads: 3, keyDim: 16, valueDim: 16, K: 2, groups: 1, rowOffset: 2, rowPad: 1 },
];

/** One layer's parameters: negA, dtBias, the gated norm's weight and the conv taps in one buffer (as the graph's params). */
function layerParams(sh: Shape) {
  const { valueHeads: Hv, valueDim: Dv, K } = sh;
  const C = channelsOf(sh);
  const negA = Float32Array.from({ length: Hv }, (_, h) => -Math.fround(0.02 * 200 ** (h / Math.max(1, Hv - 1))));
  const dtBias = random(Hv).map((x) => x - 1), normW = random(Dv, 0.3).map((x) => x + 1), convW = random(C * K, 0.5);
  const at = { negA: 3, dtBias: 3 + Hv, norm: 3 + 2 * Hv, conv: 3 + 2 * Hv + Dv };
  const all = new Float32Array(at.conv + C * K);
  all.set(negA, at.negA);
  all.set(dtBias, at.dtBias);
  all.set(normW, at.norm);
  all.set(convW, at.conv);
  return { negA, dtBias, normW, convW, at, all };
}
const channelsOf = (sh: Shape) => 2 * sh.keyHeads * sh.keyDim + sh.valueHeads * sh.valueDim;

/**
 * The CPU layer for n tokens of one sequence (rows of C channels): conv1d + SiLU, gates, delta rule,
 * gated norm; states updated. Tiled value heads (groups > 1): group j's value heads, each reading
 * the key head of its index in the group, as the graph's dispatches do.
 */
function cpuCall(sh: Shape, p: ReturnType<typeof layerParams>, mixed: Float32Array, a: Float32Array, b: Float32Array, z: Float32Array, n: number, convState: Float32Array, deltaState: Float32Array): Float32Array {
  const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv, K } = sh;
  const Kd = Hk * Dk, Vd = Hv * Dv, C = channelsOf(sh), heads = Hv / sh.groups, Vg = heads * Dv;
  const conv = new Float32Array(n * C);
  causalConv1dSilu(mixed, n, C, K, p.convW, convState, conv);
  const softplus = (x: number) => (x > 20 ? x : Math.log1p(Math.exp(x)));
  const out = new Float32Array(n * Vd);
  for (let j = 0; j < sh.groups; j++) {
    const q = new Float32Array(n * Kd), k = new Float32Array(n * Kd), v = new Float32Array(n * Vg), zg = new Float32Array(n * Vg);
    const g = new Float32Array(n * heads), beta = new Float32Array(n * heads);
    for (let t = 0; t < n; t++) {
      q.set(conv.subarray(t * C, t * C + Kd), t * Kd);
      k.set(conv.subarray(t * C + Kd, t * C + 2 * Kd), t * Kd);
      v.set(conv.subarray(t * C + 2 * Kd + j * Vg, t * C + 2 * Kd + (j + 1) * Vg), t * Vg);
      zg.set(z.subarray(t * Vd + j * Vg, t * Vd + (j + 1) * Vg), t * Vg);
      for (let i = 0; i < heads; i++) {
        const h = j * heads + i;
        beta[t * heads + i] = 1 / (1 + Math.exp(-b[t * Hv + h]!));
        g[t * heads + i] = p.negA[h]! * Math.fround(softplus(Math.fround(a[t * Hv + h]! + p.dtBias[h]!)));
      }
    }
    const o = new Float32Array(n * Vg);
    const state = deltaState.subarray(j * heads * Dk * Dv, (j + 1) * heads * Dk * Dv);
    gatedDeltaRuleRecurrent({ keyHeads: sh.groups === 1 ? Hk : heads, valueHeads: heads, keyDim: Dk, valueDim: Dv }, q, k, v, g, beta, n, { recurrent: state }, o);
    gatedRmsNorm(o, zg, p.normW, n * heads, Dv, EPS, o);
    for (let t = 0; t < n; t++) out.set(o.subarray(t * Vg, (t + 1) * Vg), t * Vd + j * Vg);
  }
  return out;
}

/** The delta rule's arguments as the graph builds them (dispatch j of sh.groups), reading q|k|v rows from `qkv` at `row0`. */
function deltaArgs(sh: Shape, j: number, base: Omit<DeltaRuleArgs, "keyHeads" | "valueHeads" | "qOffset" | "kOffset" | "vOffset" | "qkvStride">, row0: number, stride: number, at: ReturnType<typeof layerParams>["at"], stateOffset: number, outOffset: number, zOffset: number): DeltaRuleArgs {
  const { keyHeads: KH, valueHeads: VH, keyDim: kd, valueDim: vd } = sh;
  const g = sh.groups, heads = VH / g, Kd = KH * kd, Vd = VH * vd;
  return {
    ...base, keyHeads: g === 1 ? KH : heads, valueHeads: heads,
    qOffset: row0, kOffset: row0 + Kd, vOffset: row0 + 2 * Kd + j * heads * vd, qkvStride: stride,
    aOffset: (base.aOffset ?? 0) + j * heads, aStride: VH, bOffset: (base.bOffset ?? 0) + j * heads, bStride: VH,
    negAOffset: at.negA + j * heads, dtBiasOffset: at.dtBias + j * heads,
    stateOffset: stateOffset + j * heads * kd * vd,
    outOffset: outOffset + j * heads * vd, outStride: Vd,
    norm: { z: base.norm!.z, zOffset: zOffset + j * heads * vd, zStride: Vd, weightOffset: at.norm, eps: EPS },
  };
}

describe("dec_delta_rule conv fold + dec_conv1d advance vs dec_conv1d + dec_delta_rule (one sequence)", () => {
  for (const sh of SHAPES) {
    test(`${sh.label}: calls of 1, 1, 1, 3, 1 tokens, states carried: out, delta and conv states bit for bit after every call; CPU NMSE <= ${CPU_BOUND}`, () => {
      const { valueHeads: Hv, valueDim: Dv, K } = sh;
      const C = channelsOf(sh), Vd = Hv * Dv, stride = C + sh.rowPad, H = K - 1;
      const calls = [1, 1, 1, 3, 1], T = calls.reduce((s, n) => s + n, 0);
      const conv = convKernel(K), delta = deltaKernel(sh.keyDim, sh.valueDim, K);
      const p = layerParams(sh);
      const mixedAll = random(sh.rowOffset + T * stride), a = random(T * Hv), b = random(T * Hv, 2), z = random(T * Vd);
      const convState0 = random(C * H, 0.7), deltaState0 = random(delta.stateFloats(Hv), 0.3);
      using pb = bufferOf(p.all), mb = bufferOf(mixedAll), ab = bufferOf(a), bb = bufferOf(b), zb = bufferOf(z);
      using convRef = bufferOf(convState0), convFold = bufferOf(convState0), deltaRef = bufferOf(deltaState0), deltaFold = bufferOf(deltaState0);
      using convOut = hostBuffer(device, sh.rowOffset + T * stride), outRef = hostBuffer(device, T * Vd), outFold = hostBuffer(device, T * Vd);
      const cpuConv = convState0.slice(), cpuDelta = deltaState0.slice();
      const worst = { out: 0, delta: 0, conv: 0 };
      const differing: { call: number; firstDifferingWord: Record<string, number> }[] = [];
      let t0 = 0;
      for (const [call, n] of calls.entries()) {
        const row0 = sh.rowOffset + t0 * stride;
        const base = { S: n, a: ab, b: bb, aOffset: t0 * Hv, bOffset: t0 * Hv, params: pb, norm: { z: zb, weightOffset: p.at.norm, eps: EPS } };
        const convArgs = { x: mb, weight: pb, weightOffset: p.at.conv, S: n, channels: C, xOffset: row0, xStride: stride };
        submitAndWait(device, (cb) => {
          conv.record(cb, { ...convArgs, state: convRef, out: convOut, outOffset: row0, outStride: stride });
          cb.barrier("computeToCompute");
          for (let j = 0; j < sh.groups; j++) delta.record(cb, deltaArgs(sh, j, { ...base, qkv: convOut, state: deltaRef, out: outRef }, row0, stride, p.at, 0, t0 * Vd, t0 * Vd));
        });
        submitAndWait(device, (cb) => {
          for (let j = 0; j < sh.groups; j++) {
            delta.record(cb, { ...deltaArgs(sh, j, { ...base, qkv: mb, state: deltaFold, out: outFold }, row0, stride, p.at, 0, t0 * Vd, t0 * Vd), conv: { weightOffset: p.at.conv, state: convFold, rowOffset: row0 } });
          }
          cb.barrier("computeToCompute");
          conv.recordAdvance(cb, { ...convArgs, state: convFold });
        });
        const rows = new Float32Array(n * C);
        for (let t = 0; t < n; t++) rows.set(mixedAll.subarray(row0 + t * stride, row0 + t * stride + C), t * C);
        const ref = cpuCall(sh, p, rows, a.subarray(t0 * Hv, (t0 + n) * Hv), b.subarray(t0 * Hv, (t0 + n) * Hv), z.subarray(t0 * Vd, (t0 + n) * Vd), n, cpuConv, cpuDelta);
        const got = {
          out: firstDiff(copyOf(outRef, T * Vd), copyOf(outFold, T * Vd)),
          delta: firstDiff(copyOf(deltaRef, deltaState0.length), copyOf(deltaFold, deltaState0.length)),
          conv: firstDiff(copyOf(convRef, C * H), copyOf(convFold, C * H)),
        };
        if (Object.values(got).some((i) => i >= 0)) differing.push({ call, firstDifferingWord: got });
        worst.out = Math.max(worst.out, nmse(ref, f32(outFold, n * Vd, t0 * Vd)));
        worst.delta = Math.max(worst.delta, nmse(cpuDelta, f32(deltaFold, cpuDelta.length)));
        worst.conv = Math.max(worst.conv, H === 0 ? 0 : nmse(cpuConv, f32(convFold, cpuConv.length)));
        t0 += n;
      }
      console.log(`  ${sh.label}: ${differing.length} of ${calls.length} calls differ from the separate steps; CPU NMSE out ${worst.out.toExponential(1)}, delta state ${worst.delta.toExponential(1)}, conv state ${worst.conv.toExponential(1)}`);
      expect(differing).toEqual([]);
      expect(worst).toEqual({ out: expect.any(Number), delta: expect.any(Number), conv: expect.any(Number) });
      expect(Math.max(worst.out, worst.delta, worst.conv)).toBeLessThanOrEqual(CPU_BOUND);
      expectTail(outFold, T * Vd, "out");
      expectTail(deltaFold, deltaState0.length, "delta state");
      expectTail(convFold, C * H, "conv state");
    }, 60_000);
  }
});

describe("conv fold in runs mode (a batch of sequences, each on its own states)", () => {
  const shapes = [SHAPES[0]!, SHAPES[1]!];
  // per round: which slot each token belongs to (slot 3 is never named: its states must stay)
  const rounds = [[2, 0, 1], [1, 0, 1, 2, 1], [0], [1, 2, 0]];
  for (const sh of shapes) {
    test(`${sh.label}: decode rounds of 3 sequences and an interleaved round: bit for bit against conv1d + delta rule runs; CPU NMSE <= ${CPU_BOUND}; an unnamed slot untouched`, () => {
      const { valueHeads: Hv, valueDim: Dv, K } = sh;
      const C = channelsOf(sh), Vd = Hv * Dv, H = K - 1, slots = 4;
      const conv = convKernel(K), delta = deltaKernel(sh.keyDim, sh.valueDim, K);
      const p = layerParams(sh);
      const convFloats = C * H, deltaFloats = delta.stateFloats(Hv);
      const convOffset = 3, convStride = convFloats + 7, deltaOffset = 2, deltaStride = deltaFloats + 5;
      const convAll0 = random(convOffset + slots * convStride, 0.7), deltaAll0 = random(deltaOffset + slots * deltaStride, 0.3);
      using pb = bufferOf(p.all);
      using convRef = bufferOf(convAll0), convFold = bufferOf(convAll0), deltaRef = bufferOf(deltaAll0), deltaFold = bufferOf(deltaAll0);
      const cpuConv = Array.from({ length: slots }, (_, s) => convAll0.slice(convOffset + s * convStride, convOffset + s * convStride + convFloats));
      const cpuDelta = Array.from({ length: slots }, (_, s) => deltaAll0.slice(deltaOffset + s * deltaStride, deltaOffset + s * deltaStride + deltaFloats));
      let worst = 0;
      const differing: { round: number; firstDifferingWord: Record<string, number> }[] = [];
      for (const [round, stateOf] of rounds.entries()) {
        const S = stateOf.length;
        const mixed = random(S * C), a = random(S * Hv), b = random(S * Hv, 2), z = random(S * Vd);
        using mb = bufferOf(mixed), ab = bufferOf(a), bb = bufferOf(b), zb = bufferOf(z);
        using convOut = hostBuffer(device, S * C), outRef = hostBuffer(device, S * Vd), outFold = hostBuffer(device, S * Vd);
        using table = hostBuffer(device, RUN_WORDS, "upload");
        writeRuns(u32(table, RUN_WORDS), stateOf, S);
        const convRuns: RunsBinding = { table, stateStride: convStride, states: slots }, deltaRuns: RunsBinding = { table, stateStride: deltaStride, states: slots };
        const base = { S, a: ab, b: bb, params: pb, norm: { z: zb, weightOffset: p.at.norm, eps: EPS }, runs: deltaRuns };
        const convArgs = { x: mb, weight: pb, weightOffset: p.at.conv, S, channels: C, stateOffset: convOffset, runs: convRuns };
        submitAndWait(device, (cb) => {
          conv.record(cb, { ...convArgs, state: convRef, out: convOut });
          cb.barrier("computeToCompute");
          for (let j = 0; j < sh.groups; j++) delta.record(cb, deltaArgs(sh, j, { ...base, qkv: convOut, state: deltaRef, out: outRef }, 0, C, p.at, deltaOffset, 0, 0));
        });
        submitAndWait(device, (cb: CommandBuffer) => {
          for (let j = 0; j < sh.groups; j++) {
            delta.record(cb, { ...deltaArgs(sh, j, { ...base, qkv: mb, state: deltaFold, out: outFold }, 0, C, p.at, deltaOffset, 0, 0), conv: { weightOffset: p.at.conv, state: convFold, stateOffset: convOffset, stateStride: convStride } });
          }
          cb.barrier("computeToCompute");
          conv.recordAdvance(cb, { ...convArgs, state: convFold });
        });
        const got = {
          out: firstDiff(copyOf(outRef, S * Vd), copyOf(outFold, S * Vd)),
          delta: firstDiff(copyOf(deltaRef, deltaAll0.length), copyOf(deltaFold, deltaAll0.length)),
          conv: firstDiff(copyOf(convRef, convAll0.length), copyOf(convFold, convAll0.length)),
        };
        if (Object.values(got).some((i) => i >= 0)) differing.push({ round, firstDifferingWord: got });
        // the CPU: each sequence's tokens in order on its own states
        const outFolded = copyOf(outFold, S * Vd);
        for (let s = 0; s < slots; s++) {
          const own = stateOf.flatMap((v, t) => (v === s ? [t] : []));
          if (own.length === 0) continue;
          const pick = (src: Float32Array, w: number) => {
            const o = new Float32Array(own.length * w);
            own.forEach((t, i) => o.set(src.subarray(t * w, (t + 1) * w), i * w));
            return o;
          };
          const ref = cpuCall(sh, p, pick(mixed, C), pick(a, Hv), pick(b, Hv), pick(z, Vd), own.length, cpuConv[s]!, cpuDelta[s]!);
          worst = Math.max(worst, nmse(ref, pick(outFolded, Vd)));
          worst = Math.max(worst, nmse(cpuDelta[s]!, f32(deltaFold, deltaFloats, deltaOffset + s * deltaStride)));
          worst = Math.max(worst, nmse(cpuConv[s]!, f32(convFold, convFloats, convOffset + s * convStride)));
        }
        expectTail(outFold, S * Vd, "out");
      }
      // slot 3 was never named: its states are the initial ones
      const untouched = {
        conv: firstDiff(f32(convFold, convFloats, convOffset + 3 * convStride).slice(), convAll0.slice(convOffset + 3 * convStride, convOffset + 3 * convStride + convFloats)),
        delta: firstDiff(f32(deltaFold, deltaFloats, deltaOffset + 3 * deltaStride).slice(), deltaAll0.slice(deltaOffset + 3 * deltaStride, deltaOffset + 3 * deltaStride + deltaFloats)),
      };
      console.log(`  runs, ${sh.label}: ${differing.length} of ${rounds.length} rounds differ from the separate steps; worst CPU NMSE ${worst.toExponential(1)}`);
      expect(differing).toEqual([]);
      expect(untouched).toEqual({ conv: -1, delta: -1 });
      expect(worst).toBeLessThanOrEqual(CPU_BOUND);
      expectTail(convFold, convAll0.length, "conv state");
      expectTail(deltaFold, deltaAll0.length, "delta state");
    }, 60_000);
  }
});

describe("conv fold arguments", () => {
  test("taps, conv state or runs states outside their buffers, a rowOffset past q, no params, the chunked kernel: InvalidArgumentErrors", () => {
    const sh = SHAPES[0]!, C = channelsOf(sh);
    const delta = deltaKernel(sh.keyDim, sh.valueDim, 4);
    using big = hostBuffer(device, 1 << 16), small = hostBuffer(device, 16), table = hostBuffer(device, RUN_WORDS, "upload");
    writeRuns(u32(table, RUN_WORDS), [0, 1], 2);
    const args: DeltaRuleArgs = {
      S: 1, keyHeads: 2, valueHeads: 4, qkv: big, a: big, b: big, params: big, state: big, stateOffset: 8192, out: big, outOffset: 16384,
      conv: { weightOffset: 0, state: big, stateOffset: 32768 },
    };
    const rec = (a: DeltaRuleArgs) => submitAndWait(device, (cb) => delta.record(cb, a));
    rec(args); // positive control: these arguments are good
    expect(() => rec({ ...args, conv: { ...args.conv!, state: small } })).toThrow(InvalidArgumentError);
    expect(() => rec({ ...args, conv: { ...args.conv!, weightOffset: 1 << 16 } })).toThrow(InvalidArgumentError);
    expect(() => rec({ ...args, conv: { ...args.conv!, rowOffset: 1 } })).toThrow(InvalidArgumentError);
    expect(() => rec({ ...args, params: undefined, gatesGiven: true })).toThrow(InvalidArgumentError);
    // runs: two sequences' conv states overlapping, or the second past the buffer
    const runs = { table, stateStride: delta.stateFloats(4), states: 2 };
    rec({ ...args, S: 2, runs, conv: { ...args.conv!, stateStride: C * 3 } });
    expect(() => rec({ ...args, S: 2, runs, conv: { ...args.conv!, stateStride: C * 3 - 1 } })).toThrow(InvalidArgumentError);
    expect(() => rec({ ...args, S: 2, runs, conv: { ...args.conv!, stateOffset: (1 << 16) - C * 3, stateStride: C * 3 } })).toThrow(InvalidArgumentError);
    using chunked = new DeltaRuleChunkedKernel(device, { keyDim: sh.keyDim, valueDim: sh.valueDim });
    expect(() => submitAndWait(device, (cb) => chunked.recordCore(cb, args))).toThrow(InvalidArgumentError);
  });
});
