/**
 * dec_gemv_ggml (src/kernels/decoder/ggml-gemv.ts, shaders/ggml_blocks.glsl) on the real driver under
 * the validation layer: GEMV straight from GGML blocks (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
 *
 * - Against the CPU path (gemvGgmlBlocks: f64 sums of GGML's exact weights): NMSE ≤ 1e-9 on
 *   llama-quantize's blocks (test/fixtures/ggml-blocks/blocks.gguf) and random blocks with finite f16
 *   scales, odd row counts (1, 7, 33, 257), 1..4 super-blocks (1..8 blocks of 32) per row, S = 1, 3, 8,
 *   64, x/y offsets (x: multiples of 4); rows of 14336 columns (many slices a lane). The GPU sums in
 *   f32: NMSE ~1e-12..1e-14 for random data.
 * - Lossless weights: with x = one-hot rows (token s = e_{c_s}) y[s, r] is W[r, c_s] alone (every other
 *   product is an exact 0), so each output must equal GGML's weight bit for bit: against
 *   dequantizeGgmlRow on every column of random tensors, and against gguf-py's own dequantization
 *   (the fixture's `.dequant` tensors) on llama-quantize's blocks. A sum cannot keep the sign of a
 *   zero (-0 + 0 = +0), so -0 weights (Q6_K, d*sc < 0 and q = 32) are compared as +0.
 * Output buffers carry sentinel words before yOffset and past the end, checked after each run.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { openGguf } from "../src/formats/gguf.ts";
import type { GgufFile } from "../src/formats/tensor.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { DeviceGgmlMatrix, GGML_GEMV_MAX_S, GgmlGemvKernel, type GgmlGemvKernelOptions } from "../src/kernels/decoder/ggml-gemv.ts";
import { DeviceLinear, GGML_GEMV_WIDE_ROWS, gemvDeviceKind, ggmlGemvShape, LinearKernels } from "../src/graph/device-linear.ts";
import { GgmlBlockLinear } from "../src/model/linear.ts";
import { dequantizeGgml, GGML_BLOCK_LAYOUTS, GGML_BLOCK_TYPES, ggmlBlockTensor, type GgmlBlockTensor, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { gemvGgmlBlocks } from "../src/quant/ggml-gemv.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer as deviceHostBuffer, SENTINEL, SENTINEL_WORDS as TAIL, u32 } from "./support/host-buffers.ts";
import { repoRoot } from "./support/paths.ts";
import { randomGgmlBlocks } from "./support/ggml-blocks.ts";

const ctx = openTestContext();
const device = ctx.device;
const fixture: GgufFile = await openGguf(`${repoRoot}test/fixtures/ggml-blocks/blocks.gguf`);

const kernels = new Map<string, GgmlGemvKernel>();
/** One kernel per (type, shape); the default shape unless `options` says otherwise. */
function kernelFor(type: GgmlBlockType, options: GgmlGemvKernelOptions = {}): GgmlGemvKernel {
  const key = `${type}/${JSON.stringify(options)}`;
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = new GgmlGemvKernel(device, type, options)));
  return k;
}
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of kernels.values()) k[Symbol.dispose]();
  fixture[Symbol.dispose]();
  finish(ctx);
});

const randomBlocks = (type: GgmlBlockType, rows: number, cols: number, seed: number, lo?: number) => randomGgmlBlocks(type, rows, cols, mulberry32(seed), lo);

const randomTensor = (type: GgmlBlockType, rows: number, blocks: number, seed: number, lo?: number) => {
  const cols = blocks * GGML_BLOCK_LAYOUTS[type].blockElements;
  return ggmlBlockTensor(type, randomBlocks(type, rows, cols, seed, lo), rows, cols);
};

