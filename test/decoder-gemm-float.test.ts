/**
 * dec_gemm_float and dec_gemm_float_tile (src/kernels/decoder/float-gemm.ts): the prompt-chunk GEMMs
 * over float weights on the real driver, under the validation layer.
 *
 * - Against FloatLinear (src/model/linear.ts: f64 sums of the same weights, f16/bf16 decoded as the
 *   GPU decodes them) on random data: f32 (full 24-bit mantissas), f16 and bf16; rows 1, 3 and 31 (the
 *   most DeviceLinear sends it: 8 workgroups of 4 rows, the last partial); cols 37 and 2049 (odd:
 *   16-bit rows start mid-word) and 2048 (the 16-byte and word load paths); S = 9, 64 and 513 (a partial
 *   token block, whole blocks, and one token past them). Every rows-a-workgroup (1..4) also runs on
 *   other matrices (any takes any matrix), and with offsets (unaligned x, odd weightOffset).
 * - The tile (the routers' shape): rows 32, 33, 97 and 256 (whole and partial 32-row tiles), cols 37,
 *   2049 (a last column group shorter than the others, or empty) and 2048 with the same offsets;
 *   S = 9, 33 and 513 (partial and whole 32-token tiles).
 * - DeviceLinear: a float matrix of fewer than 32 rows at S = 100 is one dispatch (the narrow shape),
 *   a router's calls from 256 tokens (the tile), each equal to its calls of GEMV_HALF_MAX_S tokens or
 *   fewer (the GEMV path), and its `floatKernel` GEMV still runs the decode calls.
 * Output buffers carry sentinel words before yOffset and past the end, checked after each run.
 *
 * Bound: NMSE <= 1e-10, as dec_gemv_half's test. The GPU sums in f32: an output is the
 * sum of 32 fma chains of I / 32 columns added in order, whose error for random data gives NMSE at
 * most about u² I / 6 (u = 2^-24: ~1e-12 at I = 2049), the f32 products of
 * 16-bit weights adding ~u² more; measured worst 7.4e-13 (Lavapipe, with the 256-row tile this kernel once had; 6.6e-14 now). 1e-10 leaves two orders of
 * margin and still catches any wrong weight or token (one wrong element of 2049 gives ~5e-4).
 * The tile adds four column groups' f32 chains of I / 64 fma steps each, within the same bound.
 * Negative control (by hand, 2026-12-07, seen failing, then reverted): the partials added from
 * thread kk + 1 instead of kk gave 0.02..0.4 on every 1- and 3-row case; the tile without its last
 * column group's partial gave 0.2..0.26.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { FLOAT_GEMM_NARROW_MAX_ROWS, FLOAT_GEMM_TILE_FROM_TOKENS, FloatGemmKernel, floatGemmShape, FloatGemmTileKernel, type FloatGemm } from "../src/kernels/decoder/float-gemm.ts";
import { GEMV_HALF_MAX_S, GemvHalfKernel, type GemvWeightDType } from "../src/kernels/decoder/gemv-half.ts";
import { DeviceLinear, LinearKernels } from "../src/graph/device-linear.ts";
import { FloatLinear } from "../src/model/linear.ts";
import { f32ToBf16Bits, f32ToF16Bits } from "../src/quant/half.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, SENTINEL, SENTINEL_WORDS, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
const BOUND = 1e-10;

const kernels = new Map<number, FloatGemm & Disposable>();
const TILE = 0;
/** The narrow shape at narrowRows rows a workgroup, or the tile for TILE. */
const gemmFor = (narrowRows: number) =>
  kernels.get(narrowRows) ?? kernels.set(narrowRows, narrowRows === TILE ? new FloatGemmTileKernel(device) : new FloatGemmKernel(device, { narrowRows })).get(narrowRows)!;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of kernels.values()) k[Symbol.dispose]();
  finish(ctx);
});

let seed = 701;

/** A random rows x cols matrix of `dtype` (uniform in ±2; f32 with full mantissas, 16-bit ones rounded) and its FloatLinear. */
function randomMatrix(dtype: GemvWeightDType, rows: number, cols: number): FloatLinear {
  const next = mulberry32(seed++);
  if (dtype === "f32") {
    const w = new Float32Array(rows * cols);
    for (let i = 0; i < w.length; i++) w[i] = (next() - 0.5) * 4;
    return new FloatLinear("F32", w, rows, cols);
  }
  const w = new Uint16Array(rows * cols);
  const conv = dtype === "f16" ? f32ToF16Bits : f32ToBf16Bits;
  for (let i = 0; i < w.length; i++) w[i] = conv((next() - 0.5) * 4);
  return new FloatLinear(dtype === "f16" ? "F16" : "BF16", w, rows, cols);
}

