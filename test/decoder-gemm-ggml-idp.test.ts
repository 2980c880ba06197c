/**
 * dec_gemm_ggml_idp (src/kernels/decoder/ggml-gemm.ts: GgmlGemmIdpKernel) on the real driver under the
 * validation layer: the integer-dot GEMM of prompt chunks straight from GGML blocks (Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K), x quantized by quantize_act in groups of 16 columns.
 *
 * - Against the GEMM of the x the GPU quantized, formed on the CPU (GGML's exact weights times
 *   q * scale, quantize_act's rule, f64 sums): NMSE <= 1e-9 per case. The tight gate: only f32
 *   rounding separates the two, so a wrong min, offset, scale, run or token tile fails it.
 * - Against the float GEMM (dec_gemm_ggml) on the same blocks and f32 x: NMSE <= 1e-3, the bound for
 *   an 8-bit x, over each type's cases together and over each case of 64 outputs or more.
 * - recordQuantized over a scratch that an earlier record quantized equals record bit for bit; 2, 3
 *   and 4 slices a step (slicesPerStep) equal 1 bit for bit.
 * Shapes: random blocks and llama-quantize's (test/fixtures/ggml-blocks/blocks.gguf), rows 3, 7, 33, 70
 * (partial 32-row tiles), rows of 1, 2 and 9 blocks (32-element types) or 1, 2 and 3 super-blocks,
 * S = 8, 13, 64, 70 (two token tiles), x/y offsets; sentinels around y. DeviceLinear: prompt chunks
 * of 9..64 tokens through the integer-dot GEMM (2 dispatches; 1 from quantized rows, takesQuantized),
 * 70 through the float GEMM, ggmlGemmIdp: false keeping the float GEMM.
 * - Split over the columns (GemmSplitScratch, runs of whole blocks, made here: Lavapipe never splits
 *   by default): 2..5 runs, a short last run, S = 13, 64, 70, offsets; against the quantized x's exact
 *   GEMM (<= 1e-9) and the unsplit kernel (<= 1e-9); 3 calls behind barriers, each into its own y,
 *   equal bit for bit; recordQuantized and 3 or 4 slices a step equal record and 1 bit for bit with
 *   the same scratch. DeviceLinear with splits forced on its idp GEMM chunks.
 *   Negative control (by hand, 2026-12-04): the other splits' partials dropped (gemm_split.glsl) gave
 *   NMSE 0.55..0.63 against the quantized x's exact GEMM (Q4_1, Q5_0, Q5_1; the K-quants failed first
 *   on the repeated calls, whose last workgroup, and so y, then differs).
 *
 * Negative controls (by hand, 2026-12-03): the slice's second run of x read at the first run's group
 * (`+ run * GAP` dropped in loadStep) gave NMSE 0.53..1.64 against the quantized-x reference, every
 * type; the offset dropped (MAGIC in place of MAGIC - OFF * xsum) 0.85 (Q5_0) and 3.18 (Q6_K).
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { openGguf } from "../src/formats/gguf.ts";
import type { GgufFile } from "../src/formats/tensor.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { GgmlGemmIdpKernel, GgmlGemmKernel } from "../src/kernels/decoder/ggml-gemm.ts";
import { DeviceGgmlMatrix, GGML_IDP_GROUP, GgmlIdpScratch, QuantizedRowsBuffers } from "../src/kernels/decoder/ggml-gemv.ts";
import { GemmSplitScratch } from "../src/kernels/decoder/quant-gemm.ts";
import { DEC_GEMM_GGML_IDP, IDP_PIPELINES } from "../src/kernels/shaders.ts";
import { DeviceLinear, GGML_IDP_GEMM_MAX_TOKENS, GGML_IDP_MAX_TOKENS, LinearKernels } from "../src/graph/device-linear.ts";
import { GgmlBlockLinear } from "../src/model/linear.ts";
import { GGML_BLOCK_LAYOUTS, GGML_BLOCK_TYPES, ggmlBlockTensor, type GgmlBlockTensor, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { dequantizedActivations } from "../src/quant/intdot.ts";
import { nmse, pooledNmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, SENTINEL, SENTINEL_WORDS, u32 } from "./support/host-buffers.ts";
import { randomGgmlTensor as randomTensor, ggmlSplitCases } from "./support/ggml-blocks.ts";
import { ggmlGemmReference } from "./support/gemm-reference.ts";

const ctx = openTestContext({ integerDotProduct: "on" });
const device = ctx.device;
/** A driver without shaderIntegerDotProduct has no integer-dot path to test (Lavapipe has it). */
const noIdp = !device.enabled.integerDotProduct;
if (noIdp) console.log(`decoder-gemm-ggml-idp: integer-dot tests skipped: ${device.info.name} has no shaderIntegerDotProduct`);
const fixture: GgufFile = await openGguf(new URL("fixtures/ggml-blocks/blocks.gguf", import.meta.url).pathname);

