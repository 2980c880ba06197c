/**
 * dec_gemv_half (src/kernels/decoder/gemv-half.ts) on the real driver, under the validation
 * layer, against FloatLinear (src/model/linear.ts: f64 sums of the same 16-bit weights) on random
 * data. Output buffers carry sentinel words before yOffset and past the end, checked after each run.
 *
 * Bound: NMSE ≤ 1e-10. The GPU sums in f32 (fma chains of ~I/(8 WG) chunks per thread, then a
 * tree over the workgroup): each output's error is about u·sqrt(log2 terms)·Σ|w x| with
 * u = 2^-24, so for random data NMSE ~ 1e-14..1e-13; 1e-10 leaves three orders of margin and
 * still catches any wrong weight (one wrong element of 4096 gives ~2.5e-4).
 *
 * f32 weights (flags bit 1) are full-precision random f32 (not 16-bit-representable), against
 * FloatLinear("F32"); the same bound holds, and rounding them to f16 or bf16 anywhere would not
 * (the negative control: relative rounding error ~2^-12 / 2^-9 gives NMSE ~1e-8 / 1e-6).
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { GemvHalfKernel, submitAndWait, type HalfDType } from "../src/kernels/decoder/index.ts";
import type { GemvWeightDType } from "../src/kernels/decoder/gemv-half.ts";
import { FloatLinear } from "../src/model/linear.ts";
import { bf16BitsToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits } from "../src/quant/half.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import type { MemoryUse } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer as deviceHostBuffer, u32, SENTINEL, SENTINEL_WORDS as TAIL } from "./support/host-buffers.ts";
import { nmse as nmseOf } from "../src/quant/metrics.ts";

const ctx = openTestContext();
const device = ctx.device;
const gemv = new GemvHalfKernel(device);
const gemvShared = new GemvHalfKernel(device, { useSubgroup: false, workgroupSize: 64, rowsPerWorkgroup: 2 });
const gemvOneRow = new GemvHalfKernel(device, { workgroupSize: 32, rowsPerWorkgroup: 1 });
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  gemvOneRow[Symbol.dispose]();
  gemvShared[Symbol.dispose]();
  gemv[Symbol.dispose]();
  finish(ctx);
});

let seed = 101;
const hostBuffer = (words: number, memory?: MemoryUse) => deviceHostBuffer(device, words, memory);

/** n random 16-bit floats of `dtype` (normal samples rounded), in bulk. */
function randomHalves(n: number, dtype: HalfDType, s: number): Uint16Array {
  const out = new Uint16Array(n);
  const next = mulberry32(s);
  const conv = dtype === "f16" ? f32ToF16Bits : f32ToBf16Bits;
  // a cheap spread of magnitudes (uniform in ±2, sign random): the oracle does not care about the shape
  for (let i = 0; i < n; i++) out[i] = conv((next() - 0.5) * 4);
  return out;
}

/** n random f32 weights with full 24-bit mantissas (uniform in ±2). */
function randomF32(n: number, s: number): Float32Array {
  const out = new Float32Array(n);
  const next = mulberry32(s);
  for (let i = 0; i < n; i++) out[i] = (next() - 0.5) * 4;
  return out;
}

interface Case {
  O: number;
  I: number;
  S: number;
  dtype: GemvWeightDType;
  weightOffset?: number;
  xOffset?: number;
  yOffset?: number;
  /** Decode the weights as this dtype on the CPU (negative control; 16-bit weights). */
  oracleDType?: HalfDType;
  /** Round f32 weights to this 16-bit dtype for the CPU (negative control; f32 weights). */
  oracleRound?: HalfDType;
}

