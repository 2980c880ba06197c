/**
 * dec_gemm_quant_idp (src/kernels/decoder/quant-gemm-idp.ts: QuantGemmIdpKernel) on the real driver
 * under the validation layer: the integer-dot GEMM of prompt chunks over q4/q8 pool matrices (GGUF's
 * Q4_0 / Q8_0 as the graphs hold them), x quantized by quantize_act in groups of 16 columns.
 *
 * - Against the GEMM of the x the GPU quantized, on the CPU (the matrix's exact weights times
 *   q * scale, f64 sums): NMSE <= 1e-9 per case. Only f32 rounding separates the two, so a wrong
 *   nibble order, offset, scale group, run or token tile fails it.
 * - Against the float GEMM (dec_gemm_quant) on the same matrix and f32 x: NMSE <= 1e-3, the bound
 *   for an 8-bit x, pooled over each format's cases.
 * - recordQuantized over a scratch an earlier record quantized equals record bit for bit.
 * - Split over the columns (GemmSplitScratch, made here: Lavapipe never splits by default): 2..4
 *   runs, a short last run; against the exact GEMM (<= 1e-9) and the unsplit kernel (<= 1e-9).
 * Shapes: q4 and q8; f16 and f32 scales; groups of 32, 64 and 128; rows 3, 33, 70 (partial 32-row
 * tiles); rows of 32, 96, 256 and 640 columns; S = 8, 13, 64, 70 (two token tiles); x/y offsets;
 * sentinels around y. DeviceLinear: prompt chunks of 8..64 tokens through the integer-dot GEMM
 * (2 dispatches; 1 from quantized rows, takesQuantized), 70 through the float GEMM, 1..7 the GEMV;
 * quantGemmIdp: false, and rows not a multiple of 32 columns, keeping the float GEMM.
 *
 * Negative control (by hand, 2026-12-04): q4's first two runs' words swapped low/high nibbles and q8's
 * second run read without its top bit flipped gave NMSE 0.47 (q4) and 3.08 (q8) against the
 * quantized x's exact GEMM, and failed the split cases.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { GGML_IDP_GROUP, QuantizedRowsBuffers } from "../src/kernels/decoder/ggml-gemv.ts";
import { GemmSplitScratch, QuantGemmKernel } from "../src/kernels/decoder/quant-gemm.ts";
import { QuantGemmIdpKernel } from "../src/kernels/decoder/quant-gemm-idp.ts";
import { DeviceMatrix } from "../src/kernels/gemv.ts";
import { DEC_GEMM_QUANT_IDP, IDP_PIPELINES } from "../src/kernels/shaders.ts";
import { DeviceLinear, GGML_IDP_GEMM_MAX_TOKENS, LinearKernels } from "../src/graph/device-linear.ts";
import { QuantLinear } from "../src/model/linear.ts";
import { dequantize, quantize, type QuantFormat, type QuantMatrix } from "../src/quant/index.ts";
import { dequantizedActivations } from "../src/quant/intdot.ts";
import { nmse, pooledNmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, SENTINEL, SENTINEL_WORDS, u32 } from "./support/host-buffers.ts";
import { exactGemm } from "./support/gemm-reference.ts";

const ctx = openTestContext({ integerDotProduct: "on" });
const device = ctx.device;
const noIdp = !device.enabled.integerDotProduct;
if (noIdp) console.log(`decoder-gemm-quant-idp: integer-dot tests skipped: ${device.info.name} has no shaderIntegerDotProduct`);

const kernels = new Map<string, QuantGemmIdpKernel | QuantGemmKernel>();
const kernelFor = <K extends QuantGemmIdpKernel | QuantGemmKernel>(kind: "idp" | "float", m: QuantMatrix): K => {
  const key = `${kind}/${m.format}/${m.scaleType}/${m.groupSize}`;
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = kind === "idp" ? new QuantGemmIdpKernel(device, m.format, m.scaleType === "f16", m.groupSize) : new QuantGemmKernel(device, m.format, m.scaleType === "f16", m.groupSize)));
  return k as K;
};
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of kernels.values()) k[Symbol.dispose]();
  finish(ctx);
});

const matrix = (format: QuantFormat, rows: number, cols: number, groupSize: 32 | 64 | 128, scaleType: "f16" | "f32", seed: number) =>
  quantize({ dtype: "f32", data: randomGaussianF32(rows * cols, seed) }, rows, cols, { format, groupSize, scaleType });

/** Quantized rows for S tokens of `cols` (not a GgmlIdpScratch: S may pass its 64). */
const quantizedRows = (cols: number, S: number) => new QuantizedRowsBuffers(device, S * cols);

