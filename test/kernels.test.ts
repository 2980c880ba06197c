/**
 * Every GEMV kernel on the real driver against the f64 CPU reference: formats × group sizes ×
 * scale types × shapes (odd I, tail groups, O = 1, I = 16384) × S in {1, 3, 8, 64}. Output
 * buffers carry sentinel words that every run checks.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { DeviceMatrix, GemvKernels, GemvOp, OutOfBoundsWriteError } from "../src/kernels/gemv.ts";
import { chooseKernelConfig } from "../src/kernels/tuning.ts";
import {
  gateUpReference, gemvIntDotEmulated, gemvReference, nmse, quantize, quantizeActivations, randomGaussianF32,
  type GroupSize, type QuantFormat, type QuantMatrix, type ScaleType,
} from "../src/quant/index.ts";
import { downloadBytes } from "../src/vk/transfer.ts";
import { finish, openTestContext } from "./support/gpu.ts";

const ctx = openTestContext();
const device = ctx.device;
const kernels = new GemvKernels(device, chooseKernelConfig(device.info));
const sharedKernels = new GemvKernels(device, chooseKernelConfig(device.info, true));
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  kernels[Symbol.dispose]();
  sharedKernels[Symbol.dispose]();
  finish(ctx);
});

const FORMATS: QuantFormat[] = ["q4", "q8"];
const GROUPS: GroupSize[] = [32, 64, 128];
const SCALES: ScaleType[] = ["f16", "f32"];
const SHAPES: [number, number][] = [[1, 33], [37, 100], [129, 777], [8, 16384]]; // [O, I]
const TOKENS = [1, 3, 8, 64];

let seed = 1;

/**
 * NMSE over every output of a test. A single output (O = 1, S = 1) is one number whose relative
 * f32 error can exceed 1e-9 through cancellation alone, so the bound applies to the test's pooled
 * outputs; each case still has a loose bound (1e-6 float, 1e-1 int8) that any real bug breaks.
 */
class PooledError {
  private err = 0;
  private ref = 0;
  add(ref: ArrayLike<number>, got: ArrayLike<number>, caseBound: number, label: string): void {
    let e = 0, r = 0;
    for (let i = 0; i < ref.length; i++) {
      e += (ref[i]! - got[i]!) ** 2;
      r += ref[i]! ** 2;
    }
    if (!(e <= caseBound * r)) throw new Error(`${label}: NMSE ${e / r} above the per-case bound ${caseBound}`);
    this.err += e;
    this.ref += r;
  }
  get nmse(): number {
    return this.err / this.ref;
  }
}
function matrix(format: QuantFormat, O: number, I: number, groupSize: GroupSize, scaleType: ScaleType): QuantMatrix {
  return quantize({ dtype: "f32", data: randomGaussianF32(O * I, seed++) }, O, I, { format, groupSize, scaleType });
}

function withMatrix<T>(m: QuantMatrix, fn: (d: DeviceMatrix) => T): T {
  using d = new DeviceMatrix(device, m);
  return fn(d);
}

describe("float path vs the f64 reference (NMSE ≤ 1e-9)", () => {
  for (const format of FORMATS) for (const g of GROUPS) for (const st of SCALES) {
    test(`${format} group ${g} ${st} scales: every shape and S`, () => {
      const pooled = new PooledError();
      for (const [O, I] of SHAPES) {
        const m = matrix(format, O, I, g, st);
        withMatrix(m, (d) => {
          for (const S of TOKENS) {
            if (I === 16384 && S === 3) continue; // keep the big case to S in {1, 8, 64}
            const x = randomGaussianF32(S * I, seed++);
            using op = new GemvOp(kernels, { matrices: [d], S });
            pooled.add(gemvReference(m, x, S), op.run(x), 1e-6, `${O}x${I} S=${S}`);
          }
        });
      }
      expect(pooled.nmse).toBeLessThanOrEqual(1e-9);
    });
  }
});

describe("fused gate+up vs the reference (NMSE ≤ 1e-9), with and without the SwiGLU limit", () => {
  for (const format of FORMATS) for (const st of SCALES) for (const limit of [undefined, 0.75]) {
    test(`${format} ${st} limit ${limit ?? "none"}`, () => {
      const pooled = new PooledError();
      for (const [O, I] of SHAPES) {
        const g = GROUPS[(O + I) % 3]!;
        const gate = matrix(format, O, I, g, st), up = matrix(format, O, I, g, st);
        using dg = new DeviceMatrix(device, gate);
        using du = new DeviceMatrix(device, up);
        for (const S of [1, 8, 64]) {
          const x = randomGaussianF32(S * I, seed++);
          using op = new GemvOp(kernels, { matrices: [dg, du], S, limit });
          pooled.add(gateUpReference(gate, up, x, S, limit), op.run(x), 1e-6, `${O}x${I} S=${S} group ${g}`);
        }
      }
      expect(pooled.nmse).toBeLessThanOrEqual(1e-9);
    });
  }
});