/** The matrix's bytes at uint weightOffset of a new upload buffer. */
function weightBuffer(m: FloatLinear, weightOffset: number): Buffer {
  const b = hostBuffer(device, weightOffset + Math.ceil(m.data.byteLength / 4), "upload");
  new Uint8Array(b.host(), 4 * weightOffset, m.data.byteLength).set(new Uint8Array(m.data.buffer, m.data.byteOffset, m.data.byteLength));
  return b;
}

const dtypeOf = (m: FloatLinear): GemvWeightDType => (m.dtype === "F32" ? "f32" : m.dtype === "F16" ? "f16" : "bf16");

/** Records `record` over x (at xOffset) and a sentinel-guarded y (at yOffset); returns y [S, rows]. */
function runOnGpu(m: FloatLinear, x: Float32Array, S: number, xOffset: number, yOffset: number, record: (xb: Buffer, yb: Buffer) => void): Float32Array {
  using xb = hostBuffer(device, xOffset + S * m.cols, "upload");
  using yb = hostBuffer(device, yOffset + S * m.rows);
  f32(xb, S * m.cols, xOffset).set(x);
  record(xb, yb);
  const around = Array.from(u32(yb, yOffset)).concat(Array.from(u32(yb, SENTINEL_WORDS, yOffset + S * m.rows)));
  if (around.some((v) => v !== SENTINEL)) throw new Error(`${m.dtype} ${m.rows}x${m.cols} S=${S}: a sentinel word around y was overwritten`);
  return f32(yb, S * m.rows, yOffset).slice();
}

interface Offsets {
  weightOffset?: number;
  xOffset?: number;
  yOffset?: number;
}

/** The GEMM of shape `narrowRows` (or TILE) on m over x: y [S, rows]. */
function gpuGemm(narrowRows: number, m: FloatLinear, x: Float32Array, S: number, o: Offsets = {}): Float32Array {
  const weightOffset = o.weightOffset ?? 0, xOffset = o.xOffset ?? 0, yOffset = o.yOffset ?? 0;
  using wb = weightBuffer(m, weightOffset);
  return runOnGpu(m, x, S, xOffset, yOffset, (xb, yb) =>
    submitAndWait(device, (cb) => gemmFor(narrowRows).record(cb, { weights: wb, x: xb, y: yb, rows: m.rows, cols: m.cols, S, dtype: dtypeOf(m), weightOffset, xOffset, yOffset })));
}

/** NMSE of the GEMM of shape `narrowRows` against FloatLinear's f64 sums. */
function error(narrowRows: number, m: FloatLinear, S: number, o: Offsets = {}): number {
  const x = randomGaussianF32(S * m.cols, seed++);
  const got = gpuGemm(narrowRows, m, x, S, o);
  const ref = new Float32Array(S * m.rows);
  m.apply(x, S, ref);
  return nmse(ref, got);
}