/** Runs `record` over x (at xOffset) and a sentinel-guarded y (at yOffset); returns y [S, rows]. */
function runOnGpu(m: QuantMatrix, x: Float32Array, S: number, xOffset: number, yOffset: number, record: (d: DeviceMatrix, xb: Buffer, yb: Buffer) => void): Float32Array {
  using d = new DeviceMatrix(device, m);
  using xb = hostBuffer(device, xOffset + S * m.cols, "upload");
  using yb = hostBuffer(device, yOffset + S * m.rows);
  f32(xb, S * m.cols, xOffset).set(x);
  record(d, xb, yb);
  const around = Array.from(u32(yb, yOffset)).concat(Array.from(u32(yb, SENTINEL_WORDS, yOffset + S * m.rows)));
  if (around.some((v) => v !== SENTINEL)) throw new Error(`${m.format} ${m.rows}x${m.cols} S=${S}: a sentinel word around y was overwritten`);
  return f32(yb, S * m.rows, yOffset).slice();
}

const gpuIdp = (m: QuantMatrix, x: Float32Array, S: number, xOffset = 0, yOffset = 0, split?: GemmSplitScratch) =>
  runOnGpu(m, x, S, xOffset, yOffset, (matrix, xb, yb) => {
    using scratch = quantizedRows(m.cols, S);
    submitAndWait(device, (cb) => kernelFor<QuantGemmIdpKernel>("idp", m).record(cb, { matrix, x: xb, y: yb, S, xOffset, yOffset, scratch }, split));
  });
const gpuFloat = (m: QuantMatrix, x: Float32Array, S: number) =>
  runOnGpu(m, x, S, 0, 0, (matrix, xb, yb) => submitAndWait(device, (cb) => kernelFor<QuantGemmKernel>("float", m).record(cb, { matrix, x: xb, y: yb, S })));
const bits = (y: Float32Array) => Array.from(new Uint32Array(y.buffer, y.byteOffset, y.length));

const CASES: { format: QuantFormat; groupSize: 32 | 64 | 128; scaleType: "f16" | "f32"; rows: number; cols: number; S: number; xOffset: number; yOffset: number }[] = [
  { format: "q4", groupSize: 32, scaleType: "f16", rows: 33, cols: 256, S: 13, xOffset: 0, yOffset: 0 },
  { format: "q4", groupSize: 32, scaleType: "f16", rows: 70, cols: 640, S: 64, xOffset: 5, yOffset: 3 },
  { format: "q4", groupSize: 64, scaleType: "f32", rows: 3, cols: 96 * 2, S: 70, xOffset: 0, yOffset: 1 },
  { format: "q4", groupSize: 128, scaleType: "f16", rows: 33, cols: 256, S: 8, xOffset: 2, yOffset: 0 },
  { format: "q8", groupSize: 32, scaleType: "f16", rows: 33, cols: 96, S: 13, xOffset: 0, yOffset: 0 },
  { format: "q8", groupSize: 32, scaleType: "f16", rows: 70, cols: 640, S: 64, xOffset: 1, yOffset: 2 },
  { format: "q8", groupSize: 128, scaleType: "f32", rows: 3, cols: 256, S: 70, xOffset: 0, yOffset: 0 },
  { format: "q8", groupSize: 64, scaleType: "f16", rows: 7, cols: 32 * 2, S: 8, xOffset: 3, yOffset: 5 },
];