/** The fixture's llama-quantize tensors of `type` with gguf-py's dequantized values. */
function fixtureTensors(type: GgmlBlockType): { tensor: GgmlBlockTensor; ggufPy: Float32Array }[] {
  return [...fixture.tensors.values()].filter((t) => t.dtype === type).map((view) => {
    const [rows, cols] = view.shape as [number, number];
    const oracle = fixture.tensors.get(`${view.name}.dequant`)!;
    return { tensor: ggmlBlockTensor(type, view.bytes, rows, cols, view.name), ggufPy: new Float32Array(oracle.bytes.slice().buffer) };
  });
}

/** Runs the GPU GEMV of `w` on x [S, cols] (placed at xOffset), returns y [S, rows] (checks the sentinels around it). */
function gpuGemv(w: GgmlBlockTensor, x: Float32Array, S: number, o: { xOffset?: number; yOffset?: number; kernel?: GgmlGemvKernelOptions } = {}): Float32Array {
  const xo = o.xOffset ?? 0, yo = o.yOffset ?? 0;
  using m = new DeviceGgmlMatrix(device, w);
  using xb = deviceHostBuffer(device, xo + S * w.cols, "upload");
  using yb = deviceHostBuffer(device, yo + S * w.rows);
  f32(xb, S * w.cols, xo).set(x);
  const kernel = kernelFor(w.type, o.kernel);
  submitAndWait(device, (cb) => kernel.record(cb, { matrix: m, x: xb, y: yb, S, xOffset: xo, yOffset: yo }));
  const around = Array.from(u32(yb, yo)).concat(Array.from(u32(yb, TAIL, yo + S * w.rows)));
  if (around.some((v) => v !== SENTINEL)) throw new Error(`${w.type} ${w.rows}x${w.cols} S=${S}: a sentinel word around y was overwritten`);
  return f32(yb, S * w.rows, yo).slice();
}

function cpuGemv(w: GgmlBlockTensor, x: Float32Array, S: number): Float32Array {
  const y = new Float32Array(S * w.rows);
  gemvGgmlBlocks(w, x, S, y);
  return y;
}

const bits = (v: number) => {
  const f = new Float32Array([v === 0 ? 0 : v]); // -0 as +0: a sum cannot keep it
  return new Uint32Array(f.buffer)[0]!;
};

/**
 * One-hot GEMVs over `columns` (64 a dispatch): y[s, r] must be weights[r * cols + c_s] bit for bit.
 * Returns the number of mismatches and the first one, described.
 */
function oneHotMismatches(w: GgmlBlockTensor, weights: Float32Array, columns: number[], kernel?: GgmlGemvKernelOptions): { count: number; first: string } {
  let count = 0, first = "";
  for (let at = 0; at < columns.length; at += GGML_GEMV_MAX_S) {
    const cs = columns.slice(at, at + GGML_GEMV_MAX_S), S = cs.length;
    const x = new Float32Array(S * w.cols);
    cs.forEach((c, s) => (x[s * w.cols + c] = 1));
    const y = gpuGemv(w, x, S, { kernel });
    for (let s = 0; s < S; s++) {
      for (let r = 0; r < w.rows; r++) {
        const want = weights[r * w.cols + cs[s]!]!, got = y[s * w.rows + r]!;
        if (bits(want) !== bits(got)) {
          if (count++ === 0) first = `${w.type} [${r}, ${cs[s]}]: GPU ${got} (0x${bits(got).toString(16)}) vs ${want} (0x${bits(want).toString(16)})`;
        }
      }
    }
  }
  return { count, first };
}

const allColumns = (cols: number) => Array.from({ length: cols }, (_, c) => c);