/** Runs one case; returns its NMSE against FloatLinear (and checks the sentinels). */
function run(kernel: GemvHalfKernel, c: Case): number {
  const { O, I, S, dtype } = c;
  const wo = c.weightOffset ?? 0, xo = c.xOffset ?? 0, yo = c.yOffset ?? 0;
  const halves = dtype === "f32" ? undefined : randomHalves(O * I, dtype, seed++);
  const full = dtype === "f32" ? randomF32(O * I, seed++) : undefined;
  const x = randomGaussianF32(S * I, seed++);
  const wWords = wo + (full ? O * I : Math.ceil((O * I) / 2));
  using wb = hostBuffer(wWords, "upload");
  using xb = hostBuffer(xo + S * I, "upload");
  using yb = hostBuffer(yo + S * O);
  if (full) new Float32Array(wb.host(), 4 * wo, O * I).set(full);
  else new Uint16Array(wb.host(), 4 * wo, O * I).set(halves!);
  f32(xb, S * I, xo).set(x);
  submitAndWait(device, (cb) => kernel.record(cb, { weights: wb, x: xb, y: yb, rows: O, cols: I, S, dtype, weightOffset: wo, xOffset: xo, yOffset: yo }));
  const ref = new Float32Array(S * O);
  if (full) {
    const round = c.oracleRound === "f16" ? (v: number) => f16BitsToF32(f32ToF16Bits(v)) : c.oracleRound === "bf16" ? (v: number) => bf16BitsToF32(f32ToBf16Bits(v)) : undefined;
    new FloatLinear("F32", round ? full.map(round) : full, O, I).apply(x, S, ref);
  } else {
    new FloatLinear((c.oracleDType ?? dtype) === "f16" ? "F16" : "BF16", halves!, O, I).apply(x, S, ref);
  }
  const got = f32(yb, S * O, yo);
  const bad = Array.from(u32(yb, yo)).concat(Array.from(u32(yb, TAIL, yo + S * O))).findIndex((w) => w !== SENTINEL);
  if (bad >= 0) throw new Error(`${O}x${I} S=${S}: a sentinel word around y was overwritten`);
  return nmseOf(ref, got);
}

const SHAPES: [number, number][] = [[1, 1], [7, 33], [64, 2047], [512, 4096], [151936, 64]]; // [O, I]