describe(`dec_gemm_float vs FloatLinear (f64 sums), NMSE <= ${BOUND}`, () => {
  for (const dtype of ["f32", "f16", "bf16"] as const) {
    test(`${dtype}: rows 1, 3, 31 x cols 37, 2049; S = 9, 64, 513 (each matrix at its rows a workgroup, floatGemmShape)`, () => {
      let worst = 0;
      const failures: string[] = [];
      for (const rows of [1, 3, 31]) for (const cols of [37, 2049]) {
        const m = randomMatrix(dtype, rows, cols);
        for (const S of [9, 64, 513]) {
          const e = error(floatGemmShape(rows), m, S);
          if (!(e <= BOUND)) failures.push(`${rows}x${cols} S=${S}: NMSE ${e}`);
          worst = Math.max(worst, e);
        }
      }
      console.log(`  gemm-float ${dtype}: worst NMSE ${worst.toExponential(2)}`);
      expect(failures).toEqual([]);
    }, 600_000);
  }

  test("aligned loads: cols 2048 (f32 16-byte loads, 16-bit word loads, vec4 x); offsets that break each alignment", () => {
    let worst = 0;
    const failures: string[] = [];
    for (const dtype of ["f32", "f16", "bf16"] as const) {
      for (const rows of [1, 40]) {
        const m = randomMatrix(dtype, rows, 2048);
        for (const o of [{}, { weightOffset: 4, xOffset: 8, yOffset: 5 }, { weightOffset: 1, xOffset: 3, yOffset: 1 }, { weightOffset: 2, xOffset: 1, yOffset: 0 }]) {
          const e = error(floatGemmShape(rows), m, 70, o);
          if (!(e <= BOUND)) failures.push(`${dtype} ${rows}x2048 ${JSON.stringify(o)}: NMSE ${e}`);
          worst = Math.max(worst, e);
        }
      }
    }
    console.log(`  gemm-float aligned/offsets: worst NMSE ${worst.toExponential(2)}`);
    expect(failures).toEqual([]);
  }, 600_000);

  test("every rows-a-workgroup (1..4) takes any matrix: 1, 3, 5, 33 and 256 rows; cols 1, 3, 130", () => {
    const failures: string[] = [];
    for (const dtype of ["f32", "f16", "bf16"] as const) {
      for (const [rows, cols] of [[1, 130], [3, 3], [5, 1], [33, 130], [256, 37]] as const) {
        const m = randomMatrix(dtype, rows, cols);
        for (let narrowRows = 1; narrowRows <= FLOAT_GEMM_NARROW_MAX_ROWS; narrowRows++) {
          for (const S of [1, 9, 65]) {
            const e = error(narrowRows, m, S, { weightOffset: 3, xOffset: 1, yOffset: 2 });
            if (!(e <= BOUND)) failures.push(`${dtype} ${rows}x${cols} narrowRows ${narrowRows} S=${S}: NMSE ${e}`);
          }
        }
      }
    }
    expect(failures).toEqual([]);
  }, 600_000);

  for (const dtype of ["f32", "f16", "bf16"] as const) {
    test(`the tile, ${dtype}: rows 32, 33, 97, 256 x cols 37, 2049, 2048 (with offsets); S = 9, 33, 513`, () => {
      let worst = 0;
      const failures: string[] = [];
      for (const rows of [32, 33, 97, 256]) for (const cols of [37, 2049, 2048]) {
        const m = randomMatrix(dtype, rows, cols);
        for (const S of [9, 33, 513]) {
          const o = cols === 2048 && S === 33 ? { weightOffset: 1, xOffset: 3, yOffset: 1 } : cols === 2048 && S === 9 ? { weightOffset: 4, xOffset: 8, yOffset: 5 } : {};
          const e = error(TILE, m, S, o);
          if (!(e <= BOUND)) failures.push(`${rows}x${cols} S=${S} ${JSON.stringify(o)}: NMSE ${e}`);
          worst = Math.max(worst, e);
        }
      }
      console.log(`  gemm-float tile ${dtype}: worst NMSE ${worst.toExponential(2)}`);
      expect(failures).toEqual([]);
    }, 600_000);
  }

  test("floatGemmShape: the matrix's rows, at most 4 a workgroup", () => {
    expect([1, 2, 3, 4, 5, 31].map(floatGemmShape)).toEqual([1, 2, 3, 4, 4, 4]);
  });

  test("argument checks throw InvalidArgumentError", () => {
    using b = hostBuffer(device, 64, "upload");
    const gemm = gemmFor(4);
    const call = (a: Partial<Parameters<FloatGemmKernel["record"]>[1]>) => () =>
      submitAndWait(device, (cb) => gemm.record(cb, { weights: b, x: b, y: b, rows: 4, cols: 8, S: 2, dtype: "f16", ...a }));
    for (const [a, message] of [
      [{ S: 0 }, /S must be/],
      [{ S: 2.5 }, /S must be/],
      [{ rows: 0 }, /rows must be/],
      [{ cols: -1 }, /cols must be/],
      [{ dtype: "f64" as GemvWeightDType }, /dtype/],
      [{ rows: 50 }, /weights/], // 50 x 8 halves: 200 words
      [{ rows: 11, dtype: "f32" }, /weights/], // 88 f32 past the 80-word buffer (as halves they fit)
      [{ weightOffset: -1 }, /weightOffset/],
      [{ S: 11 }, /x/], // 88 floats of x
      [{ xOffset: 70 }, /x/],
      [{ yOffset: 75 }, /y/],
    ] as const) {
      expect(call(a)).toThrow(InvalidArgumentError);
      expect(call(a)).toThrow(message);
    }
    expect(() => new FloatGemmKernel(device, { narrowRows: 5 })).toThrow(InvalidArgumentError);
    expect(() => new FloatGemmKernel(device, { narrowRows: 0 })).toThrow(InvalidArgumentError);
    const maxY = device.info.limits.maxComputeWorkGroupCount[1]!;
    expect(() => (gemmFor(1) as FloatGemmKernel).workgroups(1, 8 * maxY + 1)).toThrow(InvalidArgumentError);
    expect(() => (gemmFor(TILE) as FloatGemmTileKernel).workgroups(32, 32 * maxY + 1)).toThrow(InvalidArgumentError);
    const tileCall = (a: Partial<Parameters<FloatGemmTileKernel["record"]>[1]>) => () =>
      submitAndWait(device, (cb) => gemmFor(TILE).record(cb, { weights: b, x: b, y: b, rows: 4, cols: 8, S: 2, dtype: "f16", ...a }));
    for (const [a, message] of [[{ S: 0 }, /S must be/], [{ rows: 50 }, /weights/], [{ xOffset: 70 }, /x/]] as const) expect(tileCall(a)).toThrow(message);
  });
});

