/**
 * dec_gemm_ggml (src/kernels/decoder/ggml-gemm.ts): the tiled GEMM over GGML blocks (Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K) on the real driver under the validation layer.
 *
 * - Against the CPU: y = x · dequantizeGgml(W)ᵀ summed in f64 (GGML's exact weights), random blocks
 *   with finite f16 scales, odd row counts (33, 70: partial 32-row tiles), rows of 2..3 super-blocks
 *   (K-quants) or 3..5 blocks (32-element types), S = 8, 13, 64, 70 (two token tiles), x/y offsets
 *   once. NMSE <= 1e-9: the GPU sums in f32 (NMSE ~1e-13 for random data); a slice's second run of
 *   x loaded from c0 instead of c0 + GAP gave NMSE 0.84..1.47 for every type (negative control, by
 *   hand, 2026-12-03), and every one-hot weight but a few wrong.
 * - Against the GEMV (dec_gemv_ggml) on the same blocks and x: NMSE <= 1e-9.
 * - Lossless weights: x one-hot rows (256 tokens: four token tiles in one dispatch) give GGML's
 *   weights bit for bit (-0 compared as +0: a sum cannot keep it).
 * - DeviceLinear: with the GEMM on, a GgmlBlockLinear at S = 64 and 70 is one dispatch and equals the
 *   GEMV path's output.
 * - Split over the columns (GemmSplitScratch, runs of whole blocks; Lavapipe never splits by default,
 *   so the scratch is made here): 2..5 runs, a short last run, S = 13, 64, 70 (two token tiles),
 *   offsets; against the CPU and the unsplit GEMM (NMSE <= 1e-9); each of 3 calls behind barriers, each
 *   into its own y, equal bit for bit (the arrival words back at 0: a word left counting would have no
 *   workgroup write the second call's y). DeviceLinear with splits forced (LinearKernelsOptions.gemmSplits)
 *   on its GEMM chunks, decode unsplit.
 *   Negative controls (by hand, 2026-12-04, gemm_split.glsl): the last workgroup adding only its own
 *   partial (the other splits' dropped) gave NMSE 0.53..0.76 against the CPU, every type; the arrival
 *   word's reset dropped left every output of the second call unwritten.
 * Output buffers carry sentinel words before yOffset and past the end, checked after each run.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { GGML_GEMM_TOKENS, GgmlGemmKernel } from "../src/kernels/decoder/ggml-gemm.ts";
import { DeviceGgmlMatrix, GGML_GEMV_MAX_S, GgmlGemvKernel } from "../src/kernels/decoder/ggml-gemv.ts";
import { GemmSplitScratch, splitRuns } from "../src/kernels/decoder/quant-gemm.ts";
import { DeviceLinear, GEMM_FROM_TOKENS, LinearKernels } from "../src/graph/device-linear.ts";
import { GgmlBlockLinear } from "../src/model/linear.ts";
import { dequantizeGgml, GGML_BLOCK_LAYOUTS, GGML_BLOCK_TYPES, type GgmlBlockTensor, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { nmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, SENTINEL, SENTINEL_WORDS, u32 } from "./support/host-buffers.ts";
import { randomGgmlTensor as randomTensor, ggmlSplitCases } from "./support/ggml-blocks.ts";
import { ggmlGemmReference } from "./support/gemm-reference.ts";

const ctx = openTestContext();
const device = ctx.device;
const BOUND = 1e-9;

const gemms = new Map<GgmlBlockType, GgmlGemmKernel>();
const gemvs = new Map<GgmlBlockType, GgmlGemvKernel>();
const gemmFor = (type: GgmlBlockType) => gemms.get(type) ?? gemms.set(type, new GgmlGemmKernel(device, type)).get(type)!;
// The GEMV in the shape LinearKernels gives it on a CPU device (8 threads, 4 rows, 1 token a chunk): Lavapipe compiles it fastest.
const gemvFor = (type: GgmlBlockType) => gemvs.get(type) ?? gemvs.set(type, new GgmlGemvKernel(device, type, { workgroupSize: 8, rowsPerWorkgroup: 4, tokensPerChunk: 1 })).get(type)!;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of [...gemms.values(), ...gemvs.values()]) k[Symbol.dispose]();
  finish(ctx);
});

/** Records `record` over x (placed at xOffset) and a sentinel-guarded y (at yOffset), returns y [S, rows]. */
function runOnGpu(w: GgmlBlockTensor, x: Float32Array, S: number, xOffset: number, yOffset: number, record: (m: DeviceGgmlMatrix, xb: ReturnType<typeof hostBuffer>, yb: ReturnType<typeof hostBuffer>) => void): Float32Array {
  using m = new DeviceGgmlMatrix(device, w);
  using xb = hostBuffer(device, xOffset + S * w.cols, "upload");
  using yb = hostBuffer(device, yOffset + S * w.rows);
  f32(xb, S * w.cols, xOffset).set(x);
  record(m, xb, yb);
  const around = Array.from(u32(yb, yOffset)).concat(Array.from(u32(yb, SENTINEL_WORDS, yOffset + S * w.rows)));
  if (around.some((v) => v !== SENTINEL)) throw new Error(`${w.type} ${w.rows}x${w.cols} S=${S}: a sentinel word around y was overwritten`);
  return f32(yb, S * w.rows, yOffset).slice();
}