const idpKernels = new Map<string, GgmlGemmIdpKernel>();
const floatKernels = new Map<GgmlBlockType, GgmlGemmKernel>();
const idpFor = (type: GgmlBlockType, slicesPerStep = 1) =>
  idpKernels.get(`${type}/${slicesPerStep}`) ?? idpKernels.set(`${type}/${slicesPerStep}`, new GgmlGemmIdpKernel(device, type, { slicesPerStep })).get(`${type}/${slicesPerStep}`)!;
const floatFor = (type: GgmlBlockType) => floatKernels.get(type) ?? floatKernels.set(type, new GgmlGemmKernel(device, type)).get(type)!;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of [...idpKernels.values(), ...floatKernels.values()]) k[Symbol.dispose]();
  fixture[Symbol.dispose]();
  finish(ctx);
});

const fixtureTensors = (type: GgmlBlockType) =>
  [...fixture.tensors.values()].filter((t) => t.dtype === type).map((v) => ggmlBlockTensor(type, v.bytes, v.shape[0]!, v.shape[1]!, v.name));

/** Quantized rows for S tokens of `cols` (not a GgmlIdpScratch: S may pass its 64). */
const quantizedRows = (cols: number, S: number) => new QuantizedRowsBuffers(device, S * cols);

/** Runs `record` over x (placed at xOffset) and a sentinel-guarded y (at yOffset); returns y [S, rows]. */
function runOnGpu(w: GgmlBlockTensor, x: Float32Array, S: number, xOffset: number, yOffset: number, record: (m: DeviceGgmlMatrix, xb: Buffer, yb: Buffer) => void): Float32Array {
  using m = new DeviceGgmlMatrix(device, w);
  using xb = hostBuffer(device, xOffset + S * w.cols, "upload");
  using yb = hostBuffer(device, yOffset + S * w.rows);
  f32(xb, S * w.cols, xOffset).set(x);
  record(m, xb, yb);
  const around = Array.from(u32(yb, yOffset)).concat(Array.from(u32(yb, SENTINEL_WORDS, yOffset + S * w.rows)));
  if (around.some((v) => v !== SENTINEL)) throw new Error(`${w.type} ${w.rows}x${w.cols} S=${S}: a sentinel word around y was overwritten`);
  return f32(yb, S * w.rows, yOffset).slice();
}

const gpuIdp = (w: GgmlBlockTensor, x: Float32Array, S: number, xOffset = 0, yOffset = 0, slicesPerStep = 1, split?: GemmSplitScratch) =>
  runOnGpu(w, x, S, xOffset, yOffset, (matrix, xb, yb) => {
    using scratch = quantizedRows(w.cols, S);
    submitAndWait(device, (cb) => idpFor(w.type, slicesPerStep).record(cb, { matrix, x: xb, y: yb, S, xOffset, yOffset, scratch }, split));
  });
const bits = (y: Float32Array) => Array.from(new Uint32Array(y.buffer, y.byteOffset, y.length));

const gpuFloat = (w: GgmlBlockTensor, x: Float32Array, S: number) =>
  runOnGpu(w, x, S, 0, 0, (matrix, xb, yb) => submitAndWait(device, (cb) => floatFor(w.type).record(cb, { matrix, x: xb, y: yb, S })));

