/**
 * The fused gate+up GEMV on q4/q8 matrices against any buffers (QuantGateUpKernel: gateup_q{4,8}.comp,
 * the Qwen3.5 graph's shared expert in decode), under the validation layer, against the CPU: silu(g)
 * * u over gemvReference's f64 row sums of the exact q * scale weights. Odd row counts, a partial
 * last column step, x read by scalars (cols not a multiple of 4), S 1..5, x/y offsets, f16/f32
 * scales, groups 32/64/128, the graphs' shapes (the tuning table's, 8 x 8, 32 x 1, 64 x 2).
 * Bound: NMSE <= 1e-9 over a test's outputs pooled, each case <= 1e-6 (as test/kernels.test.ts: f32
 * sums against f64 with the float path's weight trick, gemv_float.glsl, whose cancellation can take
 * a single output's relative error past 1e-9); gate and up swapped gives NMSE ~1 (the last test).
 * Also: each matrix's row sums equal QuantGemvKernel's of the same shape bit for bit (the graph's
 * fold keeps its bits: test/model-qwen35-graph.test.ts), and mismatched matrices are refused.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { QuantGateUpKernel, QuantGemvKernel } from "../src/kernels/decoder/quant-gemv.ts";
import { DeviceMatrix } from "../src/kernels/gemv.ts";
import { DeviceLinear, LinearKernels, quantDecodeShape } from "../src/graph/device-linear.ts";
import { QuantLinear } from "../src/model/linear.ts";
import { nmse } from "../src/quant/metrics.ts";
import { quantize } from "../src/quant/quantize.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { GroupSize, QuantFormat, QuantMatrix, ScaleType } from "../src/quant/types.ts";
import type { CommandBuffer } from "../src/vk/commands.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { quantGemmReference } from "./support/gemm-reference.ts";
import { COLD_COMPILE_MS, finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, SENTINEL, SENTINEL_WORDS, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));

/** Pooled over a test's outputs, as test/kernels.test.ts does (one output's relative f32 error can pass 1e-9 by cancellation alone); each case within CASE_BOUND. */
const BOUND = 1e-9;
const CASE_BOUND = 1e-6;
let seed = 31;

interface Case { O: number; I: number; S: number; format: QuantFormat; scaleType?: ScaleType; groupSize?: GroupSize; xOffset?: number; yOffset?: number }
type Shape = { workgroupSize: number; rowsPerWorkgroup: number } | undefined;

const matrix = (c: Case): QuantMatrix =>
  quantize({ dtype: "f32", data: randomGaussianF32(c.O * c.I, seed++) }, c.O, c.I, { format: c.format, scaleType: c.scaleType ?? "f16", groupSize: c.groupSize ?? 32 });

/** Runs `record` once into a sentinel-guarded y of S rows of `rows` floats at yOffset; returns y. */
function run(c: Case, x: Float32Array, rows: number, record: (cb: CommandBuffer, xb: Buffer, yb: Buffer) => void): Float32Array {
  const xo = c.xOffset ?? 0, yo = c.yOffset ?? 0;
  using xb = hostBuffer(device, xo + c.S * c.I, "upload");
  using yb = hostBuffer(device, yo + c.S * rows);
  f32(xb, c.S * c.I, xo).set(x);
  submitAndWait(device, (cb) => record(cb, xb, yb));
  const around = Array.from(u32(yb, yo)).concat(Array.from(u32(yb, SENTINEL_WORDS, yo + c.S * rows)));
  if (around.some((v) => v !== SENTINEL)) throw new Error(`${c.O}x${c.I} S=${c.S}: a sentinel word around y was overwritten`);
  return f32(yb, c.S * rows, yo).slice();
}

const silu = (v: number) => v / (1 + Math.exp(-v));

const kernels = new Map<string, { k: QuantGateUpKernel; gemv: QuantGemvKernel }>();
afterAll(() => {
  for (const { k, gemv } of kernels.values()) {
    k[Symbol.dispose]();
    gemv[Symbol.dispose]();
  }
  finish(ctx);
});
/** Both kernels of a matrix kind and shape, made once (a pipeline each). */
function kernelsFor(m: QuantMatrix, shape: Shape) {
  const key = `${m.format}/${m.scaleType}/${m.groupSize}/${shape?.workgroupSize}x${shape?.rowsPerWorkgroup}`;
  let r = kernels.get(key);
  if (!r) {
    const f16 = m.scaleType === "f16", options = { maxSets: 128, ...(shape && { shape }) };
    kernels.set(key, (r = { k: new QuantGateUpKernel(device, m.format, f16, m.groupSize, options), gemv: new QuantGemvKernel(device, m.format, f16, m.groupSize, options) }));
  }
  return r;
}

