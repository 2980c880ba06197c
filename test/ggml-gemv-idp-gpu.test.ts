/**
 * dec_gemv_ggml_idp (src/kernels/decoder/ggml-gemv.ts: GgmlGemvIdpKernel) on the real driver under the
 * validation layer: the integer-dot GEMV straight from GGML blocks (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K),
 * x quantized by quantize_act in groups of 16 columns.
 *
 * - Against the CPU path (gemvGgmlBlocks on the f32 x): NMSE ≤ 1e-3, the bound for an 8-bit x, over
 *   each type's cases together and over each case of 64 outputs or more.
 * - Against the same GEMV over the x the GPU quantized, formed on the CPU (GGML's exact weights times
 *   q * scale, f64 sums): NMSE ≤ 1e-9. This is the tight gate: only f32 rounding separates the two, so
 *   a wrong min, offset, scale or run layout fails it where the 1e-3 bound might not notice.
 * Shapes: llama-quantize's blocks (test/fixtures/ggml-blocks/blocks.gguf) and random blocks, odd row
 * counts (1, 7, 33, 257), 1..4 super-blocks (1..8 blocks) a row, S = 1, 3, 8, 64, x/y offsets; other
 * kernel shapes; the graph's DeviceLinear on the integer-dot path; sentinels around y.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { openGguf } from "../src/formats/gguf.ts";
import type { GgufFile } from "../src/formats/tensor.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { DeviceGgmlMatrix, GGML_IDP_GROUP, GgmlGemvIdpKernel, GgmlIdpScratch, type GgmlGemvKernelOptions } from "../src/kernels/decoder/ggml-gemv.ts";
import { IDP_PIPELINES, IDP_PROBE_VERSION } from "../src/kernels/shaders.ts";
import { DeviceLinear, GGML_IDP_MAX_TOKENS, LinearKernels } from "../src/graph/device-linear.ts";
import { GgmlBlockLinear } from "../src/model/linear.ts";
import { dequantizeGgml, GGML_BLOCK_LAYOUTS, GGML_BLOCK_TYPES, ggmlBlockTensor, type GgmlBlockTensor, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { gemvGgmlBlocks } from "../src/quant/ggml-gemv.ts";
import { dequantizedActivations } from "../src/quant/intdot.ts";
import { nmse, pooledNmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, SENTINEL, SENTINEL_WORDS as TAIL, u32 } from "./support/host-buffers.ts";
import { repoRoot } from "./support/paths.ts";
import { randomGgmlTensor as randomTensor } from "./support/ggml-blocks.ts";
import { exactGemm } from "./support/gemm-reference.ts";

const ctx = openTestContext({ integerDotProduct: "on" });
const device = ctx.device;
/** A driver without shaderIntegerDotProduct has no integer-dot path to test (Lavapipe has it). */
const noIdp = !device.enabled.integerDotProduct;
const fixture: GgufFile = await openGguf(`${repoRoot}test/fixtures/ggml-blocks/blocks.gguf`);

const kernels = new Map<string, GgmlGemvIdpKernel>();
function kernelFor(type: GgmlBlockType, options: GgmlGemvKernelOptions = {}): GgmlGemvIdpKernel {
  const key = `${type}/${JSON.stringify(options)}`;
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = new GgmlGemvIdpKernel(device, type, options)));
  return k;
}
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of kernels.values()) k[Symbol.dispose]();
  fixture[Symbol.dispose]();
  finish(ctx);
});

const fixtureTensors = (type: GgmlBlockType) =>
  [...fixture.tensors.values()].filter((t) => t.dtype === type).map((v) => ggmlBlockTensor(type, v.bytes, v.shape[0]!, v.shape[1]!, v.name));

function cpuGemv(w: GgmlBlockTensor, x: Float32Array, S: number): Float32Array {
  const y = new Float32Array(S * w.rows);
  gemvGgmlBlocks(w, x, S, y);
  return y;
}