describe("dec_gemv_ggml vs the CPU GEMV over the same blocks (NMSE ≤ 1e-9)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: llama-quantize blocks and random blocks; rows 1, 7, 33, 257; 1..4 super-blocks a row; S = 1, 3, 8, 64; offsets`, () => {
      const E = GGML_BLOCK_LAYOUTS[type].blockElements;
      const perRow = E === 256 ? [1, 2, 3, 4] : [1, 3, 8, 5];
      let seed = 1000 * GGML_BLOCK_TYPES.indexOf(type);
      const cases: { w: GgmlBlockTensor; S: number; xOffset?: number; yOffset?: number }[] = [
        ...fixtureTensors(type).flatMap(({ tensor }) => [{ w: tensor, S: 1 }, { w: tensor, S: 3, xOffset: 4, yOffset: 2 }]),
        { w: randomTensor(type, 1, perRow[0]!, seed++), S: 1 },
        { w: randomTensor(type, 7, perRow[1]!, seed++), S: 3, xOffset: 12, yOffset: 3 },
        { w: randomTensor(type, 33, perRow[2]!, seed++), S: 8, xOffset: 8, yOffset: 1 },
        { w: randomTensor(type, 257, perRow[3]!, seed++), S: 64 },
      ];
      let worst = 0;
      for (const { w, S, xOffset, yOffset } of cases) {
        const x = randomGaussianF32(S * w.cols, seed++);
        const e = nmse(cpuGemv(w, x, S), gpuGemv(w, x, S, { xOffset, yOffset }));
        if (!(e <= 1e-9)) throw new Error(`${type} ${w.rows}x${w.cols} S=${S}: NMSE ${e}`);
        worst = Math.max(worst, e);
      }
      console.log(`  ${type}: worst NMSE ${worst.toExponential(2)} over ${cases.length} cases`);
    }, 60_000);
  }

  // Each shape is one more pipeline, and Lavapipe's LLVM compiles one in 1..7 s with a cold shader
  // cache (the code is unrolled R x TOKENS times): one type each, the grid split included.
  test("the graphs' shape: 64 threads x 2 rows below GGML_GEMV_WIDE_ROWS rows on NVIDIA, the kernel's default (32 x 4) from there and on other GPUs; 8 x 4 on a CPU device; chunks of 2 or 4 tokens for several tokens on a GPU", () => {
    expect(ggmlGemvShape("nvidia", 2048)).toEqual({ workgroupSize: 64, rowsPerWorkgroup: 2 });
    expect(ggmlGemvShape("nvidia", GGML_GEMV_WIDE_ROWS - 1)).toEqual({ workgroupSize: 64, rowsPerWorkgroup: 2 });
    expect(ggmlGemvShape("nvidia", GGML_GEMV_WIDE_ROWS)).toEqual({});
    expect(ggmlGemvShape("other", 2048)).toEqual({});
    expect(ggmlGemvShape("cpu", 2048)).toEqual({ workgroupSize: 8, rowsPerWorkgroup: 4, tokensPerChunk: 1 });
    // several tokens: chunks of 2 (NVIDIA, 2 tokens) or 4, on a GPU; a CPU device keeps 1
    expect(ggmlGemvShape("nvidia", 2048, 2)).toEqual({ workgroupSize: 64, rowsPerWorkgroup: 2, tokensPerChunk: 2 });
    expect(ggmlGemvShape("nvidia", 2048, 3)).toEqual({ workgroupSize: 32, rowsPerWorkgroup: 4, tokensPerChunk: 4 });
    expect(ggmlGemvShape("nvidia", GGML_GEMV_WIDE_ROWS, 2)).toEqual({ workgroupSize: 32, rowsPerWorkgroup: 4, tokensPerChunk: 4 });
    expect(ggmlGemvShape("other", 2048, 2)).toEqual({ workgroupSize: 32, rowsPerWorkgroup: 4, tokensPerChunk: 4 });
    expect(ggmlGemvShape("cpu", 2048, 8)).toEqual({ workgroupSize: 8, rowsPerWorkgroup: 4, tokensPerChunk: 1 });
    expect([gemvDeviceKind({ type: 4, vendorId: 0x10005 }), gemvDeviceKind({ type: 2, vendorId: 0x10de }), gemvDeviceKind({ type: 1, vendorId: 0x1002 })]).toEqual(["cpu", "nvidia", "other"]);
    using k = new GgmlGemvKernel(device, "Q4_K", ggmlGemvShape("nvidia", GGML_GEMV_WIDE_ROWS));
    expect([k.workgroupSize, k.rowsPerWorkgroup]).toEqual([32, 4]);
  });

  test("other kernel shapes: shared-memory tree (no subgroup ops), 1 token a chunk, 8 tokens a chunk, 2 slices a lane", () => {
    const shapes: [GgmlBlockType, GgmlGemvKernelOptions][] = [
      ["Q4_K", { useSubgroup: false, workgroupSize: 16, rowsPerWorkgroup: 3, tokensPerChunk: 3 }],
      ["Q6_K", { ...ggmlGemvShape("nvidia", 4096), tokensPerChunk: 1 }], // the graphs' NVIDIA shape below lm_head's rows: 64 x 2
      ["Q5_0", { workgroupSize: 16, rowsPerWorkgroup: 1, tokensPerChunk: 8 }], // 18 KiB of staged x
      // two slices a lane: a K-quant sub-block pair; Q4_1's 9 blocks a row leave the last lane one slice
      ["Q5_K", { workgroupSize: 8, rowsPerWorkgroup: 2, slicesPerLane: 2 }],
      ["Q4_1", { workgroupSize: 8, rowsPerWorkgroup: 3, slicesPerLane: 2 }],
      ["Q6_K", { workgroupSize: 32, rowsPerWorkgroup: 4, tokensPerChunk: 4 }], // the graphs' GPU shape for 3..8 tokens
    ];
    let seed = 7;
    for (const [type, kernel] of shapes) {
      const w = randomTensor(type, 19, GGML_BLOCK_LAYOUTS[type].blockElements === 256 ? 3 : 9, seed++);
      for (const S of [1, 5, 11]) {
        const x = randomGaussianF32(S * w.cols, seed++);
        expect(nmse(cpuGemv(w, x, S), gpuGemv(w, x, S, { kernel, xOffset: 4, yOffset: 1 }))).toBeLessThanOrEqual(1e-9);
      }
    }
  }, 60_000);
});