/** The fused kernel's y against the f64 oracle; returns { nmse, y, g, u } (g and u: QuantGemvKernel's rows of the same shape). */
function fused(c: Case, shape: Shape, swap = false) {
  const gm = matrix(c), um = matrix(c);
  const x = randomGaussianF32(c.S * c.I, seed++);
  using g = new DeviceMatrix(device, gm);
  using u = new DeviceMatrix(device, um);
  const { k, gemv } = kernelsFor(gm, shape);
  const xOffset = c.xOffset ?? 0, yOffset = c.yOffset ?? 0;
  const y = run(c, x, c.O, (cb, xb, yb) => k.record(cb, { gate: swap ? u : g, up: swap ? g : u, x: xb, y: yb, S: c.S, xOffset, yOffset }));
  const rowsOf = (m: DeviceMatrix) => run(c, x, c.O, (cb, xb, yb) => gemv.record(cb, { matrix: m, x: xb, y: yb, S: c.S, xOffset, yOffset }));
  const gr = quantGemmReference(gm, x, c.S), ur = quantGemmReference(um, x, c.S);
  const want = Float64Array.from(gr, (v, i) => silu(v) * ur[i]!);
  let err = 0, ref = 0;
  for (let i = 0; i < y.length; i++) {
    err += (want[i]! - y[i]!) ** 2;
    ref += want[i]! ** 2;
  }
  return { err, ref, nmse: nmse(want, y), y, g: rowsOf(g), u: rowsOf(u) };
}

const shapes: { label: string; shape: Shape }[] = [
  { label: "the tuning table's", shape: undefined },
  { label: "8 x 8", shape: { workgroupSize: 8, rowsPerWorkgroup: 8 } },
  { label: "32 x 1", shape: { workgroupSize: 32, rowsPerWorkgroup: 1 } },
  { label: "64 x 2", shape: { workgroupSize: 64, rowsPerWorkgroup: 2 } },
];

describe(`QuantGateUpKernel vs silu(g) * u over gemvReference (NMSE <= ${BOUND} pooled)`, () => {
  for (const format of ["q4", "q8"] as const) {
    test(`${format}: odd shapes, S 1..5, offsets, f16/f32 scales, groups 32/64/128, the graphs' shapes; g and u rows as QuantGemvKernel's`, () => {
      const cases: Case[] = [
        { O: 1, I: 32, S: 1, format },
        { O: 37, I: 96, S: 3, format, xOffset: 5, yOffset: 3 },
        { O: 130, I: 70, S: 2, format }, // cols not a multiple of 4: scalar x loads, a partial last step
        { O: 512, I: 2048, S: 1, format, scaleType: "f32" },
        { O: 64, I: 384, S: 5, format, groupSize: 128 },
        { O: 33, I: 512, S: 4, format, groupSize: 64, xOffset: 2 },
      ];
      let worst = 0, err = 0, ref = 0;
      for (const { shape } of shapes) {
        for (const c of cases) {
          const r = fused(c, shape);
          worst = Math.max(worst, r.nmse);
          err += r.err;
          ref += r.ref;
          expect(r.nmse).toBeLessThanOrEqual(CASE_BOUND);
          // the epilogue's inputs are the GEMV's own row sums: silu(g) * u from them within an ulp or two
          for (let i = 0; i < r.y.length; i++) {
            const want = Math.fround(Math.fround(r.g[i]! / Math.fround(1 + Math.exp(-r.g[i]!))) * r.u[i]!);
            expect(Math.abs(r.y[i]! - want)).toBeLessThanOrEqual(4e-7 * Math.max(1, Math.abs(want)));
          }
        }
      }
      console.log(`  ${format}: NMSE ${(err / ref).toExponential(2)} pooled over ${shapes.length} shapes x 6 cases, the worst case's ${worst.toExponential(2)}`);
      expect(err / ref).toBeLessThanOrEqual(BOUND);
    }, COLD_COMPILE_MS);
  }

  test("mismatched matrices are refused: formats, shapes, S out of range", () => {
    const a = matrix({ O: 8, I: 64, S: 1, format: "q4" }), b = matrix({ O: 9, I: 64, S: 1, format: "q4" }), c8 = matrix({ O: 8, I: 64, S: 1, format: "q8" });
    using da = new DeviceMatrix(device, a);
    using db = new DeviceMatrix(device, b);
    using dc = new DeviceMatrix(device, c8);
    using k = new QuantGateUpKernel(device, "q4", true, 32);
    using xb = hostBuffer(device, 128, "upload");
    using yb = hostBuffer(device, 64);
    const call = (gate: DeviceMatrix, up: DeviceMatrix, S = 1) => () => submitAndWait(device, (cb) => k.record(cb, { gate, up, x: xb, y: yb, S }));
    expect(call(da, db)).toThrow(InvalidArgumentError);
    expect(call(da, dc)).toThrow(InvalidArgumentError);
    expect(call(da, da, 0)).toThrow(InvalidArgumentError);
    expect(call(da, da, 65)).toThrow(InvalidArgumentError);
    expect(() => new QuantGateUpKernel(device, "q4", true, 32, { shape: { workgroupSize: 32, rowsPerWorkgroup: 3 } })).toThrow(InvalidArgumentError);
  });

  test("negative control: gate and up swapped fails the bound", () => {
    const r = fused({ O: 37, I: 96, S: 2, format: "q4" }, undefined, true);
    console.log(`  swapped: NMSE ${r.nmse.toExponential(2)}`);
    expect(r.nmse).toBeGreaterThan(CASE_BOUND);
  });
});

