import { describe, expect, test } from "bun:test";
import { gemvReference } from "../src/quant/gemv-reference.ts";
import { frexpExponent, gemvIntDotEmulated, quantizeActivations } from "../src/quant/intdot.ts";
import { nmse } from "../src/quant/metrics.ts";
import { quantize } from "../src/quant/quantize.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";

function groupOf(values: number[], cols = 32) {
  const x = new Float32Array(cols);
  x.set(values);
  return quantizeActivations(x, 1, cols, 32);
}

describe("quantizeActivations rule", () => {
  test("frexp exponent, normals and subnormals", () => {
    expect(frexpExponent(1)).toBe(1); // 0.5 * 2^1
    expect(frexpExponent(0.75)).toBe(0);
    expect(frexpExponent(127.99)).toBe(7);
    expect(frexpExponent(128)).toBe(8);
    expect(frexpExponent(2 ** -126)).toBe(-125);
    expect(frexpExponent(2 ** -149)).toBe(-148);
    expect(frexpExponent(3 * 2 ** -149)).toBe(-147);
  });

  test("amax exactly a power of two: 4 = 0.5 * 2^3 -> scale 2^-4, 4 -> 64", () => {
    const a = groupOf([4, -2, 1, 0.03125, -4]);
    expect(a.scale[0]).toBe(2 ** -4);
    expect(Array.from(a.q.subarray(0, 6))).toEqual([64, -32, 16, 0, -64, 0]); // 0.03125*16 = 0.5 -> ties to 0
    expect(a.sum[0]).toBe(64 - 32 + 16 - 64);
  });

  test("ties round half to even", () => {
    // amax 1 -> e = 1, q = x * 64. 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, 0.5 -> 0, 1.5 -> 2.
    const a = groupOf([1, 2.5 / 64, 3.5 / 64, -2.5 / 64, 0.5 / 64, 1.5 / 64, 2.4 / 64]);
    expect(a.scale[0]).toBe(1 / 64);
    expect(Array.from(a.q.subarray(0, 7))).toEqual([64, 2, 4, -2, 0, 2, 2]);
  });

  test("127.99 clamps to 127 (amax just below 2^7 uses the top of the range)", () => {
    const a = groupOf([127.99, -127.6, 127.4, 64.5]);
    expect(a.scale[0]).toBe(1);
    expect(Array.from(a.q.subarray(0, 4))).toEqual([127, -127, 127, 64]);
    expect(a.sum[0]).toBe(127 - 127 + 127 + 64);
  });

  test("zero groups, tail groups and zero padding", () => {
    const S = 2;
    const cols = 40; // groups of 32: one full, one of 8; paddedCols 48
    const x = new Float32Array(S * cols);
    x[0] = 0.5; // token 0 group 0: amax 0.5 -> e 0 -> q = x * 128 -> clamped 64
    x[35] = -3; // token 0 group 1 (tail): amax 3 -> e 2, q = x * 32 = -96
    // token 1: all zero
    const a = quantizeActivations(x, S, cols, 32);
    expect(a.paddedCols).toBe(48);
    expect(a.q.length).toBe(S * 48);
    expect(Array.from(a.scale)).toEqual([2 ** -7, 2 ** -5, 0, 0]);
    expect(a.q[0]).toBe(64);
    expect(a.q[35]).toBe(-96);
    expect(Array.from(a.sum)).toEqual([64, -96, 0, 0]);
    expect(a.q.filter((v) => v !== 0).length).toBe(2);
  });

  test("dequantized activations are exact and within half a step", () => {
    const cols = 1000;
    const x = randomGaussianF32(3 * cols, 11);
    const a = quantizeActivations(x, 3, cols, 64);
    for (let s = 0; s < 3; s++) {
      for (let c = 0; c < cols; c++) {
        const scale = a.scale[s * a.groupsPerRow + Math.floor(c / 64)];
        const back = a.q[s * a.paddedCols + c] * scale;
        expect(Math.abs(back - x[s * cols + c])).toBeLessThanOrEqual(scale / 2);
      }
    }
  });
});

describe("gemvIntDotEmulated", () => {
  for (const format of ["q4", "q8"] as const) {
    for (const groupSize of [32, 128] as const) {
      for (const [rows, S] of [
        [64, 1],
        [300, 4],
      ]) {
        test(`${format} g${groupSize} ${rows}x2048 S=${S}: NMSE vs float reference <= 1e-3`, () => {
          const cols = 2048;
          const m = quantize({ dtype: "f32", data: randomGaussianF32(rows * cols, rows + S) }, rows, cols, {
            format,
            groupSize,
            scaleType: "f16",
          });
          const x = randomGaussianF32(S * cols, 99);
          const act = quantizeActivations(x, S, cols, groupSize);
          const got = gemvIntDotEmulated(m, act, S);
          const error = nmse(gemvReference(m, x, S), got);
          expect(error).toBeLessThanOrEqual(1e-3);
          expect(error).toBeGreaterThan(0); // activations really were quantized

          // Integer sums are exact: the result equals the float reference on the dequantized activations.
          const xDequantized = new Float32Array(S * cols);
          for (let s = 0; s < S; s++) {
            for (let c = 0; c < cols; c++) {
              xDequantized[s * cols + c] = act.q[s * act.paddedCols + c] * act.scale[s * act.groupsPerRow + Math.floor(c / groupSize)];
            }
          }
          expect(nmse(gemvReference(m, xDequantized, S), got)).toBeLessThanOrEqual(1e-24);
        });
      }
    }
  }
});