describe.skipIf(noIdp)("dec_gemm_quant_idp vs the exact GEMM of the quantized x (NMSE <= 1e-9) and vs the float GEMM (<= 1e-3)", () => {
  for (const format of ["q4", "q8"] as const) {
    test(`${format}: ${CASES.filter((c) => c.format === format).length} cases (f16/f32 scales, groups 32/64/128, partial row and token tiles, offsets)`, () => {
      const got: Float32Array[] = [], floats: Float32Array[] = [];
      let seed = format === "q4" ? 100 : 200;
      for (const c of CASES.filter((k) => k.format === format)) {
        const m = matrix(format, c.rows, c.cols, c.groupSize, c.scaleType, seed++);
        const x = randomGaussianF32(c.S * c.cols, seed++);
        const y = gpuIdp(m, x, c.S, c.xOffset, c.yOffset);
        const exact = exactGemm(dequantize(m), m.rows, m.cols, dequantizedActivations(x, GGML_IDP_GROUP), c.S);
        const e = nmse(exact, y);
        if (!(e <= 1e-9)) throw new Error(`${format}/${c.scaleType}/g${c.groupSize} ${c.rows}x${c.cols} S=${c.S}: NMSE ${e} against the quantized x's exact GEMM`);
        got.push(y);
        floats.push(gpuFloat(m, x, c.S));
      }
      expect(pooledNmse(floats.map((ref, i) => ({ ref, got: got[i]! })))).toBeLessThanOrEqual(1e-3);
    });
  }

  test("recordQuantized over an earlier record's scratch equals record, bit for bit", () => {
    const m = matrix("q4", 33, 256, 32, "f16", 301), S = 13;
    const x = randomGaussianF32(S * m.cols, 302);
    using scratch = quantizedRows(m.cols, S);
    const k = kernelFor<QuantGemmIdpKernel>("idp", m);
    const first = runOnGpu(m, x, S, 0, 0, (matrix, xb, yb) => submitAndWait(device, (cb) => k.record(cb, { matrix, x: xb, y: yb, S, scratch })));
    const again = runOnGpu(m, x, S, 0, 0, (matrix, _xb, yb) => submitAndWait(device, (cb) => k.recordQuantized(cb, { matrix, y: yb, S, scratch })));
    expect(bits(again)).toEqual(bits(first));
  });

  test("split over the columns: 2..4 runs (a short last one) against the exact GEMM and the unsplit kernel (<= 1e-9)", () => {
    let seed = 400;
    for (const [format, rows, cols, splits, S] of [["q4", 33, 640, 2, 13], ["q8", 70, 640, 3, 64], ["q4", 3, 96 * 3, 4, 70]] as const) {
      const m = matrix(format, rows, cols, 32, "f16", seed++);
      const x = randomGaussianF32(S * cols, seed++);
      using split = new GemmSplitScratch(device, rows, cols, S, splits);
      const y = gpuIdp(m, x, S, 0, 0, split), plain = gpuIdp(m, x, S);
      const exact = exactGemm(dequantize(m), m.rows, m.cols, dequantizedActivations(x, GGML_IDP_GROUP), S);
      expect(nmse(exact, y), `${format} ${rows}x${cols} ${split.splits} runs S=${S}`).toBeLessThanOrEqual(1e-9);
      expect(nmse(plain, y)).toBeLessThanOrEqual(1e-9);
    }
  });

  test("the probe creates its pipelines (q4/q8, f16 scales, groups 32 and 128)", () => {
    const names = IDP_PIPELINES.filter((p) => p.spirv.endsWith(`${DEC_GEMM_QUANT_IDP.name}.spv`)).map((p) => `${p.specialization?.[0]}/${p.specialization?.[2]}`);
    expect(names.sort()).toEqual(["4/128", "4/32", "8/128", "8/32"]);
  });
});

describe.skipIf(noIdp)("DeviceLinear sends q4/q8 prompt chunks to the integer-dot GEMM", () => {
  test("8..64 tokens: the integer-dot GEMM (2 dispatches, 1 from quantized rows); 70: the float GEMM; 1..7: the GEMV; quantGemmIdp off or 40-column rows: the float GEMM", () => {
    using on = new LinearKernels(device, { integerDot: true, quantGemmIdp: true });
    using off = new LinearKernels(device, { integerDot: true, quantGemmIdp: false });
    const m = matrix("q4", 40, 256, 32, "f16", 501), odd = matrix("q8", 40, 40, 32, "f16", 502);
    using dl = new DeviceLinear(on, "w", new QuantLinear(m));
    using plain = new DeviceLinear(off, "w", new QuantLinear(m));
    using narrow = new DeviceLinear(on, "w", new QuantLinear(odd));
    expect([1, 7, 8, 13, GGML_IDP_GEMM_MAX_TOKENS, 70].map((S) => dl.dispatches(S))).toEqual([1, 1, 2, 2, 2, 1]);
    expect([1, 7, 8, 64].map((S) => dl.takesQuantized(S))).toEqual([false, false, true, true]);
    expect([8, 64].map((S) => plain.dispatches(S) + (plain.takesQuantized(S) ? 10 : 0))).toEqual([1, 1]);
    expect(narrow.takesQuantized(13)).toBe(false);
    for (const S of [13, 64]) {
      const x = randomGaussianF32(S * m.cols, 503 + S);
      const viaIdp = runOnGpu(m, x, S, 0, 0, (_d, xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S)));
      const viaFloat = runOnGpu(m, x, S, 0, 0, (_d, xb, yb) => submitAndWait(device, (cb) => plain.record(cb, xb, yb, S)));
      const exact = exactGemm(dequantize(m), m.rows, m.cols, dequantizedActivations(x, GGML_IDP_GROUP), S);
      expect(nmse(exact, viaIdp), `S=${S} via DeviceLinear`).toBeLessThanOrEqual(1e-9);
      expect(nmse(viaFloat, viaIdp)).toBeLessThanOrEqual(1e-3);
    }
  });
});