describe("the factored float variant (d * Σ q x + m * Σ x a run)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: NMSE ≤ 1e-9 against the CPU GEMV (S = 1, 3, 64; long rows); one-hot inputs still give GGML's weights bit for bit`, () => {
      const kernel = { factored: true };
      const E = GGML_BLOCK_LAYOUTS[type].blockElements;
      let seed = 700 + 10 * GGML_BLOCK_TYPES.indexOf(type);
      for (const [w, S] of [[randomTensor(type, 7, E === 256 ? 3 : 9, seed++), 3], [randomTensor(type, 33, E === 256 ? 2 : 8, seed++), 64], [randomTensor(type, 3, 14336 / E, seed++), 1]] as const) {
        const x = randomGaussianF32(S * w.cols, seed++);
        expect(nmse(cpuGemv(w, x, S), gpuGemv(w, x, S, { kernel, xOffset: 4, yOffset: 1 }))).toBeLessThanOrEqual(1e-9);
      }
      const w = randomTensor(type, 9, E === 256 ? 1 : 4, seed++);
      const { count, first } = oneHotMismatches(w, dequantizeGgml(w), allColumns(w.cols), kernel);
      expect(`${count} of ${w.rows * w.cols} differ${count ? `; first ${first}` : ""}`).toBe(`0 of ${w.rows * w.cols} differ`);
    }, 60_000);
  }
});

describe("long rows: many slices a lane", () => {
  test("every type at 14336 columns (448 slices: 14 a lane of 32), 5 rows, S = 2 (NMSE ≤ 1e-9)", () => {
    let seed = 55;
    for (const type of GGML_BLOCK_TYPES) {
      const w = randomTensor(type, 5, 14336 / GGML_BLOCK_LAYOUTS[type].blockElements, seed++);
      const x = randomGaussianF32(2 * w.cols, seed++);
      expect(nmse(cpuGemv(w, x, 2), gpuGemv(w, x, 2, { yOffset: 1 }))).toBeLessThanOrEqual(1e-9);
    }
  }, 60_000);
});