/** The integer-dot GEMV of `w` on x [S, cols] (placed at xOffset); y [S, rows] (the sentinels around it checked). */
function gpuGemv(w: GgmlBlockTensor, x: Float32Array, S: number, o: { xOffset?: number; yOffset?: number; kernel?: GgmlGemvKernelOptions } = {}): Float32Array {
  const xo = o.xOffset ?? 0, yo = o.yOffset ?? 0;
  using m = new DeviceGgmlMatrix(device, w);
  using scratch = new GgmlIdpScratch(device, w.cols, S);
  using xb = hostBuffer(device, xo + S * w.cols, "upload");
  using yb = hostBuffer(device, yo + S * w.rows);
  f32(xb, S * w.cols, xo).set(x);
  const kernel = kernelFor(w.type, o.kernel);
  submitAndWait(device, (cb) => kernel.record(cb, { matrix: m, x: xb, y: yb, S, xOffset: xo, yOffset: yo, scratch }));
  const around = Array.from(u32(yb, yo)).concat(Array.from(u32(yb, TAIL, yo + S * w.rows)));
  if (around.some((v) => v !== SENTINEL)) throw new Error(`${w.type} ${w.rows}x${w.cols} S=${S}: a sentinel word around y was overwritten`);
  return f32(yb, S * w.rows, yo).slice();
}

/**
 * Both gates for one case: the tight one (≤ 1e-9 against the exact GEMV of the quantized x) here; the
 * CPU path's outputs and the GPU's are returned, for the 1e-3 gate over a whole set of cases (one
 * output alone, as a 1-row S = 1 case has, can sit near 0 by chance, and its NMSE then measures that).
 */
function check(w: GgmlBlockTensor, S: number, seed: number, o: Parameters<typeof gpuGemv>[3] = {}): { ref: Float32Array; got: Float32Array; vsExact: number } {
  const x = randomGaussianF32(S * w.cols, seed);
  const got = gpuGemv(w, x, S, o);
  const vsExact = nmse(exactGemm(dequantizeGgml(w), w.rows, w.cols, dequantizedActivations(x, GGML_IDP_GROUP), S), got);
  if (!(vsExact <= 1e-9)) throw new Error(`${w.type} ${w.rows}x${w.cols} S=${S}: NMSE ${vsExact} against the exact GEMV of the quantized x (bound 1e-9)`);
  return { ref: cpuGemv(w, x, S), got, vsExact };
}

