import { describe, expect, test } from "bun:test";
import { gateUpCpu, gemvCpu } from "../src/quant/gemv-cpu.ts";
import { gateUpReference, gemvReference } from "../src/quant/gemv-reference.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { createQuantMatrix, setScaleBits } from "../src/quant/layout.ts";
import { nmse } from "../src/quant/metrics.ts";
import { quantize } from "../src/quant/quantize.ts";
import { mulberry32, randomGaussianF32, randomWords } from "../src/quant/random.ts";
import type { GroupSize, QuantFormat, QuantMatrix, ScaleType } from "../src/quant/types.ts";

const TOLERANCE = 1e-9;

function randomMatrix(format: QuantFormat, rows: number, cols: number, groupSize: GroupSize, scaleType: ScaleType, seed: number) {
  const data = randomGaussianF32(rows * cols, seed, 0.05);
  return quantize({ dtype: "f32", data }, rows, cols, { format, groupSize, scaleType });
}

function runCpu(m: QuantMatrix, x: Float32Array, S: number): Float32Array {
  const y = new Float32Array(S * m.rows).fill(NaN); // every output must be written
  gemvCpu(m, x, S, y);
  return y;
}

describe("gemvCpu vs gemvReference", () => {
  // (rows, cols): single output, odd widths, a lookup-path size (rows >= 256), a long row.
  const shapes: [number, number][] = [
    [1, 33],
    [5, 100],
    [300, 777],
    [3, 16384],
  ];
  let seed = 100;
  for (const format of ["q4", "q8"] as const) {
    for (const groupSize of [32, 64, 128] as const) {
      for (const scaleType of ["f16", "f32"] as const) {
        test(`${format} g${groupSize} ${scaleType}: NMSE <= ${TOLERANCE} for all shapes, S in 1,3,8,64`, () => {
          for (const [rows, cols] of shapes) {
            const m = randomMatrix(format, rows, cols, groupSize, scaleType, seed++);
            for (const S of [1, 3, 8, 64]) {
              const x = randomGaussianF32(S * cols, seed++);
              const error = nmse(gemvReference(m, x, S), runCpu(m, x, S));
              if (!(error <= TOLERANCE)) throw new Error(`rows ${rows} cols ${cols} S ${S}: NMSE ${error}`);
            }
          }
        });
      }
    }
  }

  test("raw random words (q8 -128 included, garbage in padding) and random scales", () => {
    for (const format of ["q4", "q8"] as const) {
      for (const [rows, cols, S] of [
        [260, 100, 1],
        [260, 100, 4],
        [17, 50, 5],
      ]) {
        const m = createQuantMatrix(format, rows, cols, 32, "f16");
        m.weights.set(randomWords(m.weights.length, rows + cols));
        const next = mulberry32(S);
        for (let k = 0; k < rows * m.groupsPerRow; k++) setScaleBits(m, k, f32ToF16Bits((next() - 0.5) * 0.1));
        const x = randomGaussianF32(S * cols, 9);
        expect(nmse(gemvReference(m, x, S), runCpu(m, x, S))).toBeLessThanOrEqual(TOLERANCE);
      }
    }
  });

  test("scratch reuse across calls of different shapes gives the same answers", () => {
    const big = randomMatrix("q4", 400, 300, 32, "f16", 1);
    const small = randomMatrix("q4", 7, 40, 32, "f32", 2);
    const xBig = randomGaussianF32(2 * 300, 3);
    const xSmall = randomGaussianF32(5 * 40, 4);
    const first = runCpu(big, xBig, 2);
    const smallFirst = runCpu(small, xSmall, 5);
    runCpu(randomMatrix("q8", 300, 1000, 128, "f32", 5), randomGaussianF32(64 * 1000, 6), 64);
    expect(runCpu(big, xBig, 2)).toEqual(first);
    expect(runCpu(small, xSmall, 5)).toEqual(smallFirst);
  });

  test("negative control: one corrupted weight word is caught by the NMSE check", () => {
    for (const format of ["q4", "q8"] as const) {
      const m = randomMatrix(format, 300, 777, 32, "f16", 42);
      const x = randomGaussianF32(3 * 777, 43);
      const want = gemvReference(m, x, 3);
      expect(nmse(want, runCpu(m, x, 3))).toBeLessThanOrEqual(TOLERANCE);
      const word = 123 * m.rowWords + 17; // row 123, columns well inside the row
      m.weights[word] = ~m.weights[word] >>> 0; // every q in that word changes
      const corrupted = nmse(want, runCpu(m, x, 3));
      expect(corrupted).toBeGreaterThan(TOLERANCE);
      expect(corrupted).toBeGreaterThan(1000 * TOLERANCE); // not a marginal miss
    }
  });

  test("matches an obvious hand computation", () => {
    // q8, 1 row, 3 columns, scale 0.5: W = [2, -4, 6] * 0.5 = [1, -2, 3]; x = [1, 1, 1] and [1, 2, 3].
    const m = createQuantMatrix("q8", 1, 3, 32, "f32");
    m.weights[0] = (2 | (0xfc << 8) | (6 << 16)) >>> 0;
    m.scales[0] = 0x3f000000; // 0.5f
    const y = runCpu(m, new Float32Array([1, 1, 1, 1, 2, 3]), 2);
    expect(Array.from(y)).toEqual([2, 6]);
  });
});

describe("gateUpCpu vs gateUpReference", () => {
  for (const format of ["q4", "q8"] as const) {
    for (const [rows, cols, S] of [
      [300, 256, 1],
      [300, 256, 8],
      [9, 100, 3],
    ]) {
      test(`${format} ${rows}x${cols} S=${S}, without and with limit`, () => {
        const gate = randomMatrix(format, rows, cols, 32, "f16", rows + S);
        const up = randomMatrix(format, rows, cols, 32, "f16", rows + S + 1);
        const x = randomGaussianF32(S * cols, 7, 4);
        const h = new Float32Array(S * rows).fill(NaN);
        gateUpCpu(gate, up, x, S, h);
        const want = gateUpReference(gate, up, x, S);
        expect(nmse(want, h)).toBeLessThanOrEqual(TOLERANCE);

        // A limit below typical |g|, |u| so the clamp really acts; unclamped results must differ.
        const g = gemvReference(gate, x, S);
        const u = gemvReference(up, x, S);
        const limit = 0.5;
        const clamped = g.filter((v) => v > limit).length + u.filter((v) => Math.abs(v) > limit).length;
        expect(clamped).toBeGreaterThan(g.length / 4);
        const hLimited = new Float32Array(S * rows);
        gateUpCpu(gate, up, x, S, hLimited, limit);
        const wantLimited = gateUpReference(gate, up, x, S, limit);
        expect(nmse(wantLimited, hLimited)).toBeLessThanOrEqual(TOLERANCE);
        expect(nmse(wantLimited, want)).toBeGreaterThan(1e-3);
        // silu(min(g, L)) * clamp(u, -L, L), by hand.
        for (let i = 0; i < g.length; i++) {
          const gc = Math.min(g[i], limit);
          const uc = Math.min(Math.max(u[i], -limit), limit);
          expect(wantLimited[i]).toBeCloseTo((gc / (1 + Math.exp(-gc))) * uc, 12);
        }
      });
    }
  }
});
