/**
 * Gated DeltaNet's GPU kernels (shaders/dec_conv1d.comp, dec_delta_rule.comp, dec_gated_norm.comp)
 * on the real driver, under the validation layer, against the CPU functions of
 * src/model/linear-attention.ts (causalConv1dSilu, gatedDeltaRuleRecurrent / Chunked, gatedRmsNorm)
 * on seeded random data: the tiny fixture's shapes (2 key / 4 value heads of 32, conv kernel 4) and
 * the real model's head dims (128) with fewer heads at GQA ratios 1, 2 and 4; S = 1, 3, 17, 64;
 * every call starting from a non-zero state, and the state carried across calls (two calls equal
 * one). Bound: max |got − ref| / max |ref| ≤ 1e-5 per output and per state. Every output buffer
 * carries sentinel words past its end, checked after each run.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { CONV1D_MAX_S, CONV1D_TOKEN_BLOCK, Conv1dKernel, DeltaRuleKernel, GatedNormKernel, submitAndWait, type DeltaRuleArgs } from "../src/kernels/decoder/index.ts";
import { causalConv1dSilu, gatedDeltaRuleChunked, gatedDeltaRuleRecurrent, gatedRmsNorm, type DeltaRuleShape } from "../src/model/linear-attention.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { gates, layerInputs, relMaxErr, type LayerInputs } from "./support/delta-layer.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer as deviceHostBuffer } from "./support/host-buffers.ts";

const TOL = 1e-5;
const KERNEL = 4;
const EPS = 1e-6;

const ctx = openTestContext();
const device = ctx.device;
const conv = new Conv1dKernel(device, KERNEL);
const deltaKernels = new Map<string, DeltaRuleKernel>();
const gatedNorm = new GatedNormKernel(device);
const gatedNormShared = new GatedNormKernel(device, { useSubgroup: false, workgroupSize: 48 });
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  gatedNormShared[Symbol.dispose]();
  gatedNorm[Symbol.dispose]();
  for (const k of deltaKernels.values()) k[Symbol.dispose]();
  conv[Symbol.dispose]();
  finish(ctx);
});

/** One kernel object per (dims, options), as a graph would hold one per layer shape. */
function deltaKernel(keyDim: number, valueDim: number, useSubgroup?: boolean): DeltaRuleKernel {
  const key = `${keyDim}x${valueDim}/${useSubgroup}`;
  let k = deltaKernels.get(key);
  if (!k) deltaKernels.set(key, (k = new DeltaRuleKernel(device, { keyDim, valueDim }, { useSubgroup })));
  return k;
}

let seed = 1;
const random = (n: number, std = 1) => randomGaussianF32(n, seed++, std);

/** A buffer holding `data` (plus sentinel words past it). */
function bufferOf(data: Float32Array): Buffer {
  const b = deviceHostBuffer(device, data.length);
  f32(b, data.length).set(data);
  return b;
}
const outBuffer = (words: number) => deviceHostBuffer(device, words);

/** Every error below TOL, with the case and all errors in the failure message. */
function expectClose(label: Record<string, unknown>, errors: Record<string, number>): number {
  const ok = Object.values(errors).every((e) => e <= TOL);
  expect({ ...label, ...errors, ok }).toMatchObject({ ...label, ok: true });
  return Math.max(...Object.values(errors));
}

const SIZES = [1, 3, 17, 64];
/** Two-call splits of each S (the second call continues from the first's state). */
const split = (S: number) => (S === 1 ? 1 : Math.ceil(S / 3));