describe("lossless: one-hot GEMVs give GGML's weights bit for bit", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: every column of random blocks (33 rows, 2 super-blocks / 8 blocks; also tiny f16 scales) = dequantizeGgmlRow; llama-quantize blocks = gguf-py`, () => {
      const E = GGML_BLOCK_LAYOUTS[type].blockElements;
      let seed = 500 + GGML_BLOCK_TYPES.indexOf(type);
      for (const w of [randomTensor(type, 33, E === 256 ? 2 : 8, seed++), randomTensor(type, 5, E === 256 ? 1 : 4, seed++, -24)]) {
        const { count, first } = oneHotMismatches(w, dequantizeGgml(w), allColumns(w.cols));
        expect(`${count} of ${w.rows * w.cols} differ${count ? `; first ${first}` : ""}`).toBe(`0 of ${w.rows * w.cols} differ`);
      }
      for (const { tensor, ggufPy } of fixtureTensors(type)) {
        const { count, first } = oneHotMismatches(tensor, ggufPy, allColumns(tensor.cols));
        expect(`${count} of ${ggufPy.length} differ${count ? `; first ${first}` : ""}`).toBe(`0 of ${ggufPy.length} differ`);
      }
    }, 60_000);
  }
});

describe("the graph's DeviceLinear runs a GgmlBlockLinear on this kernel", () => {
  test("Q4_K and Q6_K: S = 1 and 70 (two dispatches) equal the Linear's CPU apply (NMSE ≤ 1e-9)", () => {
    using lk = new LinearKernels(device, { ggmlGemm: false }); // the GEMV at every S (the GEMM: test/decoder-gemm-ggml.test.ts)
    for (const type of ["Q4_K", "Q6_K"] as const) {
      const t = randomTensor(type, 37, 2, 90);
      const linear = new GgmlBlockLinear(type, t.bytes, t.rows, t.cols, "blk.0.ffn_down.weight");
      using dl = new DeviceLinear(lk, "blk.0.ffn_down.weight", linear);
      for (const S of [1, 70]) {
        expect(dl.dispatches(S)).toBe(Math.ceil(S / GGML_GEMV_MAX_S));
        const x = randomGaussianF32(S * t.cols, 91 + S);
        const ref = new Float32Array(S * t.rows);
        linear.apply(x, S, ref);
        using xb = deviceHostBuffer(device, 4 + S * t.cols, "upload");
        using yb = deviceHostBuffer(device, 3 + S * t.rows);
        f32(xb, S * t.cols, 4).set(x);
        submitAndWait(device, (cb) => dl.record(cb, xb, yb, S, 4, 3));
        expect(nmse(ref, f32(yb, S * t.rows, 3))).toBeLessThanOrEqual(1e-9);
      }
    }
  }, 60_000);
});

describe("argument checks", () => {
  test("S out of range, a matrix of another type, x too small or unaligned", () => {
    const w = randomTensor("Q4_1", 3, 2, 1);
    using m = new DeviceGgmlMatrix(device, w);
    using b = deviceHostBuffer(device, 64 * 64, "upload");
    using small = deviceHostBuffer(device, 8, "upload");
    const k = kernelFor("Q4_1");
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 65 }))).toThrow(/S must be/);
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 0 }))).toThrow(/S must be/);
    expect(() => submitAndWait(device, (cb) => kernelFor("Q5_1").record(cb, { matrix: m, x: b, y: b, S: 1 }))).toThrow(/a Q4_1 matrix on a Q5_1 kernel/);
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: small, y: b, S: 1 }))).toThrow(/x/);
    expect(() => submitAndWait(device, (cb) => k.record(cb, { matrix: m, x: b, y: b, S: 1, xOffset: 2 }))).toThrow(/multiple of 4/);
    expect(() => new GgmlGemvKernel(device, "Q2_K" as GgmlBlockType)).toThrow(/Q2_K/);
    expect(() => new GgmlGemvKernel(device, "Q4_K", { workgroupSize: 1024, tokensPerChunk: 8 })).toThrow(/shared memory/);
    expect(() => new GgmlGemvKernel(device, "Q4_K", { slicesPerLane: 3 })).toThrow(/slicesPerLane must be 1 or 2/);
  });
});