describe.skipIf(noIdp)("dec_gemv_ggml_idp vs the CPU path (NMSE ≤ 1e-3) and vs the exact GEMV of the quantized x (≤ 1e-9)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: llama-quantize blocks and random blocks; rows 1, 7, 33, 257; 1..4 super-blocks a row; S = 1, 3, 8, 64; offsets`, () => {
      const E = GGML_BLOCK_LAYOUTS[type].blockElements;
      const perRow = E === 256 ? [1, 2, 3, 4] : [1, 3, 8, 5];
      let seed = 3000 + 100 * GGML_BLOCK_TYPES.indexOf(type);
      const cases: { w: GgmlBlockTensor; S: number; xOffset?: number; yOffset?: number }[] = [
        ...fixtureTensors(type).flatMap((w) => [{ w, S: 1 }, { w, S: 3, xOffset: 4, yOffset: 2 }]),
        { w: randomTensor(type, 1, perRow[0]!, seed++), S: 1 },
        { w: randomTensor(type, 7, perRow[1]!, seed++), S: 3, xOffset: 12, yOffset: 3 },
        { w: randomTensor(type, 33, perRow[2]!, seed++), S: 8, xOffset: 8, yOffset: 1 },
        { w: randomTensor(type, 257, perRow[3]!, seed++), S: 64 },
      ];
      const results = cases.map(({ w, S, xOffset, yOffset }) => check(w, S, seed++, { xOffset, yOffset }));
      const vsCpu = pooledNmse(results), big = results.filter((r) => r.ref.length >= 64).map((r) => nmse(r.ref, r.got));
      console.log(`  ${type}: NMSE ${vsCpu.toExponential(2)} vs the CPU path (worst case of >= 64 outputs ${Math.max(...big).toExponential(2)}), worst ${Math.max(...results.map((r) => r.vsExact)).toExponential(2)} vs the quantized x, over ${cases.length} cases`);
      expect(vsCpu).toBeLessThanOrEqual(1e-3);
      for (const e of big) expect(e).toBeLessThanOrEqual(1e-3);
    }, 60_000);
  }

  test("other kernel shapes: shared-memory tree (no subgroup ops), several tokens a chunk, 1 row a workgroup, 2 slices a lane", () => {
    const shapes: [GgmlBlockType, GgmlGemvKernelOptions][] = [
      ["Q4_K", { useSubgroup: false, workgroupSize: 16, rowsPerWorkgroup: 3, tokensPerChunk: 3, slicesPerLane: 1 }], // Q4_K takes 2 by default
      ["Q6_K", { workgroupSize: 64, rowsPerWorkgroup: 2, tokensPerChunk: 2 }],
      ["Q5_0", { workgroupSize: 8, rowsPerWorkgroup: 1, tokensPerChunk: 4 }],
      // two slices a lane: a K-quant sub-block pair; Q5_1's 9 blocks a row leave the last lane one slice
      ["Q4_K", { workgroupSize: 8, rowsPerWorkgroup: 2, slicesPerLane: 2 }],
      ["Q6_K", { workgroupSize: 8, rowsPerWorkgroup: 3, slicesPerLane: 2 }],
      ["Q5_1", { workgroupSize: 8, rowsPerWorkgroup: 2, slicesPerLane: 2 }],
      ["Q4_K", { workgroupSize: 32, rowsPerWorkgroup: 4, tokensPerChunk: 4 }], // the graphs' GPU shape for 3..8 tokens
    ];
    let seed = 77;
    for (const [type, kernel] of shapes) {
      const w = randomTensor(type, 19, GGML_BLOCK_LAYOUTS[type].blockElements === 256 ? 3 : 9, seed++);
      const results = [1, 5, 11].map((S) => check(w, S, seed++, { kernel, xOffset: 4, yOffset: 1 }));
      expect(pooledNmse(results)).toBeLessThanOrEqual(1e-3);
    }
  }, 60_000);
});

describe.skipIf(noIdp)("long rows: many slices a lane", () => {
  test("every type at 14336 columns (448 slices: 14 a lane of 32), 5 rows, S = 2", () => {
    let seed = 55;
    for (const type of GGML_BLOCK_TYPES) {
      const w = randomTensor(type, 5, 14336 / GGML_BLOCK_LAYOUTS[type].blockElements, seed++);
      expect(pooledNmse([check(w, 2, seed++, { yOffset: 1 })])).toBeLessThanOrEqual(1e-3);
    }
  }, 60_000);
});

