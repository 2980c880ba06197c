/**
 * The batched (runs) mode of Gated DeltaNet's GPU kernels (shaders/dec_conv1d.comp,
 * dec_delta_rule.comp with dec_runs.glsl; src/kernels/decoder/runs.ts), on the real driver under
 * the validation layer: S tokens of several sequences in one call, each token on its sequence's
 * state (states a stride apart, with a gap, from a non-zero offset), in any interleaving, equal
 * each sequence's tokens run alone through the same kernel without runs, bit for bit (the same
 * arithmetic in the same order), and the states no token names are left as they were. Shapes:
 * 100 channels (not a multiple of the workgroup), the tiny fixture's heads (2 key / 4 value of
 * 32, gated norm fused) and dims 128 at GQA 2; S = 1, 7, 64 (64 tokens of 5 sequences
 * interleaved at random, and 64 sequences of one token each: a decode round). writeRuns' table
 * and bad bindings are checked on the host.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { Conv1dKernel, DeltaRuleKernel, submitAndWait } from "../src/kernels/decoder/index.ts";
import { RUN_WORDS, writeRuns } from "../src/kernels/decoder/runs.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
const KERNEL = 4;
const conv = new Conv1dKernel(device, KERNEL);
const deltaKernels = [new DeltaRuleKernel(device, { keyDim: 32, valueDim: 32 }), new DeltaRuleKernel(device, { keyDim: 128, valueDim: 128 })];
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of deltaKernels) k[Symbol.dispose]();
  conv[Symbol.dispose]();
  finish(ctx);
});

let seed = 101;
const random = (n: number, std = 1) => randomGaussianF32(n, seed++, std);
function bufferOf(data: Float32Array): Buffer {
  const b = hostBuffer(device, data.length);
  f32(b, data.length).set(data);
  return b;
}

/** Which sequence each token belongs to: S = 1, 7 (interleaved), 64 of 5 at random, 64 sequences of one token. */
function patterns(): { label: string; stateOf: number[]; states: number }[] {
  const r = random(64);
  return [
    { label: "S = 1", stateOf: [3], states: 5 },
    { label: "S = 7, 3 sequences interleaved", stateOf: [2, 0, 2, 4, 0, 2, 2], states: 5 },
    { label: "S = 64, 5 sequences at random", stateOf: Array.from(r, (v) => Math.floor(Math.abs(v) * 1000) % 5), states: 5 },
    { label: "S = 64, one token of each of 64 sequences (reversed)", stateOf: Array.from({ length: 64 }, (_, t) => 63 - t), states: 64 },
  ];
}

/** The token indices of sequence s, in order. */
const tokensOf = (stateOf: number[], s: number) => stateOf.flatMap((v, t) => (v === s ? [t] : []));

function runsTable(stateOf: number[]): Buffer {
  const b = hostBuffer(device, RUN_WORDS, "upload");
  writeRuns(u32(b, RUN_WORDS), stateOf, stateOf.length);
  return b;
}

describe("writeRuns", () => {
  test("runs in order of first appearance, each listing its tokens in entry order; rows past the last run count 0", () => {
    const w = new Uint32Array(RUN_WORDS).fill(7);
    expect(writeRuns(w, [2, 0, 2, 1, 0], 5)).toBe(3);
    expect([...w.subarray(0, 3)]).toEqual([2, 0, 1]); // state index of runs 0..2
    expect([...w.subarray(64, 67)]).toEqual([0, 2, 4]); // first list position
    expect([...w.subarray(128, 132)]).toEqual([2, 2, 1, 0]); // counts, then none
    expect([...w.subarray(192, 197)]).toEqual([0, 2, 1, 4, 3]); // the token list
    expect(w.subarray(128 + 3, 192).every((c) => c === 0)).toBe(true);
    expect(() => writeRuns(w, [], 0)).toThrow(InvalidArgumentError);
    expect(() => writeRuns(w, new Array(65).fill(0), 65)).toThrow(InvalidArgumentError);
    expect(() => writeRuns(new Uint32Array(10), [0], 1)).toThrow(InvalidArgumentError);
  });
});