describe.skipIf(noIdp)("dec_gemm_ggml_idp vs the exact GEMM of the quantized x (NMSE <= 1e-9) and vs the float GEMM (<= 1e-3)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: rows 3..70, 1..9 blocks a row, S = 8, 13, 64, 70, llama-quantize blocks, offsets`, () => {
      const k = GGML_BLOCK_LAYOUTS[type].blockElements === 256;
      let seed = 5000 + 100 * GGML_BLOCK_TYPES.indexOf(type);
      const cases: { w: GgmlBlockTensor; S: number; xOffset?: number; yOffset?: number }[] = [
        { w: randomTensor(type, 33, 1, seed++), S: 8, xOffset: 4, yOffset: 3 },
        { w: randomTensor(type, 70, 2, seed++), S: 13, xOffset: 12, yOffset: 1 },
        { w: randomTensor(type, 7, k ? 3 : 9, seed++), S: 64 },
        { w: randomTensor(type, 70, k ? 2 : 9, seed++), S: 70 }, // two token tiles, the second of 6
        ...fixtureTensors(type).map((w) => ({ w, S: 13 })),
      ];
      let worstExact = 0;
      const results = cases.map(({ w, S, xOffset, yOffset }) => {
        const x = randomGaussianF32(S * w.cols, seed++);
        const got = gpuIdp(w, x, S, xOffset, yOffset);
        const vsExact = nmse(ggmlGemmReference(w, dequantizedActivations(x, GGML_IDP_GROUP), S), got);
        if (!(vsExact <= 1e-9)) throw new Error(`${type} ${w.rows}x${w.cols} S=${S}: NMSE ${vsExact} against the exact GEMM of the quantized x (bound 1e-9)`);
        worstExact = Math.max(worstExact, vsExact);
        return { ref: gpuFloat(w, x, S), got };
      });
      const vsFloat = pooledNmse(results), big = results.filter((r) => r.ref.length >= 64).map((r) => nmse(r.ref, r.got));
      console.log(`  ${type}: worst NMSE ${worstExact.toExponential(2)} vs the quantized x's exact GEMM; ${vsFloat.toExponential(2)} vs the float GEMM (worst case ${Math.max(...big).toExponential(2)}), over ${cases.length} cases`);
      expect(worstExact).toBeGreaterThan(0); // f32 sums against f64 ones: exactly 0 would mean y was not compared
      expect(vsFloat).toBeLessThanOrEqual(1e-3);
      for (const e of big) expect(e).toBeLessThanOrEqual(1e-3);
    }, 60_000);
  }

  // each (type, step) is a pipeline, ~2 s of LLVM on Lavapipe: a few that cover a part-empty last step and a full one
  test("2, 3 and 4 slices a step give the same sums as 1 bit for bit (the last step part empty: Q4_1 1 and 5 slices, Q6_K 8 by 3; full: Q4_K 24 by 4)", () => {
    let seed = 81;
    for (const [type, blocks, steps] of [["Q4_1", 1, [2]], ["Q4_1", 5, [2, 3]], ["Q6_K", 1, [3]], ["Q4_K", 3, [4]]] as const) {
      const w = randomTensor(type, 35, blocks, seed++), S = 19;
      const x = randomGaussianF32(S * w.cols, seed++);
      const one = gpuIdp(w, x, S, 0, 1);
      expect(nmse(ggmlGemmReference(w, dequantizedActivations(x, GGML_IDP_GROUP), S), one)).toBeLessThanOrEqual(1e-9);
      for (const step of steps) expect({ step, y: bits(gpuIdp(w, x, S, 0, 1, step)) }).toEqual({ step, y: bits(one) });
    }
  }, 60_000);

  test("recordQuantized over the rows an earlier record quantized equals record bit for bit (Q4_K, Q6_K, Q5_1)", () => {
    let seed = 61;
    for (const type of ["Q4_K", "Q6_K", "Q5_1"] as const) {
      const w = randomTensor(type, 45, type === "Q5_1" ? 8 : 1, seed++), S = 37;
      const x = randomGaussianF32(S * w.cols, seed++);
      using matrix = new DeviceGgmlMatrix(device, w);
      using scratch = new GgmlIdpScratch(device, w.cols, GGML_IDP_GEMM_MAX_TOKENS);
      using xb = hostBuffer(device, S * w.cols, "upload");
      using y1 = hostBuffer(device, S * w.rows);
      using y2 = hostBuffer(device, 2 + S * w.rows);
      f32(xb, S * w.cols).set(x);
      const k = idpFor(type);
      submitAndWait(device, (cb) => k.record(cb, { matrix, x: xb, y: y1, S, scratch }));
      submitAndWait(device, (cb) => k.recordQuantized(cb, { matrix, y: y2, S, yOffset: 2, scratch }));
      expect(Array.from(u32(y2, S * w.rows, 2))).toEqual(Array.from(u32(y1, S * w.rows)));
      expect(Array.from(u32(y2, 2))).toEqual([SENTINEL, SENTINEL]);
      expect(nmse(ggmlGemmReference(w, dequantizedActivations(x, GGML_IDP_GROUP), S), f32(y1, S * w.rows))).toBeLessThanOrEqual(1e-9);
    }
  }, 60_000);
});