describe.skipIf(noIdp)("the graph's DeviceLinear on the integer-dot path", () => {
  test(`Q4_K and Q5_0: S = 1 and ${GGML_IDP_MAX_TOKENS} quantize x (2 dispatches), S = ${GGML_IDP_MAX_TOKENS + 1} takes the float path; against the Linear's CPU apply`, () => {
    // the integer-dot GEMM off: S = 9 on the float GEMM (test/decoder-gemm-ggml-idp.test.ts covers the idp GEMM's chunks)
    using lk = new LinearKernels(device, { integerDot: true, ggmlGemmIdp: false });
    expect(lk.integerDot).toBe(true);
    for (const type of ["Q4_K", "Q5_0"] as const) {
      const t = randomTensor(type, 37, type === "Q4_K" ? 2 : 16, 90);
      const linear = new GgmlBlockLinear(type, t.bytes, t.rows, t.cols, "blk.0.attn_q.weight");
      using dl = new DeviceLinear(lk, "blk.0.attn_q.weight", linear);
      for (const S of [1, GGML_IDP_MAX_TOKENS, GGML_IDP_MAX_TOKENS + 1]) {
        const idp = S <= GGML_IDP_MAX_TOKENS;
        expect(dl.dispatches(S)).toBe(idp ? 2 : 1);
        const x = randomGaussianF32(S * t.cols, 91 + S);
        const ref = new Float32Array(S * t.rows);
        linear.apply(x, S, ref);
        using xb = hostBuffer(device, 4 + S * t.cols, "upload");
        using yb = hostBuffer(device, 3 + S * t.rows);
        f32(xb, S * t.cols, 4).set(x);
        submitAndWait(device, (cb) => dl.record(cb, xb, yb, S, 4, 3));
        const e = nmse(ref, f32(yb, S * t.rows, 3));
        // the float path stays exact to f32 rounding; the integer-dot one within the 8-bit x's error
        expect(e).toBeLessThanOrEqual(idp ? 1e-3 : 1e-9);
        if (idp) expect(e).toBeGreaterThan(1e-9); // it did take the integer-dot path
      }
    }
  }, 60_000);
});

describe("probe and argument checks", () => {
  test("the child-process probe creates every integer-dot GGML pipeline (one per format) and quantize_act with groups of 16", () => {
    const ggml = IDP_PIPELINES.filter((p) => p.spirv.endsWith("dec_gemv_ggml_idp.spv")).map((p) => p.specialization?.[3]);
    expect(ggml.sort()).toEqual([0, 1, 2, 3, 4, 5]);
    expect(IDP_PIPELINES.some((p) => p.spirv.endsWith("quantize_act.spv") && p.specialization?.[4] === GGML_IDP_GROUP)).toBe(true);
    expect(IDP_PROBE_VERSION).toBeGreaterThanOrEqual(10);
  });

  test("a device without shaderIntegerDotProduct (VKMOE_IDP=off): one clear error, and the graph's kernels keep the float path", () => {
    using off = openTestContext({ integerDotProduct: "off" });
    expect(off.device.enabled.integerDotProduct).toBe(false);
    expect(() => new GgmlGemvIdpKernel(off.device, "Q4_K")).toThrow(/needs shaderIntegerDotProduct/);
    using lk = new LinearKernels(off.device);
    expect(lk.integerDot).toBe(false);
    expect(() => new LinearKernels(off.device, { integerDot: true })).toThrow(/need shaderIntegerDotProduct/);
  });

  test.skipIf(noIdp)("a scratch of the wrong width or too few tokens, a matrix of another type, bad S", () => {
    const w = randomTensor("Q4_1", 3, 2, 1);
    using m = new DeviceGgmlMatrix(device, w);
    using b = hostBuffer(device, 64 * 64, "upload");
    using narrow = new GgmlIdpScratch(device, 32, 4);
    using short = new GgmlIdpScratch(device, 64, 2);
    using ok = new GgmlIdpScratch(device, 64, 4);
    const k = kernelFor("Q4_1");
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 1, scratch: narrow }))).toThrow(/scratch of 4 tokens x 32 columns/);
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 3, scratch: short }))).toThrow(/scratch/);
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 0, scratch: ok }))).toThrow(/S must be/);
    expect(() => submitAndWait(device, (cb) => kernelFor("Q5_1").record(cb, { matrix: m, x: b, y: b, S: 1, scratch: ok }))).toThrow(/a Q4_1 matrix on a Q5_1 kernel/);
    expect(() => new GgmlIdpScratch(device, 48, 1)).toThrow(/multiple of 32/);
    expect(() => new GgmlIdpScratch(device, 64, 65)).toThrow(/maxTokens/);
  });
});