const gpuGemm = (w: GgmlBlockTensor, x: Float32Array, S: number, xOffset = 0, yOffset = 0) =>
  runOnGpu(w, x, S, xOffset, yOffset, (matrix, xb, yb) => submitAndWait(device, (cb) => gemmFor(w.type).record(cb, { matrix, x: xb, y: yb, S, xOffset, yOffset })));

/** The GEMV over the same blocks, 64 tokens a dispatch. */
const gpuGemv = (w: GgmlBlockTensor, x: Float32Array, S: number) =>
  runOnGpu(w, x, S, 0, 0, (matrix, xb, yb) =>
    submitAndWait(device, (cb) => {
      for (let t = 0; t < S; t += GGML_GEMV_MAX_S) gemvFor(w.type).record(cb, { matrix, x: xb, y: yb, S: Math.min(GGML_GEMV_MAX_S, S - t), xOffset: t * w.cols, yOffset: t * w.rows });
    }));

describe("dec_gemm_ggml vs the CPU (f64 over dequantizeGgml) and vs dec_gemv_ggml (NMSE <= 1e-9)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: rows 33 and 70, several blocks a row, S = 8, 13, 64, 70, offsets once`, () => {
      const k = GGML_BLOCK_LAYOUTS[type].blockElements === 256;
      let seed = 100 * (1 + GGML_BLOCK_TYPES.indexOf(type));
      const cases = [
        { w: randomTensor(type, 33, k ? 2 : 3, seed++), S: 8, xOffset: 4, yOffset: 3 },
        { w: randomTensor(type, 70, k ? 2 : 5, seed++), S: 13 },
        { w: randomTensor(type, 33, k ? 3 : 5, seed++), S: 64 },
        { w: randomTensor(type, 70, k ? 2 : 3, seed++), S: 70 }, // two token tiles
      ];
      let worstCpu = 0, worstGemv = 0;
      for (const { w, S, xOffset, yOffset } of cases) {
        const x = randomGaussianF32(S * w.cols, seed++);
        const got = gpuGemm(w, x, S, xOffset, yOffset);
        const eCpu = nmse(ggmlGemmReference(w, x, S), got), eGemv = nmse(gpuGemv(w, x, S), got);
        if (!(eCpu <= BOUND && eGemv <= BOUND)) throw new Error(`${type} ${w.rows}x${w.cols} S=${S}: NMSE ${eCpu} vs the CPU, ${eGemv} vs the GEMV`);
        worstCpu = Math.max(worstCpu, eCpu);
        worstGemv = Math.max(worstGemv, eGemv);
      }
      console.log(`  ${type}: worst NMSE ${worstCpu.toExponential(2)} vs the CPU, ${worstGemv.toExponential(2)} vs the GEMV, over ${cases.length} cases`);
      expect(worstCpu).toBeGreaterThan(0); // f32 sums against f64 ones: exactly 0 would mean y was not compared
    }, 60_000);
  }
});