// ---------------------------------------------------------------------------------------------
describe("dec_conv1d vs causalConv1dSilu (kernel 4, non-zero starting state)", () => {
  // channels = 2·keyHeads·keyDim + valueHeads·valueDim: the tiny fixture, 128-dim heads scaled down, Qwen3.6's 8192
  const CHANNELS = [2 * 2 * 32 + 4 * 32, 2 * 1 * 128 + 4 * 128, 8192];
  test(`channels ${CHANNELS.join(", ")} x S = ${SIZES.join(", ")}: one call, and two calls == one`, () => {
    let worst = 0;
    for (const C of CHANNELS) {
      for (const S of SIZES) {
        const x = random(S * C), weight = random(C * KERNEL, 0.5), state0 = random(C * (KERNEL - 1));
        const refState = state0.slice(), ref = new Float32Array(S * C);
        causalConv1dSilu(x, S, C, KERNEL, weight, refState, ref);
        using xb = bufferOf(x);
        using wb = bufferOf(weight);
        for (const first of [S, split(S)]) {
          using sb = bufferOf(state0);
          using ob = outBuffer(S * C);
          submitAndWait(device, (cb) => {
            conv.record(cb, { x: xb, weight: wb, state: sb, out: ob, S: first, channels: C });
            if (first < S) {
              cb.barrier("computeToCompute");
              conv.record(cb, { x: xb, weight: wb, state: sb, out: ob, S: S - first, channels: C, xOffset: first * C, outOffset: first * C });
            }
          });
          worst = Math.max(worst, expectClose({ C, S, first }, { out: relMaxErr(ref, f32(ob, S * C)) }));
          // the new state is the last inputs themselves: exact
          expect(Array.from(f32(sb, C * (KERNEL - 1)))).toEqual(Array.from(refState));
          expectTail(ob, S * C, `conv out C ${C} S ${S}`);
          expectTail(sb, C * (KERNEL - 1), `conv state C ${C} S ${S}`);
        }
      }
    }
    console.log(`  conv1d: worst relative error ${worst.toExponential(2)}`);
  }, 60_000);

  test("offsets and token strides (rows of a wider projection output), S shorter than the kernel", () => {
    const C = 96, S = 2, xStride = C + 40, outStride = C + 8, xOff = 13, outOff = 5, wOff = 7, sOff = 3;
    const xAll = random(xOff + (S - 1) * xStride + C), weight = random(wOff + C * KERNEL, 0.5), stateAll = random(sOff + C * (KERNEL - 1));
    const x = new Float32Array(S * C);
    for (let t = 0; t < S; t++) x.set(xAll.subarray(xOff + t * xStride, xOff + t * xStride + C), t * C);
    const refState = stateAll.slice(sOff), ref = new Float32Array(S * C);
    causalConv1dSilu(x, S, C, KERNEL, weight.subarray(wOff), refState, ref);
    using xb = bufferOf(xAll);
    using wb = bufferOf(weight);
    using sb = bufferOf(stateAll);
    using ob = outBuffer(outOff + (S - 1) * outStride + C);
    submitAndWait(device, (cb) => conv.record(cb, { x: xb, weight: wb, state: sb, out: ob, S, channels: C, xOffset: xOff, xStride, weightOffset: wOff, stateOffset: sOff, outOffset: outOff, outStride }));
    const got = new Float32Array(S * C);
    for (let t = 0; t < S; t++) got.set(f32(ob, C, outOff + t * outStride), t * C);
    expectClose({ C, S }, { out: relMaxErr(ref, got) });
    expect(Array.from(f32(sb, C * (KERNEL - 1), sOff))).toEqual(Array.from(refState));
    expect(Array.from(f32(sb, sOff))).toEqual(Array.from(stateAll.subarray(0, sOff))); // before stateOffset untouched
    expectTail(ob, outOff + (S - 1) * outStride + C, "conv out");
  }, 30_000);

  test(`a long prompt chunk in blocks of ${CONV1D_TOKEN_BLOCK} tokens (recordOutputs, then recordAdvance) equals one walk bit for bit: S = 1, 2, 17, 100, 512; offsets and strides`, () => {
    for (const [C, S, xOff, xStride, outOff, outStride] of [[8192, 512, 0, 8192, 0, 8192], [96, 100, 13, 136, 5, 104], [96, 17, 0, 96, 0, 96], [64, 2, 3, 64, 0, 64], [64, 1, 0, 70, 9, 64]] as const) {
      const x = random(xOff + (S - 1) * xStride + C), weight = random(C * KERNEL, 0.5), state0 = random(C * (KERNEL - 1));
      using xb = bufferOf(x);
      using wb = bufferOf(weight);
      const outWords = outOff + (S - 1) * outStride + C;
      const run = (blocks: boolean) => {
        const sb = bufferOf(state0), ob = outBuffer(outWords);
        const args = { x: xb, weight: wb, state: sb, S, channels: C, xOffset: xOff, xStride, outOffset: outOff, outStride };
        submitAndWait(device, (cb) => {
          if (!blocks) conv.record(cb, { ...args, out: ob });
          else {
            conv.recordOutputs(cb, { ...args, out: ob });
            cb.barrier("computeToCompute");
            conv.recordAdvance(cb, args);
          }
        });
        return { sb, ob };
      };
      const one = run(false), blocked = run(true);
      try {
        expect(Array.from(f32(blocked.ob, outWords))).toEqual(Array.from(f32(one.ob, outWords)));
        expect(Array.from(f32(blocked.sb, C * (KERNEL - 1)))).toEqual(Array.from(f32(one.sb, C * (KERNEL - 1))));
        expectTail(blocked.ob, outWords, `blocks out C ${C} S ${S}`);
      } finally {
        for (const b of [one.sb, one.ob, blocked.sb, blocked.ob]) b[Symbol.dispose]();
      }
    }
    expect(() => conv.recordOutputs(undefined as never, { x: undefined as never, weight: undefined as never, state: undefined as never, out: undefined as never, S: 1, channels: 1, runs: {} } as never)).toThrow(/one sequence/);
  }, 60_000);

  test("bad arguments are InvalidArgumentErrors", () => {
    using b = outBuffer(4096);
    const args = { x: b, weight: b, state: b, out: b, channels: 16 };
    expect(() => submitAndWait(device, (cb) => conv.record(cb, { ...args, S: 0, out: b, outOffset: 2048 }))).toThrow(InvalidArgumentError);
    expect(() => submitAndWait(device, (cb) => conv.record(cb, { ...args, S: CONV1D_MAX_S + 1, outOffset: 2048 }))).toThrow(InvalidArgumentError);
    expect(() => submitAndWait(device, (cb) => conv.record(cb, { ...args, S: 2, outOffset: 8 }))).toThrow(/overlap/);
    expect(() => new Conv1dKernel(device, 9)).toThrow(InvalidArgumentError);
  });
});

