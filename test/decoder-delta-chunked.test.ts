/**
 * The chunk-parallel gated delta rule on the GPU (shaders/dec_delta_rule_chunked.comp,
 * DeltaRuleChunkedKernel) on the real driver, under the validation layer, against the f64 CPU
 * reference (src/model/linear-attention.ts gatedDeltaRuleRecurrent, + gatedRmsNorm) and against the
 * recurrent GPU kernel (dec_delta_rule) on the same inputs: seeded random data, every call from a
 * non-zero state; GQA 1 and 2; dims 128, the tiny fixture's 32, 64 x 32 and 40 x 24 (neither a
 * multiple of a key tile nor of a value slice); S = 1, 16, 37, 64; one call, and two calls of the
 * same tokens (the state carried); with and without the gated norm; the gates from a/b and given.
 * Bounds: NMSE (sum (got - ref)^2 / sum ref^2) <= 1e-9 against the f64 reference, and
 * max |got - ref| / max |ref| <= 1e-5 (test/decoder-linear-attention.test.ts's bound for the
 * recurrent kernel), per output and per state. Every output buffer carries sentinel words past its end.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { DeltaRuleChunkedKernel, DeltaRuleKernel, type DeltaRuleArgs } from "../src/kernels/decoder/delta-rule.ts";
import { gatedDeltaRuleRecurrent, gatedRmsNorm, type DeltaRuleShape } from "../src/model/linear-attention.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer } from "./support/host-buffers.ts";

const NMSE_BOUND = 1e-9;
const REL_BOUND = 1e-5;
const EPS = 1e-6;

// synchronization validation too: the graph records several of these calls between barriers
const ctx = openTestContext({ syncValidation: true });
const device = ctx.device;
const kernels = new Map<string, DeltaRuleKernel | DeltaRuleChunkedKernel>();
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of kernels.values()) k[Symbol.dispose]();
  finish(ctx);
});

/** One kernel object per (kind, dims, slice), as a graph holds one per layer shape. */
function chunkedKernel(shape: DeltaRuleShape, valueSlice: 16 | 32 = 16): DeltaRuleChunkedKernel {
  const key = `chunked ${shape.keyDim}x${shape.valueDim}/${valueSlice}`;
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = new DeltaRuleChunkedKernel(device, { keyDim: shape.keyDim, valueDim: shape.valueDim }, { valueSlice })));
  return k as DeltaRuleChunkedKernel;
}
function recurrentKernel(shape: DeltaRuleShape): DeltaRuleKernel {
  const key = `recurrent ${shape.keyDim}x${shape.valueDim}`;
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = new DeltaRuleKernel(device, { keyDim: shape.keyDim, valueDim: shape.valueDim })));
  return k as DeltaRuleKernel;
}

let seed = 7001;
const random = (n: number, std = 1) => randomGaussianF32(n, seed++, std);

function bufferOf(data: Float32Array): Buffer {
  const b = hostBuffer(device, data.length);
  f32(b, data.length).set(data);
  return b;
}

/** sum (got - ref)^2 / sum ref^2 (NaN: Infinity). */
function nmse(ref: ArrayLike<number>, got: ArrayLike<number>): number {
  expect(got.length).toBe(ref.length);
  let err = 0, mag = 0;
  for (let i = 0; i < ref.length; i++) {
    err += (got[i]! - ref[i]!) ** 2;
    mag += ref[i]! ** 2;
  }
  const r = mag === 0 ? err : err / mag;
  return Number.isNaN(r) ? Infinity : r;
}

/** max |got - ref| / max |ref|. */
function relMaxErr(ref: ArrayLike<number>, got: ArrayLike<number>): number {
  let err = 0, mag = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = Math.abs(ref[i]! - got[i]!);
    if (!(d <= err)) err = Number.isNaN(d) ? Infinity : d;
    mag = Math.max(mag, Math.abs(ref[i]!));
  }
  return mag === 0 ? err : err / mag;
}

interface Errors { nmse: number; rel: number }
const worstOf = (a: Errors, b: Errors): Errors => ({ nmse: Math.max(a.nmse, b.nmse), rel: Math.max(a.rel, b.rel) });
const NONE: Errors = { nmse: 0, rel: 0 };