describe("lossless: one-hot rows of x give GGML's weights bit for bit", () => {
  const bits = (v: number) => new Uint32Array(new Float32Array([v === 0 ? 0 : v]).buffer)[0]!; // -0 as +0
  test("every type: 33 rows, every column of one super-block (or 8 blocks), 256 tokens (four token tiles, one dispatch)", () => {
    let seed = 900;
    const failures: string[] = [];
    for (const type of GGML_BLOCK_TYPES) {
      const w = randomTensor(type, 33, GGML_BLOCK_LAYOUTS[type].blockElements === 256 ? 1 : 8, seed++);
      const S = w.cols; // token s = e_s
      expect(S).toBe(4 * GGML_GEMM_TOKENS);
      const x = new Float32Array(S * w.cols);
      for (let s = 0; s < S; s++) x[s * w.cols + s] = 1;
      const W = dequantizeGgml(w), y = gpuGemm(w, x, S);
      let count = 0, first = "";
      for (let s = 0; s < S; s++) {
        for (let r = 0; r < w.rows; r++) {
          const want = W[r * w.cols + s]!, got = y[s * w.rows + r]!;
          if (bits(want) !== bits(got) && count++ === 0) first = `[${r}, ${s}]: GPU ${got} vs ${want}`;
        }
      }
      if (count) failures.push(`${type}: ${count} of ${w.rows * w.cols} differ; first ${first}`);
    }
    expect(failures).toEqual([]);
  }, 60_000);
});

describe("DeviceLinear sends GGML block prompt chunks to the GEMM", () => {
  test("Q4_K and Q6_K: S = 64 and 70 are one dispatch each and equal the GEMV path (NMSE <= 1e-9); decode keeps the GEMV", () => {
    // integer-dot off: the GEMV side must be the float GEMV on every driver
    using gemmKernels = new LinearKernels(device, { integerDot: false, ggmlGemm: true });
    using gemvKernels = new LinearKernels(device, { integerDot: false, ggmlGemm: false });
    for (const type of ["Q4_K", "Q6_K"] as const) {
      const t = randomTensor(type, 37, 2, 90);
      const linear = new GgmlBlockLinear(type, t.bytes, t.rows, t.cols, "blk.0.attn_q.weight");
      using viaGemm = new DeviceLinear(gemmKernels, "blk.0.attn_q.weight", linear);
      using viaGemv = new DeviceLinear(gemvKernels, "blk.0.attn_q.weight", linear);
      expect([viaGemm.dispatches(1), viaGemm.dispatches(GEMM_FROM_TOKENS - 1), viaGemm.dispatches(64), viaGemm.dispatches(70)]).toEqual([1, 1, 1, 1]);
      expect([viaGemv.dispatches(64), viaGemv.dispatches(70)]).toEqual([1, 2]);
      for (const S of [64, 70]) {
        const x = randomGaussianF32(S * t.cols, 91 + S);
        const outputs = [viaGemm, viaGemv].map((dl) =>
          runOnGpu(t, x, S, 4, 3, (_m, xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S, 4, 3))));
        const ref = new Float32Array(S * t.rows);
        linear.apply(x, S, ref);
        const e = nmse(outputs[1]!, outputs[0]!);
        expect(e).toBeLessThanOrEqual(BOUND);
        expect(nmse(ref, outputs[0]!)).toBeLessThanOrEqual(BOUND);
      }
    }
  }, 60_000);
});

/** `calls` split calls behind barriers, each into its own sentinel-guarded y; returns each call's y [S, rows]. */
function gpuGemmSplit(w: GgmlBlockTensor, x: Float32Array, S: number, split: GemmSplitScratch, calls: number, xOffset = 0, yOffset = 0): Float32Array[] {
  using m = new DeviceGgmlMatrix(device, w);
  using xb = hostBuffer(device, xOffset + S * w.cols, "upload");
  const ys = Array.from({ length: calls }, () => hostBuffer(device, yOffset + S * w.rows));
  try {
    f32(xb, S * w.cols, xOffset).set(x);
    submitAndWait(device, (cb) => {
      ys.forEach((yb, i) => {
        if (i > 0) cb.barrier("computeToCompute");
        gemmFor(w.type).record(cb, { matrix: m, x: xb, y: yb, S, xOffset, yOffset }, split);
      });
    });
    return ys.map((yb, i) => {
      const around = Array.from(u32(yb, yOffset)).concat(Array.from(u32(yb, SENTINEL_WORDS, yOffset + S * w.rows)));
      if (around.some((v) => v !== SENTINEL)) throw new Error(`${w.type} ${w.rows}x${w.cols} S=${S} call ${i}: a sentinel word around y was overwritten`);
      return f32(yb, S * w.rows, yOffset).slice();
    });
  } finally {
    for (const yb of ys) yb[Symbol.dispose]();
  }
}