// ---------------------------------------------------------------------------------------------
/** The CPU path: gatedDeltaRuleRecurrent (or Chunked) from `state` (updated), then optionally gatedRmsNorm. */
function cpuLayer(shape: DeltaRuleShape, x: LayerInputs, S: number, state: Float32Array, norm: boolean, kind: "recurrent" | "chunked" = "recurrent"): Float32Array {
  const { g, beta } = gates(x, S, shape.valueHeads);
  const out = new Float32Array(S * shape.valueHeads * shape.valueDim);
  const st = { recurrent: state };
  if (kind === "recurrent") gatedDeltaRuleRecurrent(shape, x.q, x.k, x.v, g, beta, S, st, out);
  else gatedDeltaRuleChunked(shape, x.q, x.k, x.v, g, beta, S, st, out);
  if (norm) gatedRmsNorm(out, x.z, x.normW, S * shape.valueHeads, shape.valueDim, EPS, out);
  return out;
}

/** The layer inputs in device buffers as the graph would hold them: q|k|v rows (the conv output), a, b, z, one params buffer. */
class DeviceLayer implements Disposable {
  readonly qkv: Buffer;
  readonly a: Buffer;
  readonly b: Buffer;
  readonly z: Buffer;
  readonly params: Buffer;
  readonly offsets: { negA: number; dtBias: number; norm: number };

