/**
 * The gated delta rule kernels' test data (test/decoder-delta-chunked.test.ts, decoder-delta-split.test.ts):
 * seeded layer inputs, the f64 CPU reference (src/model/linear-attention.ts gatedDeltaRuleRecurrent,
 * + gatedRmsNorm), the inputs in device buffers as the graph holds them, and the error measures and bounds.
 */
import { expect } from "bun:test";
import type { DeltaRuleArgs } from "../../src/kernels/decoder/delta-rule.ts";
import { gatedDeltaRuleRecurrent, gatedRmsNorm, type DeltaRuleShape } from "../../src/model/linear-attention.ts";
import { randomGaussianF32 } from "../../src/quant/random.ts";
import { submitAndWait } from "../../src/kernels/decoder/common.ts";
import type { CommandBuffer } from "../../src/vk/commands.ts";
import type { Device } from "../../src/vk/device.ts";
import type { Buffer } from "../../src/vk/memory.ts";
import { expectTail, f32, hostBuffer } from "./host-buffers.ts";

/** NMSE (sum (got - ref)^2 / sum ref^2) against the f64 reference, and max |got - ref| / max |ref| (the recurrent kernel's bound). */
export const NMSE_BOUND = 1e-9;
export const REL_BOUND = 1e-5;
export const EPS = 1e-6;

/** The delta-rule kernels' test shapes: dims 128 at GQA 1 and 2, the tiny fixture's, keyDim past valueDim, and dims that are neither a key tile nor a value slice. */
export const DELTA_SHAPES: [string, DeltaRuleShape][] = [
  ["dims 128, GQA 1 (2 / 2 heads)", { keyHeads: 2, valueHeads: 2, keyDim: 128, valueDim: 128 }],
  ["dims 128, GQA 2 (2 / 4 heads)", { keyHeads: 2, valueHeads: 4, keyDim: 128, valueDim: 128 }],
  ["tiny fixture (dims 32, 2 / 4 heads)", { keyHeads: 2, valueHeads: 4, keyDim: 32, valueDim: 32 }],
  ["keyDim 64 > valueDim 32, GQA 2", { keyHeads: 2, valueHeads: 4, keyDim: 64, valueDim: 32 }],
  ["keyDim 40, valueDim 24 (partial tiles and slices), GQA 1 (3 / 3 heads)", { keyHeads: 3, valueHeads: 3, keyDim: 40, valueDim: 24 }],
];

/** Seeded Gaussian arrays, each call the next seed from `seed`. */
export type RandomArrays = (n: number, std?: number) => Float32Array;
export function seededRandom(seed: number): RandomArrays {
  return (n, std = 1) => randomGaussianF32(n, seed++, std);
}

export function bufferOf(device: Device, data: Float32Array): Buffer {
  const b = hostBuffer(device, data.length);
  f32(b, data.length).set(data);
  return b;
}

/** sum (got - ref)^2 / sum ref^2 (NaN: Infinity). */
export function nmse(ref: ArrayLike<number>, got: ArrayLike<number>): number {
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
export function relMaxErr(ref: ArrayLike<number>, got: ArrayLike<number>): number {
  expect(got.length).toBe(ref.length);
  let err = 0, mag = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = Math.abs(ref[i]! - got[i]!);
    if (!(d <= err)) err = Number.isNaN(d) ? Infinity : d;
    mag = Math.max(mag, Math.abs(ref[i]!));
  }
  return mag === 0 ? err : err / mag;
}

export interface Errors { nmse: number; rel: number }
export const worstOf = (a: Errors, b: Errors): Errors => ({ nmse: Math.max(a.nmse, b.nmse), rel: Math.max(a.rel, b.rel) });
export const NONE: Errors = { nmse: 0, rel: 0 };