describe("dec_conv1d runs mode", () => {
  test("100 channels, states a stride apart: every pattern equals each sequence alone, bit for bit; untouched states stay", () => {
    const C = 100, H = KERNEL - 1, stateOffset = 5, stride = C * H + 7;
    const weights = random(C * KERNEL, 0.5);
    using wb = bufferOf(weights);
    for (const { label, stateOf, states } of patterns()) {
      const S = stateOf.length;
      const x = random(S * C);
      const st0 = random(stateOffset + states * stride, 0.5);
      using xb = bufferOf(x), sb = bufferOf(st0), ob = hostBuffer(device, S * C), table = runsTable(stateOf);
      submitAndWait(device, (cb) => conv.record(cb, { x: xb, weight: wb, state: sb, stateOffset, out: ob, S, channels: C, runs: { table, stateStride: stride, states } }));
      const got = f32(ob, S * C).slice(), gotState = f32(sb, st0.length).slice();
      expectTail(ob, S * C, "out");
      expectTail(sb, st0.length, "state");
      for (let s = 0; s < states; s++) {
        const own = tokensOf(stateOf, s), at = stateOffset + s * stride;
        if (own.length === 0) {
          expect({ label, s, untouched: gotState.subarray(at, at + C * H).every((v, i) => v === st0[at + i]) }).toEqual({ label, s, untouched: true });
          continue;
        }
        const xs = new Float32Array(own.length * C);
        own.forEach((t, i) => xs.set(x.subarray(t * C, (t + 1) * C), i * C));
        using xa = bufferOf(xs), sa = bufferOf(st0.slice(at, at + C * H)), oa = hostBuffer(device, own.length * C);
        submitAndWait(device, (cb) => conv.record(cb, { x: xa, weight: wb, state: sa, out: oa, S: own.length, channels: C }));
        const ref = f32(oa, own.length * C);
        const same = own.every((t, i) => got.subarray(t * C, (t + 1) * C).every((v, c) => v === ref[i * C + c]));
        const sameState = f32(sa, C * H).every((v, i) => v === gotState[at + i]);
        expect({ label, s, same, sameState }).toEqual({ label, s, same: true, sameState: true });
      }
    }
  }, 60_000);

  test("bad runs bindings are InvalidArgumentErrors", () => {
    using b = hostBuffer(device, 4096), table = runsTable([0, 1]);
    const base = { x: b, weight: b, state: b, out: b, outOffset: 2048, S: 2, channels: 16 };
    // overlapping states, states past the buffer, no states
    for (const runs of [{ table, stateStride: 10, states: 2 }, { table, stateStride: 48, states: 100 }, { table, stateStride: 48, states: 0 }]) {
      expect(() => submitAndWait(device, (cb) => conv.record(cb, { ...base, runs }))).toThrow(InvalidArgumentError);
    }
    using small = hostBuffer(device, 8);
    expect(() => submitAndWait(device, (cb) => conv.record(cb, { ...base, runs: { table: small, stateStride: 48, states: 2 } }))).toThrow(InvalidArgumentError);
  });
});

describe("dec_delta_rule runs mode (gated norm fused)", () => {
  const shapes = [
    { label: "tiny fixture (2 key / 4 value heads of 32)", kernel: 0, keyHeads: 2, valueHeads: 4, dim: 32 },
    { label: "dims 128, GQA 2 (2 / 4 heads)", kernel: 1, keyHeads: 2, valueHeads: 4, dim: 128 },
  ];
  for (const shape of shapes) {
    test(`${shape.label}: every pattern equals each sequence alone, bit for bit; untouched states stay`, () => {
      const kernel = deltaKernels[shape.kernel]!, { keyHeads: KH, valueHeads: VH, dim } = shape;
      const Kd = KH * dim, Vd = VH * dim, row = 2 * Kd + Vd, stateFloats = kernel.stateFloats(VH);
      const stateOffset = 3, stride = stateFloats + 5, eps = 1e-6;
      // params: negA, dtBias, the norm weight
      const params = new Float32Array([...Array.from(random(VH), (v) => -Math.exp(0.3 * v)), ...random(VH, 0.5), ...Array.from(random(dim, 0.1), (v) => 1 + v)]);
      using pb = bufferOf(params);
      for (const { label, stateOf, states } of patterns().filter((p) => shape.kernel === 0 || p.stateOf.length <= 7 || p.states === 64)) {
        const S = stateOf.length;
        const qkv = random(S * row), a = random(S * VH), b = random(S * VH), z = random(S * Vd);
        const st0 = random(stateOffset + states * stride, 0.3);
        using qb = bufferOf(qkv), ab = bufferOf(a), bb = bufferOf(b), zb = bufferOf(z), sb = bufferOf(st0), ob = hostBuffer(device, S * Vd), table = runsTable(stateOf);
        const norm = { weightOffset: 2 * VH, eps };
        const common = { keyHeads: KH, valueHeads: VH, params: pb, negAOffset: 0, dtBiasOffset: VH };
        submitAndWait(device, (cb) => kernel.record(cb, { ...common, S, qkv: qb, a: ab, b: bb, state: sb, stateOffset, out: ob, norm: { z: zb, ...norm }, runs: { table, stateStride: stride, states } }));
        const got = f32(ob, S * Vd).slice(), gotState = f32(sb, st0.length).slice();
        expectTail(ob, S * Vd, "out");
        expectTail(sb, st0.length, "state");
        for (let s = 0; s < states; s++) {
          const own = tokensOf(stateOf, s), at = stateOffset + s * stride;
          if (own.length === 0) {
            expect({ label, s, untouched: gotState.subarray(at, at + stateFloats).every((v, i) => v === st0[at + i]) }).toEqual({ label, s, untouched: true });
            continue;
          }
          const pick = (src: Float32Array, width: number) => {
            const out = new Float32Array(own.length * width);
            own.forEach((t, i) => out.set(src.subarray(t * width, (t + 1) * width), i * width));
            return out;
          };
          using qa = bufferOf(pick(qkv, row)), aa = bufferOf(pick(a, VH)), ba = bufferOf(pick(b, VH)), za = bufferOf(pick(z, Vd));
          using sa = bufferOf(st0.slice(at, at + stateFloats)), oa = hostBuffer(device, own.length * Vd);
          submitAndWait(device, (cb) => kernel.record(cb, { ...common, S: own.length, qkv: qa, a: aa, b: ba, state: sa, out: oa, norm: { z: za, ...norm } }));
          const ref = f32(oa, own.length * Vd);
          const same = own.every((t, i) => got.subarray(t * Vd, (t + 1) * Vd).every((v, c) => v === ref[i * Vd + c]));
          const sameState = f32(sa, stateFloats).every((v, i) => v === gotState[at + i]);
          expect({ label, s, same, sameState }).toEqual({ label, s, same: true, sameState: true });
        }
      }
    }, 120_000);
  }
});