  constructor(shape: DeltaRuleShape, x: LayerInputs, S: number) {
    const Kd = shape.keyHeads * shape.keyDim, Vd = shape.valueHeads * shape.valueDim, row = 2 * Kd + Vd;
    const qkv = new Float32Array(S * row);
    for (let t = 0; t < S; t++) {
      qkv.set(x.q.subarray(t * Kd, (t + 1) * Kd), t * row);
      qkv.set(x.k.subarray(t * Kd, (t + 1) * Kd), t * row + Kd);
      qkv.set(x.v.subarray(t * Vd, (t + 1) * Vd), t * row + 2 * Kd);
    }
    const Hv = shape.valueHeads;
    const params = new Float32Array(3 + 2 * Hv + shape.valueDim);
    this.offsets = { negA: 3, dtBias: 3 + Hv, norm: 3 + 2 * Hv };
    params.set(x.negA, this.offsets.negA);
    params.set(x.dtBias, this.offsets.dtBias);
    params.set(x.normW, this.offsets.norm);
    this.qkv = bufferOf(qkv);
    this.a = bufferOf(x.a);
    this.b = bufferOf(x.b);
    this.z = bufferOf(x.z);
    this.params = bufferOf(params);
  }

  /** The kernel's arguments for tokens t0 .. t0 + S − 1 (default layouts, offset by t0 rows). */
  args(shape: DeltaRuleShape, t0: number, S: number, state: Buffer, out: Buffer, norm: boolean): DeltaRuleArgs {
    const Kd = shape.keyHeads * shape.keyDim, Vd = shape.valueHeads * shape.valueDim, row = 2 * Kd + Vd, Hv = shape.valueHeads;
    return {
      S, keyHeads: shape.keyHeads, valueHeads: Hv,
      qkv: this.qkv, qOffset: t0 * row, kOffset: t0 * row + Kd, vOffset: t0 * row + 2 * Kd,
      a: this.a, b: this.b, aOffset: t0 * Hv, bOffset: t0 * Hv,
      params: this.params, negAOffset: this.offsets.negA, dtBiasOffset: this.offsets.dtBias,
      state, out, outOffset: t0 * Vd,
      norm: norm ? { z: this.z, zOffset: t0 * Vd, weightOffset: this.offsets.norm, eps: EPS } : undefined,
    };
  }

  [Symbol.dispose](): void {
    for (const b of [this.params, this.z, this.b, this.a, this.qkv]) b[Symbol.dispose]();
  }
}

const TINY: DeltaRuleShape = { keyHeads: 2, valueHeads: 4, keyDim: 32, valueDim: 32 };
const DELTA_SHAPES: [string, DeltaRuleShape][] = [
  ["tiny fixture (2 key / 4 value heads of 32)", TINY],
  ["dims 128, GQA 1 (2 / 2 heads)", { keyHeads: 2, valueHeads: 2, keyDim: 128, valueDim: 128 }],
  ["dims 128, GQA 2 (2 / 4 heads)", { keyHeads: 2, valueHeads: 4, keyDim: 128, valueDim: 128 }],
  ["dims 128, GQA 4 (2 / 8 heads)", { keyHeads: 2, valueHeads: 8, keyDim: 128, valueDim: 128 }],
  ["keyDim 64 > valueDim 32, GQA 2", { keyHeads: 2, valueHeads: 4, keyDim: 64, valueDim: 32 }],
];

/** Runs the layer on the GPU from `state0` in calls of the given token counts (a barrier between them); returns out and the state. */
function gpuLayer(kernel: DeltaRuleKernel, shape: DeltaRuleShape, x: LayerInputs, state0: Float32Array, calls: number[], norm: boolean): { out: Float32Array; state: Float32Array } {
  const S = calls.reduce((n, c) => n + c, 0), Vd = shape.valueHeads * shape.valueDim;
  using layer = new DeviceLayer(shape, x, S);
  using sb = bufferOf(state0);
  using ob = outBuffer(S * Vd);
  submitAndWait(device, (cb) => {
    let t0 = 0;
    for (const [i, n] of calls.entries()) {
      if (i > 0) cb.barrier("computeToCompute");
      kernel.record(cb, layer.args(shape, t0, n, sb, ob, norm));
      t0 += n;
    }
  });
  expectTail(ob, S * Vd, "delta rule out");
  expectTail(sb, state0.length, "delta rule state");
  return { out: f32(ob, S * Vd).slice(), state: f32(sb, state0.length).slice() };
}