describe("dec_gemv_half vs FloatLinear (NMSE ≤ 1e-10)", () => {
  for (const dtype of ["f16", "bf16"] as const) {
    test(`${dtype}: O x I = ${SHAPES.map(([o, i]) => `${o}x${i}`).join(", ")}; S = 1, 3, 8`, () => {
      let worst = 0;
      for (const [O, I] of SHAPES) for (const S of [1, 3, 8]) {
        const e = run(gemv, { O, I, S, dtype });
        if (!(e <= 1e-10)) throw new Error(`${dtype} ${O}x${I} S=${S}: NMSE ${e}`);
        worst = Math.max(worst, e);
      }
      console.log(`  gemv-half ${dtype}: worst NMSE ${worst.toExponential(2)}`);
    }, 300_000);
  }

  test("f32: O x I = 1x1, 7x13, 151x64, 64x2047, 512x4096; S = 1..8", () => {
    let worst = 0;
    for (const [O, I] of [[1, 1], [7, 13], [151, 64], [64, 2047], [512, 4096]] as const) for (let S = 1; S <= 8; S++) {
      const e = run(gemv, { O, I, S, dtype: "f32" });
      if (!(e <= 1e-10)) throw new Error(`f32 ${O}x${I} S=${S}: NMSE ${e}`);
      worst = Math.max(worst, e);
    }
    console.log(`  gemv-half f32: worst NMSE ${worst.toExponential(2)}`);
  }, 300_000);

  test("f32 offsets: 16-byte weight loads (cols % 4 == 0, weightOffset % 4 == 0), uint loads (odd offset, or cols % 4 != 0), tails; unaligned x", () => {
    let worst = 0;
    for (const c of [
      { O: 33, I: 256, S: 2, weightOffset: 8, xOffset: 4, yOffset: 3 }, // uvec4 weights, vec4 x
      { O: 33, I: 260, S: 3, weightOffset: 12, xOffset: 1, yOffset: 7 }, // uvec4 weights (cols % 8 == 4: tail of 4), scalar x
      { O: 33, I: 256, S: 5, weightOffset: 5, xOffset: 2, yOffset: 1 }, // uint weights (odd offset)
      { O: 9, I: 2050, S: 4, weightOffset: 3, xOffset: 2, yOffset: 1 }, // cols % 4 == 2: uint loads + tail of 2
      { O: 17, I: 37, S: 8, weightOffset: 1, xOffset: 5, yOffset: 2 }, // odd cols
      { O: 151, I: 64, S: 7, weightOffset: 4, xOffset: 0, yOffset: 0 },
    ]) {
      const e = run(gemv, { ...c, dtype: "f32" });
      if (!(e <= 1e-10)) throw new Error(`f32 ${JSON.stringify(c)}: NMSE ${e}`);
      worst = Math.max(worst, e);
    }
    console.log(`  gemv-half f32 offsets: worst NMSE ${worst.toExponential(2)}`);
  }, 120_000);

  test("offsets: 16-byte-aligned, word-aligned (uint loads) and odd-I (half loads) weight paths; unaligned x", () => {
    let worst = 0;
    for (const dtype of ["f16", "bf16"] as const) {
      for (const c of [
        { O: 33, I: 256, S: 2, weightOffset: 8, xOffset: 4, yOffset: 3 }, // uvec4 weights, vec4 x
        { O: 33, I: 256, S: 3, weightOffset: 5, xOffset: 1, yOffset: 7 }, // uint weights, scalar x
        { O: 9, I: 2050, S: 4, weightOffset: 3, xOffset: 2, yOffset: 1 }, // even I, not /8: uint loads + tail
        { O: 17, I: 37, S: 8, weightOffset: 1, xOffset: 5, yOffset: 2 }, // odd I: rows start mid-word
      ]) {
        const e = run(gemv, { ...c, dtype });
        if (!(e <= 1e-10)) throw new Error(`${dtype} ${JSON.stringify(c)}: NMSE ${e}`);
        worst = Math.max(worst, e);
      }
    }
    console.log(`  gemv-half offsets: worst NMSE ${worst.toExponential(2)}`);
  }, 120_000);

  test("shared-memory reduction (no subgroup ops, 64 threads, 2 rows per workgroup)", () => {
    for (const [O, I, S] of [[7, 33, 3], [64, 2047, 8], [130, 512, 1]] as const) {
      for (const dtype of ["f16", "bf16", "f32"] as const) expect(run(gemvShared, { O, I, S, dtype })).toBeLessThanOrEqual(1e-10);
    }
  }, 120_000);

  test("grid split over y: one row per workgroup, O above maxComputeWorkGroupCount[0]", () => {
    const maxX = device.info.limits.maxComputeWorkGroupCount[0]!;
    const O = maxX + 1000;
    if (O > 300_000) {
      console.log(`  maxComputeWorkGroupCount[0] = ${maxX}: split not exercised (too large to test cheaply)`);
      return;
    }
    expect(run(gemvOneRow, { O, I: 9, S: 2, dtype: "bf16" })).toBeLessThanOrEqual(1e-10);
    expect(run(gemvOneRow, { O, I: 9, S: 2, dtype: "f32" })).toBeLessThanOrEqual(1e-10);
  }, 120_000);

  test("negative control: bf16 weights decoded as f16 by the oracle fail the bound", () => {
    const e = run(gemv, { O: 64, I: 2047, S: 3, dtype: "bf16", oracleDType: "f16" });
    console.log(`  negative control NMSE ${e.toExponential(2)}`);
    expect(e).toBeGreaterThan(1e-10);
  }, 60_000);

  test("negative control: f32 weights rounded to f16 or bf16 (as a 16-bit upload would) fail the bound", () => {
    for (const oracleRound of ["f16", "bf16"] as const) {
      const e = run(gemv, { O: 64, I: 2047, S: 3, dtype: "f32", oracleRound });
      console.log(`  f32 negative control (weights rounded to ${oracleRound}) NMSE ${e.toExponential(2)}`);
      expect(e).toBeGreaterThan(1e-10);
    }
  }, 60_000);

  test("argument checks", () => {
    using b = hostBuffer(64, "upload");
    expect(() => submitAndWait(device, (cb) => gemv.record(cb, { weights: b, x: b, y: b, rows: 4, cols: 8, S: 9, dtype: "f16" }))).toThrow(/S must be/);
    expect(() => submitAndWait(device, (cb) => gemv.record(cb, { weights: b, x: b, y: b, rows: 50, cols: 8, S: 1, dtype: "f16" }))).toThrow(/weights/);
    expect(() => submitAndWait(device, (cb) => gemv.record(cb, { weights: b, x: b, y: b, rows: 4, cols: 8, S: 1, dtype: "f64" as GemvWeightDType }))).toThrow(/dtype/);
    // f32 counts one uint per element: 11 x 8 f32 = 88 words do not fit the 80-word buffer (as 16-bit weights, 44 words would)
    expect(() => submitAndWait(device, (cb) => gemv.record(cb, { weights: b, x: b, y: b, rows: 11, cols: 8, S: 1, dtype: "f32" }))).toThrow(/weights/);
    submitAndWait(device, (cb) => gemv.record(cb, { weights: b, x: b, y: b, rows: 11, cols: 8, S: 1, dtype: "bf16" }));
    expect(() => submitAndWait(device, (cb) => gemv.record(cb, { weights: b, x: b, y: b, rows: 2, cols: 8, S: 1, dtype: "f32", weightOffset: 2 ** 32 - 16 }))).toThrow(/32-bit/);
  });
});