const bitsOf = (y: Float32Array) => Array.from(new Uint32Array(y.buffer, y.byteOffset, y.length));


describe("dec_gemm_ggml split over the columns (GemmSplitScratch, runs of whole blocks) vs the CPU and the unsplit GEMM (NMSE <= 1e-9)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: 2..5 runs, a short last run, S = 13, 64, 70, offsets; 3 calls behind barriers equal bit for bit`, () => {
      const block = GGML_BLOCK_LAYOUTS[type].blockElements;
      let seed = 3000 + 100 * GGML_BLOCK_TYPES.indexOf(type);
      let worstCpu = 0, worstUnsplit = 0;
      for (const c of ggmlSplitCases(block === 256)) {
        const w = randomTensor(type, c.rows, c.blocks, seed++);
        const x = randomGaussianF32(c.S * w.cols, seed++);
        using split = new GemmSplitScratch(device, w.rows, w.cols, c.S, c.splits, block);
        expect({ c, runs: split.splits, whole: split.splitCols % block }).toEqual({ c, runs: c.runs, whole: 0 });
        const [first, ...again] = gpuGemmSplit(w, x, c.S, split, 3, c.xOffset, c.yOffset);
        const eCpu = nmse(ggmlGemmReference(w, x, c.S), first!), eUnsplit = nmse(gpuGemm(w, x, c.S), first!);
        if (!(eCpu <= BOUND && eUnsplit <= BOUND)) throw new Error(`${type} ${w.rows}x${w.cols} S=${c.S}, ${split.splits} runs: NMSE ${eCpu} vs the CPU, ${eUnsplit} vs the unsplit GEMM`);
        for (const y of again) expect(bitsOf(y)).toEqual(bitsOf(first!));
        worstCpu = Math.max(worstCpu, eCpu);
        worstUnsplit = Math.max(worstUnsplit, eUnsplit);
      }
      console.log(`  ${type} split: worst NMSE ${worstCpu.toExponential(2)} vs the CPU, ${worstUnsplit.toExponential(2)} vs the unsplit GEMM`);
      expect(worstCpu).toBeGreaterThan(0);
    }, 60_000);
  }

  test("splitRuns in whole blocks; a scratch whose runs are not whole blocks of the matrix's type, or of another shape, is refused", () => {
    expect(splitRuns(768, 2, 256)).toEqual({ splitCols: 512, splits: 2 });
    expect(splitRuns(2048, 5, 256)).toEqual({ splitCols: 512, splits: 4 }); // fewer runs than asked: whole blocks
    expect(splitRuns(288, 5, 32)).toEqual({ splitCols: 64, splits: 5 });
    expect(() => new GemmSplitScratch(device, 8, 256, 64, 2, 256)).toThrow(/leave 1 run/);
    const w = randomTensor("Q4_K", 3, 2, 1);
    using m = new DeviceGgmlMatrix(device, w);
    using b = hostBuffer(device, 70 * 512, "upload");
    using bySlices = new GemmSplitScratch(device, 3, 512, 64, 4); // runs of 128 columns: half a super-block
    using shaped = new GemmSplitScratch(device, 4, 512, 64, 2, 256);
    using short = new GemmSplitScratch(device, 3, 512, 8, 2, 256);
    const rec = (split: GemmSplitScratch, S = 9) => () => submitAndWait(device, (cb) => gemmFor("Q4_K").record(cb, { matrix: m, x: b, y: b, S }, split));
    expect(rec(bySlices)).toThrow(/not whole Q4_K blocks/);
    expect(rec(shaped)).toThrow(/split scratch of 4 x 512/);
    expect(rec(short)).toThrow(/for 8 tokens/);
  });
});