describe.skipIf(noIdp)("dec_gemm_ggml_idp split over the columns (GemmSplitScratch, runs of whole blocks)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: 2..5 runs, a short last run, S = 13, 64, 70, offsets, vs the quantized x's exact GEMM and the unsplit kernel (NMSE <= 1e-9); 3 calls behind barriers equal bit for bit`, () => {
      const block = GGML_BLOCK_LAYOUTS[type].blockElements;
      let seed = 7000 + 100 * GGML_BLOCK_TYPES.indexOf(type);
      let worstExact = 0, worstUnsplit = 0;
      for (const c of ggmlSplitCases(block === 256)) {
        const w = randomTensor(type, c.rows, c.blocks, seed++), S = c.S, xOffset = c.xOffset ?? 0, yOffset = c.yOffset ?? 0;
        const x = randomGaussianF32(S * w.cols, seed++);
        using split = new GemmSplitScratch(device, w.rows, w.cols, S, c.splits, block);
        expect({ c, runs: split.splits, whole: split.splitCols % block }).toEqual({ c, runs: c.runs, whole: 0 });
        // three calls, each into its own y: a tile's arrival word left counting would leave the next call's y unwritten
        const ys = runOnGpu(w, x, S, xOffset, yOffset, (matrix, xb, first) => {
          using scratch = quantizedRows(w.cols, S);
          using y2 = hostBuffer(device, yOffset + S * w.rows);
          using y3 = hostBuffer(device, yOffset + S * w.rows);
          submitAndWait(device, (cb) => {
            idpFor(type).record(cb, { matrix, x: xb, y: first, S, xOffset, yOffset, scratch }, split);
            for (const y of [y2, y3]) idpFor(type).recordQuantized(cb.barrier("computeToCompute"), { matrix, y, S, yOffset, scratch }, split);
          });
          for (const y of [y2, y3]) expect(Array.from(u32(y, S * w.rows, yOffset))).toEqual(Array.from(u32(first, S * w.rows, yOffset)));
        });
        const eExact = nmse(ggmlGemmReference(w, dequantizedActivations(x, GGML_IDP_GROUP), S), ys), eUnsplit = nmse(gpuIdp(w, x, S), ys);
        if (!(eExact <= 1e-9 && eUnsplit <= 1e-9)) throw new Error(`${type} ${w.rows}x${w.cols} S=${S}, ${split.splits} runs: NMSE ${eExact} vs the quantized x's exact GEMM, ${eUnsplit} vs the unsplit kernel`);
        worstExact = Math.max(worstExact, eExact);
        worstUnsplit = Math.max(worstUnsplit, eUnsplit);
      }
      console.log(`  ${type} split: worst NMSE ${worstExact.toExponential(2)} vs the quantized x's exact GEMM, ${worstUnsplit.toExponential(2)} vs the unsplit kernel`);
      expect(worstExact).toBeGreaterThan(0);
    }, 60_000);
  }

  test("3 and 4 slices a step over split runs equal 1 bit for bit (Q4_1: runs of 5 and 4 slices by 3; Q4_K: 24 and 24 by 4)", () => {
    let seed = 91;
    for (const [type, blocks, splits, step] of [["Q4_1", 9, 2, 3], ["Q4_K", 6, 2, 4]] as const) {
      const w = randomTensor(type, 35, blocks, seed++), S = 19;
      const x = randomGaussianF32(S * w.cols, seed++);
      using split = new GemmSplitScratch(device, w.rows, w.cols, S, splits, GGML_BLOCK_LAYOUTS[type].blockElements);
      const one = gpuIdp(w, x, S, 0, 1, 1, split);
      expect(nmse(ggmlGemmReference(w, dequantizedActivations(x, GGML_IDP_GROUP), S), one)).toBeLessThanOrEqual(1e-9);
      expect(bits(gpuIdp(w, x, S, 0, 1, step, split))).toEqual(bits(one));
    }
  }, 60_000);
});