describe("the graphs' one-token shape of q4/q8 GEMVs (VKMOE_QUANT_GEMV_SHAPE, LinearKernelsOptions.quantDecodeShape)", () => {
  test("narrow: 64 threads x 2 rows on an NVIDIA GPU only; table: the tuning table's everywhere", () => {
    expect(quantDecodeShape("nvidia", "narrow")).toEqual({ workgroupSize: 64, rowsPerWorkgroup: 2 });
    expect([quantDecodeShape("nvidia", "table"), quantDecodeShape("other", "narrow"), quantDecodeShape("cpu", "narrow")]).toEqual([undefined, undefined, undefined]);
  });

  test("a DeviceLinear's one-token calls (GEMV and fused gate+up) run on that shape, the same bits as its kernels; calls of 2 tokens on the graph's other shape; both within the f64 oracle's bound", () => {
    const shape = { workgroupSize: 64, rowsPerWorkgroup: 2 };
    using lk = new LinearKernels(device, { quantDecodeShape: shape });
    for (const format of ["q4", "q8"] as const) {
      const c1: Case = { O: 77, I: 512, S: 1, format }, c2: Case = { ...c1, S: 2 };
      const gm = matrix(c1), um = matrix(c1);
      using gate = new DeviceLinear(lk, "gate", new QuantLinear(gm));
      using up = new DeviceLinear(lk, "up", new QuantLinear(um));
      using dg = new DeviceMatrix(device, gm);
      using du = new DeviceMatrix(device, um);
      const narrow = kernelsFor(gm, shape), cpuShape = kernelsFor(gm, { workgroupSize: 8, rowsPerWorkgroup: 8 }); // LinearKernels' shape on a CPU device
      for (const [c, k] of [[c1, narrow], [c2, cpuShape]] as const) {
        const x = randomGaussianF32(c.S * c.I, seed++);
        const viaLinear = run(c, x, c.O, (cb, xb, yb) => gate.record(cb, xb, yb, c.S));
        const viaKernel = run(c, x, c.O, (cb, xb, yb) => k.gemv.record(cb, { matrix: dg, x: xb, y: yb, S: c.S }));
        expect(new Uint32Array(viaLinear.buffer)).toEqual(new Uint32Array(viaKernel.buffer));
        expect(nmse(quantGemmReference(gm, x, c.S), viaLinear)).toBeLessThanOrEqual(CASE_BOUND);
        const fusedLinear = run(c, x, c.O, (cb, xb, yb) => gate.recordGateUp(cb, up, xb, yb, c.S));
        const fusedKernel = run(c, x, c.O, (cb, xb, yb) => k.k.record(cb, { gate: dg, up: du, x: xb, y: yb, S: c.S }));
        expect(new Uint32Array(fusedLinear.buffer)).toEqual(new Uint32Array(fusedKernel.buffer));
      }
    }
  }, COLD_COMPILE_MS);
});