describe("DeviceLinear sends the float prompt chunks to the GEMMs", () => {
  test("f32, f16, bf16; 1 x 2048 (shared_expert_gate) and 3 x 37 at S = 100, 256 x 2048 (router) at S = 256: one dispatch, equal to its GEMV calls of <= 8 tokens", () => {
    using linears = new LinearKernels(device, { integerDot: false });
    let worst = 0;
    for (const dtype of ["f32", "f16", "bf16"] as const) {
      for (const [rows, cols] of [[256, 2048], [1, 2048], [3, 37]] as const) {
        const m = randomMatrix(dtype, rows, cols);
        const S = rows < 32 ? 100 : FLOAT_GEMM_TILE_FROM_TOKENS;
        using dl = new DeviceLinear(linears, "blk.0.ffn_gate_inp.weight", m);
        const counts = [1, GEMV_HALF_MAX_S, GEMV_HALF_MAX_S + 1, 100, FLOAT_GEMM_TILE_FROM_TOKENS - 1, FLOAT_GEMM_TILE_FROM_TOKENS, 512].map((n) => dl.dispatches(n));
        expect(counts).toEqual(rows < 32 ? [1, 1, 1, 1, 1, 1, 1] : [1, 1, 2, 13, 32, 1, 1]);
        const x = randomGaussianF32(S * cols, seed++);
        const viaGemm = runOnGpu(m, x, S, 4, 3, (xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S, 4, 3)));
        // the GEMV path: calls of GEMV_HALF_MAX_S tokens (and a last of 4), independent rows of y
        const viaGemv = runOnGpu(m, x, S, 4, 3, (xb, yb) =>
          submitAndWait(device, (cb) => {
            for (let t = 0; t < S; t += GEMV_HALF_MAX_S) dl.record(cb, xb, yb, Math.min(GEMV_HALF_MAX_S, S - t), 4 + t * cols, 3 + t * rows);
          }));
        const ref = new Float32Array(S * rows);
        m.apply(x, S, ref);
        const e = nmse(viaGemv, viaGemm);
        expect(e).toBeLessThanOrEqual(BOUND);
        expect(nmse(ref, viaGemm)).toBeLessThanOrEqual(BOUND);
        expect(nmse(ref, viaGemv)).toBeLessThanOrEqual(BOUND);
        worst = Math.max(worst, e);
      }
    }
    console.log(`  DeviceLinear GEMM vs GEMV calls: worst NMSE ${worst.toExponential(2)}`);
  }, 600_000);

  test("a floatKernel GEMV still runs the GEMV calls (bit for bit its own output); a 3-row matrix's S > 8 takes the GEMM", () => {
    using linears = new LinearKernels(device, { integerDot: false });
    using own = new GemvHalfKernel(device, { workgroupSize: 32, rowsPerWorkgroup: 2, useSubgroup: false });
    const m = randomMatrix("f32", 3, 300);
    using dl = new DeviceLinear(linears, "blk.0.ffn_gate_inp.weight", m, own);
    using wb = weightBuffer(m, 0);
    for (const S of [1, 5, GEMV_HALF_MAX_S]) {
      const x = randomGaussianF32(S * m.cols, seed++);
      const viaLinear = runOnGpu(m, x, S, 0, 0, (xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S)));
      const viaOwn = runOnGpu(m, x, S, 0, 0, (xb, yb) => submitAndWait(device, (cb) => own.record(cb, { weights: wb, x: xb, y: yb, rows: m.rows, cols: m.cols, S, dtype: "f32" })));
      expect(new Uint32Array(viaLinear.buffer)).toEqual(new Uint32Array(viaOwn.buffer));
    }
    const S = 40, x = randomGaussianF32(S * m.cols, seed++);
    const viaLinear = runOnGpu(m, x, S, 0, 0, (xb, yb) => submitAndWait(device, (cb) => dl.record(cb, xb, yb, S)));
    const viaGemm = gpuGemm(floatGemmShape(m.rows), m, x, S);
    expect(new Uint32Array(viaLinear.buffer)).toEqual(new Uint32Array(viaGemm.buffer));
  }, 600_000);
});