/** out and state of `got` against `ref`, both bounds, the case in the failure message; returns the worse errors. */
function expectClose(label: Record<string, unknown>, ref: { out: Float32Array; state: Float32Array }, got: { out: Float32Array; state: Float32Array }): Errors {
  const e = { outNmse: nmse(ref.out, got.out), stateNmse: nmse(ref.state, got.state), outRel: relMaxErr(ref.out, got.out), stateRel: relMaxErr(ref.state, got.state) };
  const ok = e.outNmse <= NMSE_BOUND && e.stateNmse <= NMSE_BOUND && e.outRel <= REL_BOUND && e.stateRel <= REL_BOUND;
  expect({ ...label, ...e, ok }).toMatchObject({ ...label, ok: true });
  return { nmse: Math.max(e.outNmse, e.stateNmse), rel: Math.max(e.outRel, e.stateRel) };
}

interface LayerInputs {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  a: Float32Array;
  b: Float32Array;
  negA: Float32Array;
  dtBias: Float32Array;
  z: Float32Array;
  normW: Float32Array;
}

function layerInputs(shape: DeltaRuleShape, S: number): LayerInputs {
  const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv } = shape;
  // −exp(A_log) from slow (0.02) to fast (4) decay across heads, as trained layers have; dt_bias around −1
  const negA = Float32Array.from({ length: Hv }, (_, h) => -Math.fround(0.02 * 200 ** (h / Math.max(1, Hv - 1))));
  return {
    q: random(S * Hk * Dk), k: random(S * Hk * Dk), v: random(S * Hv * Dv),
    a: random(S * Hv), b: random(S * Hv, 2), negA, dtBias: random(Hv).map((x) => x - 1),
    z: random(S * Hv * Dv), normW: random(Dv, 0.3).map((x) => x + 1),
  };
}

/** beta and g as src/model/hybrid-decoder.ts computes them (sigmoid; torch's softplus, threshold 20). */
function gates(x: LayerInputs, S: number, Hv: number): { g: Float32Array; beta: Float32Array } {
  const softplus = (v: number) => (v > 20 ? v : Math.log1p(Math.exp(v)));
  const g = new Float32Array(S * Hv), beta = new Float32Array(S * Hv);
  for (let i = 0; i < S * Hv; i++) {
    const h = i % Hv;
    beta[i] = 1 / (1 + Math.exp(-x.b[i]!));
    g[i] = x.negA[h]! * Math.fround(softplus(Math.fround(x.a[i]! + x.dtBias[h]!)));
  }
  return { g, beta };
}

/** The f64 CPU reference over all S tokens from `state0`: the recurrent rule, then optionally the gated norm. */
function cpuLayer(shape: DeltaRuleShape, x: LayerInputs, S: number, state0: Float32Array, norm: boolean): { out: Float32Array; state: Float32Array } {
  const { g, beta } = gates(x, S, shape.valueHeads);
  const out = new Float32Array(S * shape.valueHeads * shape.valueDim);
  const state = state0.slice();
  gatedDeltaRuleRecurrent(shape, x.q, x.k, x.v, g, beta, S, { recurrent: state }, out);
  if (norm) gatedRmsNorm(out, x.z, x.normW, S * shape.valueHeads, shape.valueDim, EPS, out);
  return { out, state };
}

/**
 * The layer inputs in device buffers as the graph holds them: q|k|v rows (the conv output) with
 * `pad` extra floats a row, a, b, z, one params buffer with its fields past zero; with `gatesGiven`
 * g and beta in one buffer instead of a and b.
 */
class DeviceLayer implements Disposable {
  readonly qkv: Buffer;
  readonly a: Buffer;
  readonly b: Buffer;
  readonly z: Buffer;
  readonly params: Buffer;
  readonly gb: Buffer;
  readonly row: number;
  readonly offsets = { negA: 3, dtBias: 0, norm: 0, g: 5, beta: 0 };