describe("shared-memory reduction (forced by specialization constant) gives the same answers", () => {
  for (const format of FORMATS) {
    test(`${format}: float and gate+up`, () => {
      const pooled = new PooledError();
      for (const [O, I] of SHAPES) {
        const m = matrix(format, O, I, 64, "f16");
        withMatrix(m, (d) => {
          for (const S of [1, 3, 64]) {
            const x = randomGaussianF32(S * I, seed++);
            using op = new GemvOp(sharedKernels, { matrices: [d], S });
            pooled.add(gemvReference(m, x, S), op.run(x), 1e-6, `gemv ${O}x${I} S=${S}`);
            using gu = new GemvOp(sharedKernels, { matrices: [d, d], S });
            pooled.add(gateUpReference(m, m, x, S), gu.run(x), 1e-6, `gate+up ${O}x${I} S=${S}`);
          }
        });
      }
      expect(pooled.nmse).toBeLessThanOrEqual(1e-9);
    });
  }
});

describe("integer-dot path", () => {
  for (const format of FORMATS) for (const g of GROUPS) {
    test(`${format} group ${g}: activations bit-exact, output = emulation (NMSE ≤ 1e-9), ≤ 1e-3 vs float`, () => {
      const vsEmulation = new PooledError(), vsFloat = new PooledError();
      for (const [O, I] of SHAPES) {
        const m = matrix(format, O, I, g, O % 2 ? "f16" : "f32");
        withMatrix(m, (d) => {
          for (const S of TOKENS) {
            if (I === 16384 && S === 3) continue;
            const x = randomGaussianF32(S * I, seed++);
            using op = new GemvOp(kernels, { matrices: [d], S, path: "idp" });
            const y = op.run(x);
            const act = quantizeActivations(x, S, I, g);
            const [xq, xscale, xsum] = op.scratchBuffers() as [any, any, any];
            const rowBytes = 4 * Math.ceil(I / 16) * 4;
            const gpuQ = new Int8Array(downloadBytes(device, xq, 0n, S * rowBytes).buffer);
            expect(gpuQ).toEqual(act.q);
            expect(new Float32Array(downloadBytes(device, xscale, 0n, 4 * S * act.groupsPerRow).buffer)).toEqual(act.scale);
            expect(new Int32Array(downloadBytes(device, xsum, 0n, 4 * S * act.groupsPerRow).buffer)).toEqual(act.sum);
            vsEmulation.add(gemvIntDotEmulated(m, act, S), y, 1e-6, `${O}x${I} S=${S} vs emulation`);
            vsFloat.add(gemvReference(m, x, S), y, 1e-1, `${O}x${I} S=${S} vs float`);
          }
        });
      }
      expect(vsEmulation.nmse).toBeLessThanOrEqual(1e-9);
      expect(vsFloat.nmse).toBeLessThanOrEqual(1e-3);
    });
  }
});

describe("guards", () => {
  test("negative control: the NMSE bound catches one corrupted weight word", () => {
    const m = matrix("q4", 64, 256, 32, "f32");
    const x = randomGaussianF32(256, 7);
    const ref = gemvReference(m, x, 1);
    const bad = { ...m, weights: m.weights.slice() };
    bad.weights[5] ^= 0x77777777;
    const y = withMatrix(bad, (d) => {
      using op = new GemvOp(kernels, { matrices: [d], S: 1 });
      return op.run(x);
    });
    expect(nmse(ref, y)).toBeGreaterThan(1e-9);
  });

  test("negative control: a dispatch that writes past the output is caught by the sentinels", () => {
    // Claim the output is one row shorter than the shader writes: the sentinel check must fire.
    const m = matrix("q8", 9, 64, 32, "f32");
    withMatrix(m, (d) => {
      using op = new GemvOp(kernels, { matrices: [d], S: 2 });
      (op as any).O = 8; // the host now reads 16 floats and checks sentinels from word 16 on
      expect(() => op.run(randomGaussianF32(2 * 64, 3))).toThrow(OutOfBoundsWriteError);
    });
  });

  test("bad input is a typed error before any dispatch", () => {
    const m = matrix("q4", 8, 64, 32, "f32");
    expect(() => new DeviceMatrix(device, { ...m, scales: m.scales.subarray(0, 3) })).toThrow(/scale/i);
    expect(() => new DeviceMatrix(device, { ...m, groupSize: 48 as any })).toThrow(/group size/i);
    const nan = m.scales.slice();
    nan[2] = 0x7fc00000;
    expect(() => new DeviceMatrix(device, { ...m, scales: nan })).toThrow(/NaN|finite/i);
    withMatrix(m, (d) => {
      expect(() => new GemvOp(kernels, { matrices: [d], S: 0 })).toThrow(/S must be/);
      using op = new GemvOp(kernels, { matrices: [d], S: 2 });
      expect(() => op.run(new Float32Array(64))).toThrow(/expected S\*I/);
      const other = matrix("q4", 8, 96, 32, "f32");
      withMatrix(other, (o) => expect(() => new GemvOp(kernels, { matrices: [d, o], S: 1 })).toThrow(/differ/));
    });
  });
});