describe.skipIf(noIdp)("DeviceLinear sends prompt chunks of GGML block matrices to the integer-dot GEMM", () => {
  test(`Q4_K, Q6_K, Q5_0: S = ${GGML_IDP_MAX_TOKENS} the GEMV, ${GGML_IDP_MAX_TOKENS + 1} and ${GGML_IDP_GEMM_MAX_TOKENS} the idp GEMM (2 dispatches, = the kernel's output), 70 the float GEMM; ggmlGemmIdp: false the float GEMM`, () => {
    using idp = new LinearKernels(device, { integerDot: true });
    // both integer-dot GEMMs off (the q4/q8 one would keep the quantized rows at 64 tokens)
    using forced = new LinearKernels(device, { integerDot: true, ggmlGemmIdp: false, quantGemmIdp: false });
    expect([idp.ggmlGemmIdp, forced.ggmlGemmIdp]).toEqual([true, false]);
    let seed = 200;
    for (const type of ["Q4_K", "Q6_K", "Q5_0"] as const) {
      const t = randomTensor(type, 37, type === "Q5_0" ? 16 : 2, seed++);
      const linear = new GgmlBlockLinear(type, t.bytes, t.rows, t.cols, "blk.0.attn_q.weight");
      using viaIdp = new DeviceLinear(idp, "blk.0.attn_q.weight", linear);
      using viaFloat = new DeviceLinear(forced, "blk.0.attn_q.weight", linear);
      // the norms' and attention's quantized rows feed the GEMV's calls and the idp GEMM's chunks (test/rmsnorm-quant-gpu.test.ts)
      const takes = (dl: DeviceLinear) => [GGML_IDP_MAX_TOKENS, GGML_IDP_MAX_TOKENS + 1, GGML_IDP_GEMM_MAX_TOKENS, 70].map((S) => dl.takesQuantized(S));
      expect([idp.quantizedTokens, forced.quantizedTokens]).toEqual([GGML_IDP_GEMM_MAX_TOKENS, GGML_IDP_MAX_TOKENS]);
      expect([takes(viaIdp), takes(viaFloat)]).toEqual([[true, true, true, false], [true, false, false, false]]);
      for (const S of [GGML_IDP_MAX_TOKENS, GGML_IDP_MAX_TOKENS + 1, GGML_IDP_GEMM_MAX_TOKENS, 70]) {
        const gemm = S > GGML_IDP_MAX_TOKENS && S <= GGML_IDP_GEMM_MAX_TOKENS;
        expect(viaIdp.dispatches(S)).toBe(S > GGML_IDP_GEMM_MAX_TOKENS ? 1 : 2);
        expect(viaFloat.dispatches(S)).toBe(S > GGML_IDP_MAX_TOKENS ? 1 : 2);
        const x = randomGaussianF32(S * t.cols, seed++);
        const ref = new Float32Array(S * t.rows);
        linear.apply(x, S, ref);
        const [a, b] = [viaIdp, viaFloat].map((dl) => runOnGpu(t, x, S, 4, 3, (_m, xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S, 4, 3))));
        const eIdp = nmse(ref, a!), eFloat = nmse(ref, b!);
        if (S <= GGML_IDP_GEMM_MAX_TOKENS) {
          // the integer-dot paths: within the 8-bit x's error, not the float path's f32 rounding
          expect(eIdp).toBeLessThanOrEqual(1e-3);
          expect(eIdp).toBeGreaterThan(1e-9);
        } else expect(eIdp).toBeLessThanOrEqual(1e-9);
        if (S > GGML_IDP_MAX_TOKENS) expect(eFloat).toBeLessThanOrEqual(1e-9);
        if (gemm) expect(bits(a!)).toEqual(bits(gpuIdp(t, x, S)));
      }
    }
  }, 60_000);

  test("splits forced (Lavapipe never splits): Q4_K and Q5_0 chunks of 13 and 64 tokens split (= the kernel with the same scratch, bit for bit), 70 on the unsplit float GEMM, decode on the GEMV", () => {
    using split = new LinearKernels(device, { integerDot: true, gemmSplits: () => 3 });
    using plain = new LinearKernels(device, { integerDot: true });
    let seed = 300;
    for (const type of ["Q4_K", "Q5_0"] as const) {
      const t = randomTensor(type, 37, type === "Q4_K" ? 3 : 9, seed++);
      const linear = new GgmlBlockLinear(type, t.bytes, t.rows, t.cols, "blk.0.attn_output.weight");
      using viaSplit = new DeviceLinear(split, "blk.0.attn_output.weight", linear);
      using viaPlain = new DeviceLinear(plain, "blk.0.attn_output.weight", linear);
      using scratch = new GemmSplitScratch(device, t.rows, t.cols, 64, 3, GGML_BLOCK_LAYOUTS[type].blockElements);
      for (const S of [1, 13, 64, 70]) {
        const x = randomGaussianF32(S * t.cols, seed++);
        const [a, b] = [viaSplit, viaPlain].map((dl) => runOnGpu(t, x, S, 4, 3, (_m, xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S, 4, 3))));
        if (S > GGML_IDP_MAX_TOKENS && S <= GGML_IDP_GEMM_MAX_TOKENS) {
          expect(bits(a!)).toEqual(bits(gpuIdp(t, x, S, 0, 0, 1, scratch)));
          expect(nmse(b!, a!)).toBeLessThanOrEqual(1e-9);
          expect(bits(a!)).not.toEqual(bits(b!)); // the split sums, not the unsplit ones
        } else expect(bits(a!)).toEqual(bits(b!));
      }
    }
  }, 60_000);
});