  constructor(readonly shape: DeltaRuleShape, x: LayerInputs, readonly S: number, pad = 0) {
    const Kd = shape.keyHeads * shape.keyDim, Vd = shape.valueHeads * shape.valueDim, Hv = shape.valueHeads;
    this.row = 2 * Kd + Vd + pad;
    const qkv = new Float32Array(S * this.row);
    for (let t = 0; t < S; t++) {
      qkv.set(x.q.subarray(t * Kd, (t + 1) * Kd), t * this.row);
      qkv.set(x.k.subarray(t * Kd, (t + 1) * Kd), t * this.row + Kd);
      qkv.set(x.v.subarray(t * Vd, (t + 1) * Vd), t * this.row + 2 * Kd);
    }
    this.offsets.dtBias = 3 + Hv;
    this.offsets.norm = 3 + 2 * Hv;
    const params = new Float32Array(3 + 2 * Hv + shape.valueDim);
    params.set(x.negA, this.offsets.negA);
    params.set(x.dtBias, this.offsets.dtBias);
    params.set(x.normW, this.offsets.norm);
    const { g, beta } = gates(x, S, Hv);
    this.offsets.beta = this.offsets.g + S * Hv;
    const gb = new Float32Array(this.offsets.beta + S * Hv);
    gb.set(g, this.offsets.g);
    gb.set(beta, this.offsets.beta);
    this.qkv = bufferOf(qkv);
    this.a = bufferOf(x.a);
    this.b = bufferOf(x.b);
    this.z = bufferOf(x.z);
    this.params = bufferOf(params);
    this.gb = bufferOf(gb);
  }

  /** The arguments for tokens t0 .. t0 + S − 1 (state at stateOffset, out at outOffset + t · Vd). */
  args(t0: number, S: number, state: Buffer, out: Buffer, o: { norm: boolean; gatesGiven?: boolean; stateOffset?: number; outOffset?: number }): DeltaRuleArgs {
    const shape = this.shape, Kd = shape.keyHeads * shape.keyDim, Vd = shape.valueHeads * shape.valueDim, Hv = shape.valueHeads, row = this.row;
    const outOffset = (o.outOffset ?? 0) + t0 * Vd;
    const gatesFrom = o.gatesGiven
      ? { a: this.gb, b: this.gb, aOffset: this.offsets.g + t0 * Hv, bOffset: this.offsets.beta + t0 * Hv, gatesGiven: true }
      : { a: this.a, b: this.b, aOffset: t0 * Hv, bOffset: t0 * Hv };
    return {
      S, keyHeads: shape.keyHeads, valueHeads: Hv,
      qkv: this.qkv, qOffset: t0 * row, kOffset: t0 * row + Kd, vOffset: t0 * row + 2 * Kd, qkvStride: row,
      ...gatesFrom,
      // the gates given and no norm: the params buffer is not needed
      params: o.gatesGiven && !o.norm ? undefined : this.params, negAOffset: this.offsets.negA, dtBiasOffset: this.offsets.dtBias,
      state, stateOffset: o.stateOffset ?? 0, out, outOffset,
      norm: o.norm ? { z: this.z, zOffset: t0 * Vd, weightOffset: this.offsets.norm, eps: EPS } : undefined,
    };
  }

  [Symbol.dispose](): void {
    for (const b of [this.gb, this.params, this.z, this.b, this.a, this.qkv]) b[Symbol.dispose]();
  }
}

type Kernel = DeltaRuleKernel | DeltaRuleChunkedKernel;

/** Runs the calls (token counts, each through its kernel, a barrier between) on one submit from `state0`; returns out and the state. */
function gpuLayer(shape: DeltaRuleShape, x: LayerInputs, state0: Float32Array, calls: [Kernel, number][], o: { norm: boolean; gatesGiven?: boolean; pad?: number; stateOffset?: number; outOffset?: number }): { out: Float32Array; state: Float32Array } {
  const S = calls.reduce((n, [, c]) => n + c, 0), Vd = shape.valueHeads * shape.valueDim;
  const stateOffset = o.stateOffset ?? 0, outOffset = o.outOffset ?? 0;
  using layer = new DeviceLayer(shape, x, S, o.pad ?? 0);
  const st = new Float32Array(stateOffset + state0.length);
  st.set(state0, stateOffset);
  using sb = bufferOf(st);
  using ob = hostBuffer(device, outOffset + S * Vd);
  submitAndWait(device, (cb) => {
    let t0 = 0;
    for (const [i, [kernel, n]] of calls.entries()) {
      if (i > 0) cb.barrier("computeToCompute");
      kernel.record(cb, layer.args(t0, n, sb, ob, o));
      t0 += n;
    }
  });
  expectTail(ob, outOffset + S * Vd, "delta rule out");
  expectTail(sb, st.length, "delta rule state");
  // nothing before the offsets written
  expect(Array.from(f32(sb, stateOffset))).toEqual(Array.from(st.subarray(0, stateOffset)));
  return { out: f32(ob, S * Vd, outOffset).slice(), state: f32(sb, state0.length, stateOffset).slice() };
}