describe("dec_delta_rule vs gatedDeltaRuleRecurrent (gates from a, b in the kernel; non-zero starting state)", () => {
  for (const [label, shape] of DELTA_SHAPES) {
    test(`${label}: S = ${SIZES.join(", ")}, one call and two calls == one`, () => {
      const kernel = deltaKernel(shape.keyDim, shape.valueDim);
      let worst = 0;
      for (const S of SIZES) {
        const x = layerInputs(shape, S, random);
        const state0 = random(shape.valueHeads * shape.keyDim * shape.valueDim, 0.5);
        const refState = state0.slice();
        const ref = cpuLayer(shape, x, S, refState, false);
        for (const calls of S === 1 ? [[1]] : [[S], [split(S), S - split(S)]]) {
          const got = gpuLayer(kernel, shape, x, state0, calls, false);
          worst = Math.max(worst, expectClose({ label, S, calls }, { out: relMaxErr(ref, got.out), state: relMaxErr(refState, got.state) }));
        }
      }
      console.log(`  delta rule ${label} (${kernel.parts} parts, ${kernel.workgroupSize} threads): worst relative error ${worst.toExponential(2)}`);
    }, 60_000);
  }

  test("g and beta given (flags bit 1), offsets past zero, decode tokens one call each", () => {
    const shape = TINY, S = 5, Hv = shape.valueHeads;
    const kernel = deltaKernel(shape.keyDim, shape.valueDim);
    const x = layerInputs(shape, S, random);
    const { g, beta } = gates(x, S, Hv);
    const state0 = random(Hv * shape.keyDim * shape.valueDim, 0.5), refState = state0.slice();
    const ref = new Float32Array(S * Hv * shape.valueDim);
    gatedDeltaRuleRecurrent(shape, x.q, x.k, x.v, g, beta, S, { recurrent: refState }, ref);
    using layer = new DeviceLayer(shape, x, S);
    const gOff = 9, stOff = 17, outOff = 11;
    const gb = new Float32Array(gOff + 2 * S * Hv);
    gb.set(g, gOff);
    gb.set(beta, gOff + S * Hv);
    using gbuf = bufferOf(gb);
    const st = new Float32Array(stOff + state0.length);
    st.set(state0, stOff);
    using sb = bufferOf(st);
    using ob = outBuffer(outOff + S * Hv * shape.valueDim);
    submitAndWait(device, (cb) => {
      for (let t = 0; t < S; t++) {
        if (t > 0) cb.barrier("computeToCompute");
        const args = layer.args(shape, t, 1, sb, ob, false);
        kernel.record(cb, { ...args, params: undefined, a: gbuf, b: gbuf, aOffset: gOff + t * Hv, bOffset: gOff + S * Hv + t * Hv, gatesGiven: true, stateOffset: stOff, outOffset: outOff + t * Hv * shape.valueDim });
      }
    });
    expectClose({ S }, { out: relMaxErr(ref, f32(ob, ref.length, outOff)), state: relMaxErr(refState, f32(sb, state0.length, stOff)) });
    expectTail(ob, outOff + ref.length, "out");
    expectTail(sb, st.length, "state");
  }, 30_000);

  test("bad arguments are InvalidArgumentErrors", () => {
    const kernel = deltaKernel(32, 32);
    using b = outBuffer(1 << 16);
    const base: DeltaRuleArgs = { S: 1, keyHeads: 2, valueHeads: 4, qkv: b, a: b, b: b, params: b, state: b, stateOffset: 4096, out: b, outOffset: 32768 };
    for (const bad of [{ S: 0 }, { S: 65 }, { valueHeads: 3 }, { outOffset: 0 }, { params: undefined }, { stateOffset: (1 << 16) - 100 }] as Partial<DeltaRuleArgs>[]) {
      expect(() => submitAndWait(device, (cb) => kernel.record(cb, { ...base, ...bad }))).toThrow(InvalidArgumentError);
    }
    expect(() => new DeltaRuleKernel(device, { keyDim: 128, valueDim: 128 }, { parts: 3 })).toThrow(InvalidArgumentError);
  });
});