describe("DeviceLinear splits its GEMM chunks where gemmSplits says (forced here: Lavapipe never splits)", () => {
  test("Q4_K and Q5_0: S = 64 split (= the kernel with the same scratch, bit for bit), 70 and decode unsplit; within 1e-9 of the unsplit matrix", () => {
    using split = new LinearKernels(device, { integerDot: false, gemmSplits: () => 3 });
    using plain = new LinearKernels(device, { integerDot: false });
    for (const type of ["Q4_K", "Q5_0"] as const) {
      const t = randomTensor(type, 37, type === "Q4_K" ? 3 : 9, 95);
      const linear = new GgmlBlockLinear(type, t.bytes, t.rows, t.cols, "blk.0.attn_output.weight");
      using viaSplit = new DeviceLinear(split, "blk.0.attn_output.weight", linear);
      using viaPlain = new DeviceLinear(plain, "blk.0.attn_output.weight", linear);
      using scratch = new GemmSplitScratch(device, t.rows, t.cols, 64, 3, GGML_BLOCK_LAYOUTS[type].blockElements);
      for (const S of [1, 64, 70]) {
        const x = randomGaussianF32(S * t.cols, 96 + S);
        const [a, b] = [viaSplit, viaPlain].map((dl) => runOnGpu(t, x, S, 4, 3, (_m, xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S, 4, 3))));
        expect(nmse(b!, a!)).toBeLessThanOrEqual(BOUND);
        const kernelSplit = runOnGpu(t, x, S, 4, 3, (m, xb, yb) => submitAndWait(device, (cb) => gemmFor(type).record(cb, { matrix: m, x: xb, y: yb, S, xOffset: 4, yOffset: 3 }, S <= 64 ? scratch : undefined)));
        // S = 64: the split sums (not the unsplit ones, which differ in the last bits); 70: one run; 1: the GEMV
        if (S === 64) {
          expect(bitsOf(a!)).toEqual(bitsOf(kernelSplit));
          expect(bitsOf(a!)).not.toEqual(bitsOf(b!));
        } else if (S === 70) expect(bitsOf(a!)).toEqual(bitsOf(b!));
      }
    }
  }, 60_000);
});

describe("argument checks", () => {
  test("S < 1 or not an integer, x or y too short, an unaligned xOffset, a matrix of another type, an unknown type", () => {
    const w = randomTensor("Q4_1", 3, 2, 1);
    using m = new DeviceGgmlMatrix(device, w);
    using b = hostBuffer(device, 70 * 64, "upload");
    using out = hostBuffer(device, 70 * 3);
    using small = hostBuffer(device, 8, "upload");
    const k = gemmFor("Q4_1");
    const rec = (a: Partial<Parameters<GgmlGemmKernel["record"]>[1]>, kernel = k) => () => submitAndWait(device, (cb) => kernel.record(cb, { matrix: m, x: b, y: out, S: 1, ...a }));
    expect(rec({ S: 0 })).toThrow(/S must be/);
    expect(rec({ S: 1.5 })).toThrow(/S must be/);
    expect(rec({ S: 70 })).not.toThrow(); // any S: 70 tokens of 64 columns fit b
    expect(rec({ x: small, S: 1 })).toThrow(/gemm x/);
    expect(rec({ S: 70, xOffset: 4 * Math.ceil((SENTINEL_WORDS + 1) / 4) })).toThrow(/gemm x/); // past b's sentinel words too
    expect(rec({ y: small, S: 9 })).toThrow(/gemm y/); // 27 floats past 8 + the sentinel words
    expect(rec({ xOffset: 2 })).toThrow(/multiple of 4/);
    expect(rec({}, gemmFor("Q5_1"))).toThrow(/a Q4_1 matrix on a Q5_1 kernel/);
    expect(() => new GgmlGemmKernel(device, "Q2_K" as GgmlBlockType)).toThrow(/Q2_K/);
  });
});