const SHAPES: [string, DeltaRuleShape][] = [
  ["dims 128, GQA 1 (2 / 2 heads)", { keyHeads: 2, valueHeads: 2, keyDim: 128, valueDim: 128 }],
  ["dims 128, GQA 2 (2 / 4 heads)", { keyHeads: 2, valueHeads: 4, keyDim: 128, valueDim: 128 }],
  ["tiny fixture (dims 32, 2 / 4 heads)", { keyHeads: 2, valueHeads: 4, keyDim: 32, valueDim: 32 }],
  ["keyDim 64 > valueDim 32, GQA 2", { keyHeads: 2, valueHeads: 4, keyDim: 64, valueDim: 32 }],
  ["keyDim 40, valueDim 24 (partial tiles and slices), GQA 1 (3 / 3 heads)", { keyHeads: 3, valueHeads: 3, keyDim: 40, valueDim: 24 }],
];
const SIZES = [1, 16, 37, 64];
/** Two-call splits of each S (the second call continues from the first's state). */
const split = (S: number) => Math.ceil(S / 3);
const stateOf = (shape: DeltaRuleShape) => random(shape.valueHeads * shape.keyDim * shape.valueDim, 0.5);

describe("dec_delta_rule_chunked vs the f64 reference and vs dec_delta_rule (gates from a, b; non-zero starting state)", () => {
  for (const [label, shape] of SHAPES) {
    test(`${label}: S = ${SIZES.join(", ")}, one call and two calls == one, without and with the gated norm`, () => {
      const chunked = chunkedKernel(shape), recurrent = recurrentKernel(shape);
      let worst = NONE, worstVsRecurrent = 0, recurrentWorst = NONE;
      for (const S of SIZES) {
        for (const norm of [false, true]) {
          const x = layerInputs(shape, S), state0 = stateOf(shape);
          const ref = cpuLayer(shape, x, S, state0, norm);
          for (const calls of S === 1 ? [[1]] : [[S], [split(S), S - split(S)]]) {
            const got = gpuLayer(shape, x, state0, calls.map((n) => [chunked, n]), { norm });
            worst = worstOf(worst, expectClose({ label, S, calls, norm }, ref, got));
            const rec = gpuLayer(shape, x, state0, calls.map((n) => [recurrent, n]), { norm });
            recurrentWorst = worstOf(recurrentWorst, { nmse: Math.max(nmse(ref.out, rec.out), nmse(ref.state, rec.state)), rel: Math.max(relMaxErr(ref.out, rec.out), relMaxErr(ref.state, rec.state)) });
            const vsRecurrent = Math.max(nmse(rec.out, got.out), nmse(rec.state, got.state));
            expect({ label, S, calls, norm, vsRecurrent }).toMatchObject({ label, S, calls, norm });
            expect(vsRecurrent).toBeLessThanOrEqual(NMSE_BOUND);
            worstVsRecurrent = Math.max(worstVsRecurrent, vsRecurrent);
          }
        }
      }
      console.log(
        `  chunked ${label}: vs f64 worst NMSE ${worst.nmse.toExponential(2)}, rel ${worst.rel.toExponential(2)}` +
          ` (recurrent kernel: ${recurrentWorst.nmse.toExponential(2)}, ${recurrentWorst.rel.toExponential(2)}); vs the recurrent kernel NMSE ${worstVsRecurrent.toExponential(2)}`,
      );
    }, 120_000);
  }
});