describe("dec_delta_rule with the gated RMSNorm fused in vs gatedDeltaRuleRecurrent + gatedRmsNorm", () => {
  const cases: [string, DeltaRuleShape][] = [DELTA_SHAPES[0]!, DELTA_SHAPES[2]!, DELTA_SHAPES[4]!];
  for (const useSubgroup of [true, false]) {
    test(`${useSubgroup ? "subgroup" : "shared-memory"} reduction: ${cases.map(([l]) => l.split(" (")[0]).join("; ")}, S = 1, 17, 64`, () => {
      let worst = 0;
      for (const [label, shape] of cases) {
        const kernel = deltaKernel(shape.keyDim, shape.valueDim, useSubgroup);
        for (const S of [1, 17, 64]) {
          const x = layerInputs(shape, S, random);
          const state0 = random(shape.valueHeads * shape.keyDim * shape.valueDim, 0.5), refState = state0.slice();
          const ref = cpuLayer(shape, x, S, refState, true);
          const got = gpuLayer(kernel, shape, x, state0, S === 1 ? [1] : [split(S), S - split(S)], true);
          worst = Math.max(worst, expectClose({ label, S }, { out: relMaxErr(ref, got.out), state: relMaxErr(refState, got.state) }));
        }
      }
      console.log(`  delta rule + gated norm (${useSubgroup ? "subgroup" : "shared"}): worst relative error ${worst.toExponential(2)}`);
    }, 60_000);
  }
});

// ---------------------------------------------------------------------------------------------
describe("dec_gated_norm vs gatedRmsNorm", () => {
  for (const [name, kernel] of [["subgroup reduction, 128 threads", gatedNorm], ["shared-memory reduction, 48 threads", gatedNormShared]] as const) {
    test(`${name}: heads x n = 4 x 32, 2 x 128, 3 x 100; S = ${SIZES.join(", ")}`, () => {
      let worst = 0;
      for (const [heads, n] of [[4, 32], [2, 128], [3, 100]] as const) {
        for (const S of SIZES) {
          const R = S * heads;
          const x = random(R * n, 2), z = random(R * n, 2), w = random(n, 0.3).map((v) => v + 1);
          const ref = new Float32Array(R * n);
          gatedRmsNorm(x, z, w, R, n, EPS, ref);
          using xb = bufferOf(x);
          using zb = bufferOf(z);
          using wb = bufferOf(w);
          using yb = outBuffer(R * n);
          submitAndWait(device, (cb) => kernel.record(cb, { x: xb, z: zb, w: wb, y: yb, S, heads, n, eps: EPS }));
          worst = Math.max(worst, expectClose({ heads, n, S }, { out: relMaxErr(ref, f32(yb, R * n)) }));
          expectTail(yb, R * n, "gated norm y");
          // in place: y = x
          submitAndWait(device, (cb) => kernel.record(cb, { x: xb, z: zb, w: wb, y: xb, S, heads, n, eps: EPS }));
          expect(Array.from(f32(xb, R * n))).toEqual(Array.from(f32(yb, R * n)));
        }
      }
      console.log(`  gated norm ${name}: worst relative error ${worst.toExponential(2)}`);
    }, 60_000);
  }

  test("offsets and token strides", () => {
    const S = 3, heads = 2, n = 32, row = heads * n, xStride = row + 7, zStride = row + 3, yStride = row + 5, xOff = 4, zOff = 9, wOff = 2, yOff = 6;
    const xAll = random(xOff + S * xStride), zAll = random(zOff + S * zStride), w = random(wOff + n);
    const x = new Float32Array(S * row), z = new Float32Array(S * row);
    for (let t = 0; t < S; t++) {
      x.set(xAll.subarray(xOff + t * xStride, xOff + t * xStride + row), t * row);
      z.set(zAll.subarray(zOff + t * zStride, zOff + t * zStride + row), t * row);
    }
    const ref = new Float32Array(S * row);
    gatedRmsNorm(x, z, w.subarray(wOff), S * heads, n, EPS, ref);
    using xb = bufferOf(xAll);
    using zb = bufferOf(zAll);
    using wb = bufferOf(w);
    using yb = outBuffer(yOff + S * yStride);
    submitAndWait(device, (cb) => gatedNorm.record(cb, { x: xb, z: zb, w: wb, y: yb, S, heads, n, eps: EPS, xOffset: xOff, xStride, zOffset: zOff, zStride, wOffset: wOff, yOffset: yOff, yStride }));
    const got = new Float32Array(S * row);
    for (let t = 0; t < S; t++) got.set(f32(yb, row, yOff + t * yStride), t * row);
    expectClose({ S }, { out: relMaxErr(ref, got) });
    expectTail(yb, yOff + S * yStride, "y");
  });
});

