/**
 * dec_gemm_quant (src/kernels/decoder/quant-gemm.ts) on the real driver, under the validation
 * layer, against gemvReference (f64 sums of the exact q*scale weights) on random data: q4 and q8,
 * f16 and f32 scales, groups of 32/64/128, odd shapes (rows not a multiple of the 32-row tile,
 * columns not a multiple of the 32-column step or of 4, so x is read by scalars), S from 1 to 100
 * (several token tiles), x and y offsets. Output buffers carry sentinel words before yOffset and
 * past the end.
 *
 * Bound: NMSE <= 1e-10. The GPU sums each output in f32 over I terms in column order (one fma
 * chain per thread): relative error ~ u*sqrt(I) per output for random data (u = 2^-24), NMSE
 * ~1e-13; one wrong weight of 4096 gives ~2.5e-4 (the negative control below: a weight tile
 * shifted by one column).
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { DeviceMatrix } from "../src/kernels/gemv.ts";
import { GemmSplitScratch, gemmSplits, QuantGemmKernel, splitRuns } from "../src/kernels/decoder/quant-gemm.ts";
import { submitAndWait } from "../src/kernels/decoder/index.ts";
import { nmse } from "../src/quant/metrics.ts";
import { quantize } from "../src/quant/quantize.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { GroupSize, QuantFormat, QuantMatrix, ScaleType } from "../src/quant/types.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, SENTINEL, SENTINEL_WORDS, u32 } from "./support/host-buffers.ts";
import { quantGemmReference } from "./support/gemm-reference.ts";

const ctx = openTestContext();
const device = ctx.device;
const kernels = new Map<string, QuantGemmKernel>();
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of kernels.values()) k[Symbol.dispose]();
  finish(ctx);
});

let seed = 7;
const BOUND = 1e-10;

function kernelFor(m: QuantMatrix): QuantGemmKernel {
  const key = `${m.format}/${m.scaleType}/${m.groupSize}`;
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = new QuantGemmKernel(device, m.format, m.scaleType === "f16", m.groupSize)));
  return k;
}

interface Case { O: number; I: number; S: number; format: QuantFormat; scaleType?: ScaleType; groupSize?: GroupSize; xOffset?: number; yOffset?: number; splits?: number; calls?: number }

function run(c: Case, corrupt?: (m: QuantMatrix) => QuantMatrix): number {
  const { O, I, S, format } = c;
  const xo = c.xOffset ?? 0, yo = c.yOffset ?? 0;
  const m = quantize({ dtype: "f32", data: randomGaussianF32(O * I, seed++) }, O, I, { format, scaleType: c.scaleType ?? "f16", groupSize: c.groupSize ?? 32 });
  const x = randomGaussianF32(S * I, seed++);
  using dm = new DeviceMatrix(device, corrupt ? corrupt(m) : m);
  using xb = hostBuffer(device, xo + S * I, "upload");
  using yb = hostBuffer(device, yo + S * O);
  f32(xb, S * I, xo).set(x);
  using split = c.splits ? new GemmSplitScratch(device, O, I, S, c.splits) : undefined;
  // calls > 1: the same call again behind a barrier (the arrival words must be back at 0)
  submitAndWait(device, (cb) => {
    for (let i = 0; i < (c.calls ?? 1); i++) {
      if (i > 0) cb.barrier("computeToCompute");
      kernelFor(m).record(cb, { matrix: dm, x: xb, y: yb, S, xOffset: xo, yOffset: yo }, split);
    }
  });
  const bad = Array.from(u32(yb, yo)).concat(Array.from(u32(yb, SENTINEL_WORDS, yo + S * O))).findIndex((w) => w !== SENTINEL);
  if (bad >= 0) throw new Error(`${O}x${I} S=${S}: a sentinel word around y was overwritten`);
  return nmse(quantGemmReference(m, x, S), f32(yb, S * O, yo));
}

describe("dec_gemm_quant vs gemvReference (NMSE <= 1e-10)", () => {
  for (const format of ["q4", "q8"] as const) {
    test(`${format}: odd shapes, S 1..100, f16/f32 scales, groups 32/64/128, offsets`, () => {
      let worst = 0;
      const cases: Case[] = [
        { O: 1, I: 32, S: 1, format },
        { O: 33, I: 40, S: 5, format }, // a partial row tile and a partial column step
        { O: 100, I: 70, S: 64, format, xOffset: 3, yOffset: 5 }, // I not a multiple of 4: scalar x loads
        { O: 512, I: 2048, S: 64, format, scaleType: "f32" },
        { O: 96, I: 384, S: 100, format, groupSize: 128 }, // two token tiles
        { O: 64, I: 4096, S: 17, format, groupSize: 64 },
      ];
      for (const c of cases) {
        const e = run(c);
        if (!(e <= BOUND)) throw new Error(`${format} ${c.O}x${c.I} S=${c.S}: NMSE ${e}`);
        worst = Math.max(worst, e);
      }
      console.log(`  dec_gemm_quant ${format}: worst NMSE ${worst.toExponential(2)}`);
      expect(worst).toBeGreaterThan(0);
    }, 120_000);
  }

  test("split over the columns (o_proj-like matrices): 2..5 runs, a short last run, two token tiles, repeated calls; within the same bound", () => {
    let worst = 0;
    for (const c of [
      { O: 64, I: 2048, S: 64, format: "q4", splits: 4, calls: 3 },
      { O: 33, I: 1000, S: 7, format: "q8", splits: 3 }, // 1000 = 3 runs of 352, 352, 296 columns
      { O: 96, I: 384, S: 100, format: "q4", groupSize: 128, splits: 2, calls: 2 },
      { O: 40, I: 4096, S: 13, format: "q4", scaleType: "f32", splits: 5, xOffset: 4, yOffset: 3 },
    ] as Case[]) {
      const e = run(c);
      if (!(e <= BOUND)) throw new Error(`split ${c.splits}: ${c.O}x${c.I} S=${c.S}: NMSE ${e}`);
      worst = Math.max(worst, e);
    }
    console.log(`  dec_gemm_quant split: worst NMSE ${worst.toExponential(2)}`);
    expect(splitRuns(1000, 3)).toEqual({ splitCols: 352, splits: 3 });
    expect(splitRuns(100, 8)).toEqual({ splitCols: 32, splits: 4 }); // runs never shorter than a step
    // a GPU: o_proj's 2048 rows (64 tiles) x 4096 columns split 4 ways, 4096 rows not at all; a CPU device never
    const gpuLike = { info: { ...device.info, type: 2 } } as typeof device;
    expect([gemmSplits(gpuLike, 2048, 4096), gemmSplits(gpuLike, 4096, 2048), gemmSplits(gpuLike, 2048, 512), gemmSplits(device, 2048, 4096)]).toEqual([4, 2, 1, device.info.type === 4 ? 1 : 4]);
  }, 120_000);

  test("negative control: one weight word changed fails the bound", () => {
    const e = run({ O: 64, I: 256, S: 8, format: "q4" }, (m) => {
      const weights = m.weights.slice();
      weights[5] = weights[5]! ^ 0x00000077;
      return { ...m, weights };
    });
    expect(e).toBeGreaterThan(BOUND);
  });

  test("a matrix of another kind and a bad S are refused before anything is recorded", () => {
    const m = quantize({ dtype: "f32", data: randomGaussianF32(32 * 32, 1) }, 32, 32, { format: "q8", scaleType: "f16", groupSize: 32 });
    using dm = new DeviceMatrix(device, m);
    using b = hostBuffer(device, 64 * 32);
    const k4 = new QuantGemmKernel(device, "q4", true, 32);
    try {
      expect(() => submitAndWait(device, (cb) => k4.record(cb, { matrix: dm, x: b, y: b, S: 1 }))).toThrow(/q8\/f16\/32 matrix on a q4/);
      expect(() => submitAndWait(device, (cb) => kernelFor(m).record(cb, { matrix: dm, x: b, y: b, S: 0 }))).toThrow(/S must be/);
    } finally {
      k4[Symbol.dispose]();
    }
  });
});
