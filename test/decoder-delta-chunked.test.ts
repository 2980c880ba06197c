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
import { gatedDeltaRuleRecurrent, type DeltaRuleShape } from "../src/model/linear-attention.ts";
import { bufferOf as deviceBuffer, cpuLayer, DeviceLayer as LayerBuffers, expectClose, gates, layerInputs as inputsOf, type LayerCall, type LayerInputs, type LayerRunOptions, nmse, runLayerCalls, NMSE_BOUND, NONE, relMaxErr, seededRandom, worstOf, DELTA_SHAPES } from "./support/delta-layer.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer } from "./support/host-buffers.ts";

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

const random = seededRandom(7001);
const bufferOf = (data: Float32Array) => deviceBuffer(device, data);
const layerInputs = (shape: DeltaRuleShape, S: number) => inputsOf(shape, S, random);
class DeviceLayer extends LayerBuffers {
  constructor(shape: DeltaRuleShape, x: LayerInputs, S: number, pad = 0) {
    super(device, shape, x, S, pad);
  }
}

type Kernel = DeltaRuleKernel | DeltaRuleChunkedKernel;

/** Runs the calls (token counts, each through its kernel, a barrier between) on one submit from `state0`; returns out and the state. */
function gpuLayer(shape: DeltaRuleShape, x: LayerInputs, state0: Float32Array, calls: [Kernel, number][], o: LayerRunOptions): { out: Float32Array; state: Float32Array } {
  return runLayerCalls(device, shape, x, state0, calls.map(([kernel, n]): LayerCall => [(cb, args) => kernel.record(cb, args), n]), o);
}

const SIZES = [1, 16, 37, 64];
/** Two-call splits of each S (the second call continues from the first's state). */
const split = (S: number) => Math.ceil(S / 3);
const stateOf = (shape: DeltaRuleShape) => random(shape.valueHeads * shape.keyDim * shape.valueDim, 0.5);

describe("dec_delta_rule_chunked vs the f64 reference and vs dec_delta_rule (gates from a, b; non-zero starting state)", () => {
  for (const [label, shape] of DELTA_SHAPES) {
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
    for (const [label, shape] of [DELTA_SHAPES[1]!, DELTA_SHAPES[4]!]) {
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
    for (const [label, shape] of [DELTA_SHAPES[0]!, DELTA_SHAPES[2]!, DELTA_SHAPES[4]!]) {
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
    for (const [label, shape] of [DELTA_SHAPES[1]!, DELTA_SHAPES[2]!]) {
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
    const shape = DELTA_SHAPES[0]![1], { keyDim: Dk, valueDim: Dv, valueHeads: Hv } = shape, Kd = shape.keyHeads * Dk, Vd = Hv * Dv;
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
    for (const [label, shape] of [DELTA_SHAPES[1]!, DELTA_SHAPES[2]!]) {
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
    for (const [label, shape] of [DELTA_SHAPES[1]!, DELTA_SHAPES[4]!]) {
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