describe("probe and argument checks", () => {
  test("the child-process probe creates the integer-dot GEMM of every format", () => {
    const formats = IDP_PIPELINES.filter((p) => p.spirv.endsWith(`${DEC_GEMM_GGML_IDP.name}.spv`)).map((p) => p.specialization?.[0]);
    expect(formats.sort()).toEqual([0, 1, 2, 3, 4, 5]);
  });

  test("a device without shaderIntegerDotProduct: one clear error, and LinearKernels keeps the float GEMM", () => {
    using off = openTestContext({ integerDotProduct: "off" });
    expect(() => new GgmlGemmIdpKernel(off.device, "Q4_K")).toThrow(/needs shaderIntegerDotProduct/);
    using lk = new LinearKernels(off.device);
    expect([lk.integerDot, lk.ggmlGemmIdp]).toEqual([false, false]);
  });

  test.skipIf(noIdp)("a scratch too small or of the wrong width, a matrix of another type, bad S", () => {
    const w = randomTensor("Q4_K", 3, 1, 1);
    using m = new DeviceGgmlMatrix(device, w);
    using b = hostBuffer(device, 80 * 256, "upload");
    using narrow = new GgmlIdpScratch(device, 128, 4);
    using short = quantizedRows(256, 2);
    using ok = quantizedRows(256, 80);
    const k = idpFor("Q4_K");
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 1, scratch: narrow }))).toThrow(/scratch of 4 tokens x 128 columns/);
    expect(() => submitAndWait(device, (cb) => k.recordQuantized(cb, { matrix: m, y: b, S: 3, scratch: short }))).toThrow(/xq/);
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 0, scratch: ok }))).toThrow(/S must be/);
    expect(() => submitAndWait(device, (cb) => idpFor("Q6_K").record(cb, { matrix: m, x: b, y: b, S: 1, scratch: ok }))).toThrow(/a Q4_K matrix on a Q6_K kernel/);
    expect(() => new GgmlGemmIdpKernel(device, "Q4_K", { slicesPerStep: 5 })).toThrow(/slicesPerStep/);
  });
});