// ---------------------------------------------------------------------------------------------
describe("conv1d → delta rule (+ gated norm) chained as the layer runs them, vs the CPU layer's path", () => {
  test("tiny fixture and dims 128 GQA 2: a 17-token prompt chunk (CPU: chunked), then two decode tokens (CPU: recurrent)", () => {
    for (const shape of [TINY, DELTA_SHAPES[2]![1]]) {
      const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv } = shape;
      const Kd = Hk * Dk, Vd = Hv * Dv, C = 2 * Kd + Vd, calls = [17, 1, 1], S = 19;
      const kernel = deltaKernel(Dk, Dv);
      // the in_proj_qkv output (conv input) and the other projections, random; the layer's parameters
      const mixed = random(S * C), convW = random(C * KERNEL, 0.5);
      const x = layerInputs(shape, S, random);
      const convState0 = random(C * (KERNEL - 1)), deltaState0 = random(Hv * Dk * Dv, 0.5);
      // CPU: as hybrid-decoder.ts deltaNet, call by call
      const cpuConv = convState0.slice(), cpuDelta = deltaState0.slice(), ref = new Float32Array(S * Vd);
      let t0 = 0;
      for (const n of calls) {
        const convOut = new Float32Array(n * C);
        causalConv1dSilu(mixed.subarray(t0 * C, (t0 + n) * C), n, C, KERNEL, convW, cpuConv, convOut);
        const part: LayerInputs = {
          ...x,
          q: new Float32Array(n * Kd), k: new Float32Array(n * Kd), v: new Float32Array(n * Vd),
          a: x.a.subarray(t0 * Hv, (t0 + n) * Hv), b: x.b.subarray(t0 * Hv, (t0 + n) * Hv), z: x.z.subarray(t0 * Vd, (t0 + n) * Vd),
        };
        for (let t = 0; t < n; t++) {
          part.q.set(convOut.subarray(t * C, t * C + Kd), t * Kd);
          part.k.set(convOut.subarray(t * C + Kd, t * C + 2 * Kd), t * Kd);
          part.v.set(convOut.subarray(t * C + 2 * Kd, (t + 1) * C), t * Vd);
        }
        ref.set(cpuLayer(shape, part, n, cpuDelta, true, n === 1 ? "recurrent" : "chunked"), t0 * Vd);
        t0 += n;
      }
      // GPU: conv output rows feed the delta rule directly (default q|k|v layout)
      using layer = new DeviceLayer(shape, x, S);
      using mb = bufferOf(mixed);
      using cw = bufferOf(convW);
      using cs = bufferOf(convState0);
      using co = outBuffer(S * C);
      using ds = bufferOf(deltaState0);
      using ob = outBuffer(S * Vd);
      submitAndWait(device, (cb) => {
        let t = 0;
        for (const n of calls) {
          if (t > 0) cb.barrier("computeToCompute");
          conv.record(cb, { x: mb, weight: cw, state: cs, out: co, S: n, channels: C, xOffset: t * C, outOffset: t * C });
          cb.barrier("computeToCompute");
          const args = layer.args(shape, t, n, ds, ob, true);
          kernel.record(cb, { ...args, qkv: co, qOffset: t * C, kOffset: t * C + Kd, vOffset: t * C + 2 * Kd });
          t += n;
        }
      });
      expectClose({ shape }, { out: relMaxErr(ref, f32(ob, S * Vd)), deltaState: relMaxErr(cpuDelta, f32(ds, cpuDelta.length)), convState: relMaxErr(cpuConv, f32(cs, cpuConv.length)) });
      expectTail(ob, S * Vd, "out");
    }
  }, 60_000);
});