/** out and state of `got` against `ref`, both bounds, the case in the failure message; returns the worse errors. */
export function expectClose(label: Record<string, unknown>, ref: { out: Float32Array; state: Float32Array }, got: { out: Float32Array; state: Float32Array }): Errors {
  const e = { outNmse: nmse(ref.out, got.out), stateNmse: nmse(ref.state, got.state), outRel: relMaxErr(ref.out, got.out), stateRel: relMaxErr(ref.state, got.state) };
  const ok = e.outNmse <= NMSE_BOUND && e.stateNmse <= NMSE_BOUND && e.outRel <= REL_BOUND && e.stateRel <= REL_BOUND;
  expect({ ...label, ...e, ok }).toMatchObject({ ...label, ok: true });
  return { nmse: Math.max(e.outNmse, e.stateNmse), rel: Math.max(e.outRel, e.stateRel) };
}

export interface LayerInputs {
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

export function layerInputs(shape: DeltaRuleShape, S: number, random: RandomArrays): LayerInputs {
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
export function gates(x: LayerInputs, S: number, Hv: number): { g: Float32Array; beta: Float32Array } {
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
export function cpuLayer(shape: DeltaRuleShape, x: LayerInputs, S: number, state0: Float32Array, norm: boolean): { out: Float32Array; state: Float32Array } {
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
export class DeviceLayer implements Disposable {
  readonly qkv: Buffer;
  readonly a: Buffer;
  readonly b: Buffer;
  readonly z: Buffer;
  readonly params: Buffer;
  readonly gb: Buffer;
  readonly row: number;
  readonly offsets = { negA: 3, dtBias: 0, norm: 0, g: 5, beta: 0 };

  constructor(readonly device: Device, readonly shape: DeltaRuleShape, x: LayerInputs, readonly S: number, pad = 0) {
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
    this.qkv = bufferOf(device, qkv);
    this.a = bufferOf(device, x.a);
    this.b = bufferOf(device, x.b);
    this.z = bufferOf(device, x.z);
    this.params = bufferOf(device, params);
    this.gb = bufferOf(device, gb);
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

export interface LayerRunOptions { norm: boolean; gatesGiven?: boolean; pad?: number; stateOffset?: number; outOffset?: number }
/** A call of `tokens` tokens, recorded by `record` from its arguments. */
export type LayerCall = [record: (cb: CommandBuffer, args: DeltaRuleArgs) => void, tokens: number];

/**
 * Runs the calls one after another (a barrier between) on one submit from `state0`, the outputs and
 * state past the offsets, sentinels checked past their ends and nothing before the state's offset
 * written; returns out and the state.
 */
export function runLayerCalls(device: Device, shape: DeltaRuleShape, x: LayerInputs, state0: Float32Array, calls: LayerCall[], o: LayerRunOptions): { out: Float32Array; state: Float32Array } {
  const S = calls.reduce((n, [, c]) => n + c, 0), Vd = shape.valueHeads * shape.valueDim;
  const stateOffset = o.stateOffset ?? 0, outOffset = o.outOffset ?? 0;
  using layer = new DeviceLayer(device, shape, x, S, o.pad ?? 0);
  const st = new Float32Array(stateOffset + state0.length);
  st.set(state0, stateOffset);
  using sb = bufferOf(device, st);
  using ob = hostBuffer(device, outOffset + S * Vd);
  submitAndWait(device, (cb) => {
    let t0 = 0;
    for (const [i, [record, n]] of calls.entries()) {
      if (i > 0) cb.barrier("computeToCompute");
      record(cb, layer.args(t0, n, sb, ob, o));
      t0 += n;
    }
  });
  expectTail(ob, outOffset + S * Vd, "delta rule out");
  expectTail(sb, st.length, "delta rule state");
  expect(Array.from(f32(sb, stateOffset))).toEqual(Array.from(st.subarray(0, stateOffset)));
  return { out: f32(ob, S * Vd, outOffset).slice(), state: f32(sb, state0.length, stateOffset).slice() };
}