describe("dec_delta_rule_chunked: slices, given gates, offsets, chunks in a row", () => {
  test("valueSlice 32 (8 key rows a tile): dims 128 GQA 2 and 40 x 24, S = 16, 64, two calls, with the norm", () => {
    let worst = NONE;
    for (const [label, shape] of [SHAPES[1]!, SHAPES[4]!]) {
      const kernel = chunkedKernel(shape, 32);
      for (const S of [16, 64]) {
        const x = layerInputs(shape, S), state0 = stateOf(shape);
        const ref = cpuLayer(shape, x, S, state0, true);
        const got = gpuLayer(shape, x, state0, [[kernel, split(S)], [kernel, S - split(S)]], { norm: true });
        worst = worstOf(worst, expectClose({ label, S, slice: 32 }, ref, got));
      }
    }
    console.log(`  chunked, valueSlice 32: worst NMSE ${worst.nmse.toExponential(2)}, rel ${worst.rel.toExponential(2)}`);
  }, 120_000);

  test("g and beta given (flags bit 1), padded qkv rows, state and out past zero; without and with the norm (params unbound without)", () => {
    let worst = NONE;
    for (const [label, shape] of [SHAPES[0]!, SHAPES[2]!, SHAPES[4]!]) {
      const kernel = chunkedKernel(shape);
      for (const norm of [false, true]) {
        const S = 37, x = layerInputs(shape, S), state0 = stateOf(shape);
        const ref = cpuLayer(shape, x, S, state0, norm);
        const got = gpuLayer(shape, x, state0, [[kernel, 20], [kernel, 17]], { norm, gatesGiven: true, pad: 5, stateOffset: 13, outOffset: 11 });
        worst = worstOf(worst, expectClose({ label, S, norm, gatesGiven: true }, ref, got));
      }
    }
    console.log(`  chunked, gates given: worst NMSE ${worst.nmse.toExponential(2)}, rel ${worst.rel.toExponential(2)}`);
  }, 120_000);

  test("a prompt as the graph runs it: chunks of 64, 64, 37 (chunked), then decode tokens (recurrent), then a chunk of 16 (chunked): 184 tokens on one state", () => {
    let worst = NONE;
    for (const [label, shape] of [SHAPES[1]!, SHAPES[2]!]) {
      const chunked = chunkedKernel(shape), recurrent = recurrentKernel(shape);
      const calls: [Kernel, number][] = [[chunked, 64], [chunked, 64], [chunked, 37], [recurrent, 1], [recurrent, 1], [recurrent, 1], [chunked, 16]];
      const S = calls.reduce((n, [, c]) => n + c, 0);
      const x = layerInputs(shape, S), state0 = stateOf(shape);
      const ref = cpuLayer(shape, x, S, state0, true);
      const got = gpuLayer(shape, x, state0, calls, { norm: true });
      worst = worstOf(worst, expectClose({ label, S }, ref, got));
    }
    console.log(`  chunked, 184 tokens over 7 calls: worst NMSE ${worst.nmse.toExponential(2)}, rel ${worst.rel.toExponential(2)}`);
  }, 120_000);

  test("recordCore per head group, one barrier, one recordNorm over all heads (as the graph runs llama.cpp's tiled heads): dims 128, 2 / 2 heads as two calls of one head, S = 64", () => {
    const shape = SHAPES[0]![1], { keyDim: Dk, valueDim: Dv, valueHeads: Hv } = shape, Kd = shape.keyHeads * Dk, Vd = Hv * Dv;
    const kernel = chunkedKernel(shape), S = 64;
    const x = layerInputs(shape, S), state0 = stateOf(shape);
    const ref = cpuLayer(shape, x, S, state0, true);
    using layer = new DeviceLayer(shape, x, S);
    using sb = bufferOf(state0);
    using ob = hostBuffer(device, S * Vd);
    const groupArgs = (j: number): DeltaRuleArgs => {
      const full = layer.args(0, S, sb, ob, { norm: true });
      return {
        ...full, keyHeads: 1, valueHeads: 1,  // head j: its own key head (GQA 1)
        qOffset: j * Dk, kOffset: Kd + j * Dk, vOffset: 2 * Kd + j * Dv,
        aOffset: j, aStride: Hv, bOffset: j, bStride: Hv, negAOffset: layer.offsets.negA + j, dtBiasOffset: layer.offsets.dtBias + j,
        stateOffset: j * Dk * Dv, outOffset: j * Dv, outStride: Vd,
        norm: { ...full.norm!, zOffset: j * Dv, zStride: Vd },
      };
    };
    submitAndWait(device, (cb) => {
      for (let j = 0; j < Hv; j++) kernel.recordCore(cb, groupArgs(j));
      cb.barrier("computeToCompute");
      kernel.recordNorm(cb, layer.args(0, S, sb, ob, { norm: true }));
    });
    expectTail(ob, S * Vd, "out");
    expectTail(sb, state0.length, "state");
    const e = expectClose({ groups: Hv, S }, ref, { out: f32(ob, S * Vd).slice(), state: f32(sb, state0.length).slice() });
    console.log(`  chunked, per-group cores then norms: NMSE ${e.nmse.toExponential(2)}, rel ${e.rel.toExponential(2)}`);
  }, 120_000);

  test("extreme decays: g near 0 on some heads, about -60 a token on others (exp(G) alone underflows over a chunk): finite and within the bounds", () => {
    let worst = NONE;
    for (const [label, shape] of [SHAPES[1]!, SHAPES[2]!]) {
      const kernel = chunkedKernel(shape);
      const S = 64, x = layerInputs(shape, S), state0 = stateOf(shape);
      x.negA = Float32Array.from({ length: shape.valueHeads }, (_, h) => (h % 2 === 0 ? -1e-4 : -200));
      const ref = cpuLayer(shape, x, S, state0, false);
      const got = gpuLayer(shape, x, state0, [[kernel, S]], { norm: false });
      expect(got.out.every(Number.isFinite) && got.state.every(Number.isFinite)).toBe(true);
      worst = worstOf(worst, expectClose({ label, S, extreme: true }, ref, got));
    }
    console.log(`  chunked, extreme decays: worst NMSE ${worst.nmse.toExponential(2)}, rel ${worst.rel.toExponential(2)}`);
  }, 120_000);

  test("a fast decay, then slow ones (G about -4000 a chunk, its nearby differences small: the compensated cumulative sum), g given", () => {
    let worst = NONE;
    for (const [label, shape] of [SHAPES[1]!, SHAPES[4]!]) {
      const kernel = chunkedKernel(shape), Hv = shape.valueHeads, S = 64;
      const x = layerInputs(shape, S), state0 = stateOf(shape);
      // g = -1000 on the first 4 tokens, then -U(0, 0.01): without compensation G_i - G_j of the later tokens carries 2.4e-4 of rounding
      const gGiven = Float32Array.from({ length: S * Hv }, (_, i) => (i < 4 * Hv ? -1000 : -0.01 * Math.abs(Math.sin(i))));
      const beta = gates(x, S, Hv).beta;
      const out = new Float32Array(S * Hv * shape.valueDim), state = state0.slice();
      gatedDeltaRuleRecurrent(shape, x.q, x.k, x.v, gGiven, beta, S, { recurrent: state }, out);
      using layer = new DeviceLayer(shape, x, S);
      f32(layer.gb, S * Hv, layer.offsets.g).set(gGiven);
      using sb = bufferOf(state0);
      using ob = hostBuffer(device, S * Hv * shape.valueDim);
      submitAndWait(device, (cb) => kernel.record(cb, layer.args(0, S, sb, ob, { norm: false, gatesGiven: true })));
      worst = worstOf(worst, expectClose({ label, S, fastThenSlow: true }, { out, state }, { out: f32(ob, out.length).slice(), state: f32(sb, state.length).slice() }));
    }
    console.log(`  chunked, fast then slow decays: worst NMSE ${worst.nmse.toExponential(2)}, rel ${worst.rel.toExponential(2)}`);
  }, 120_000);

  test("bad arguments are InvalidArgumentErrors", () => {
    const kernel = chunkedKernel({ keyHeads: 2, valueHeads: 4, keyDim: 32, valueDim: 32 });
    using b = hostBuffer(device, 1 << 16);
    const base: DeltaRuleArgs = { S: 1, keyHeads: 2, valueHeads: 4, qkv: b, a: b, b: b, params: b, state: b, stateOffset: 4096, out: b, outOffset: 32768 };
    // the base call is good
    submitAndWait(device, (cb) => kernel.record(cb, base));
    const runs = { table: b, stateStride: 4096, states: 1 };
    for (const bad of [{ S: 0 }, { S: 65 }, { valueHeads: 3 }, { outOffset: 0 }, { params: undefined }, { stateOffset: (1 << 16) - 100 }, { runs }] as Partial<DeltaRuleArgs>[]) {
      expect(() => submitAndWait(device, (cb) => kernel.record(cb, { ...base, ...bad }))).toThrow(InvalidArgumentError);
    }
    expect(() => new DeltaRuleChunkedKernel(device, { keyDim: 128, valueDim: 128 }, { valueSlice: 8 as 16 })).toThrow(InvalidArgumentError);
    expect(() => new DeltaRuleChunkedKernel(device, { keyDim: 0, valueDim: 128 })).toThrow(InvalidArgumentError);
  });
});
