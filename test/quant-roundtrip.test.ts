import { describe, expect, test } from "bun:test";
import { dequantize } from "../src/quant/dequantize.ts";
import { bf16BitsToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits } from "../src/quant/half.ts";
import { getQ, getScale } from "../src/quant/layout.ts";
import { quantize } from "../src/quant/quantize.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import type { DenseSource, GroupSize, QuantFormat, ScaleType } from "../src/quant/types.ts";

const roundHalfAway = (v: number) => (v < 0 ? -Math.floor(-v + 0.5) : Math.floor(v + 0.5));

function makeSource(dtype: DenseSource["dtype"], values: Float32Array): { source: DenseSource; f32: Float32Array } {
  if (dtype === "f32") return { source: { dtype, data: values }, f32: values };
  const data = new Uint16Array(values.length);
  const f32 = new Float32Array(values.length);
  for (let i = 0; i < values.length; i++) {
    data[i] = dtype === "f16" ? f32ToF16Bits(values[i]) : f32ToBf16Bits(values[i]);
    f32[i] = dtype === "f16" ? f16BitsToF32(data[i]) : bf16BitsToF32(data[i]);
  }
  return { source: { dtype, data }, f32 };
}

/** Checks every element; returns a list of problems (empty when all is well). */
function checkRoundTrip(
  f32: Float32Array,
  rows: number,
  cols: number,
  format: QuantFormat,
  groupSize: GroupSize,
  scaleType: ScaleType,
  source: DenseSource,
): string[] {
  const m = quantize(source, rows, cols, { format, groupSize, scaleType });
  const deq = dequantize(m);
  const problems: string[] = [];
  const qmax = format === "q4" ? 7 : 127;
  const qmin = format === "q4" ? -8 : -127;
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < m.groupsPerRow; g++) {
      const d = getScale(m, r * m.groupsPerRow + g);
      let argmax = -1;
      let amax = 0;
      for (let c = g * groupSize; c < Math.min(cols, (g + 1) * groupSize); c++) {
        const i = r * cols + c;
        const x = f32[i];
        const q = getQ(m, r, c);
        if (Math.abs(x) > amax) {
          amax = Math.abs(x);
          argmax = c;
        }
        // Quantized with the stored (possibly f16-rounded) scale:
        const want = d === 0 ? 0 : Math.min(qmax, Math.max(qmin, roundHalfAway(x / d)));
        if (q !== want) problems.push(`r${r} c${c}: q ${q}, want ${want}`);
        if (deq[i] !== Math.fround(q * d)) problems.push(`r${r} c${c}: dequant ${deq[i]} != fround(q*d)`);
        const err = Math.abs(x - deq[i]);
        const clampedHigh = format === "q4" && d !== 0 && x / d > 7.5; // opposite sign of the -8 element
        // Half a step (a full step when clamped), plus the f32 rounding of q*d in the dequantized value.
        const bound = (clampedHigh ? Math.abs(d) : Math.abs(d) / 2) * (1 + 2 ** -20) + Math.abs(deq[i]) * 2 ** -24;
        if (!(err <= bound)) problems.push(`r${r} c${c}: |x - deq| = ${err} > ${bound} (x ${x}, d ${d})`);
      }
      if (amax === 0 && d !== 0) problems.push(`r${r} g${g}: all-zero group has scale ${d}`);
      if (format === "q4" && amax > 0 && getQ(m, r, argmax) !== -8) {
        problems.push(`r${r} g${g}: largest |x| maps to ${getQ(m, r, argmax)}, want -8`);
      }
    }
  }
  // Padding columns of every row hold q = 0.
  const paddedCols = m.rowWords * (format === "q4" ? 8 : 4);
  for (let r = 0; r < rows; r++) {
    for (let c = cols; c < paddedCols; c++) if (getQ(m, r, c) !== 0) problems.push(`r${r} c${c}: padding q ${getQ(m, r, c)}`);
  }
  return problems;
}

describe("quantize -> dequantize", () => {
  const shapes: [number, number][] = [
    [1, 1],
    [1, 33],
    [3, 100],
    [2, 4097],
    [4, 128],
  ];
  for (const format of ["q4", "q8"] as const) {
    for (const groupSize of [32, 64, 128] as const) {
      for (const scaleType of ["f32", "f16"] as const) {
        for (const dtype of ["f32", "f16", "bf16"] as const) {
          test(`${format} g${groupSize} ${scaleType} scales from ${dtype}`, () => {
            let seed = 1;
            for (const [rows, cols] of shapes) {
              const values = randomGaussianF32(rows * cols, seed++, 3);
              const { source, f32 } = makeSource(dtype, values);
              expect(checkRoundTrip(f32, rows, cols, format, groupSize, scaleType, source).slice(0, 5)).toEqual([]);
            }
          });
        }
      }
    }
  }

  test("zero groups, zero rows and mixed magnitudes", () => {
    const rows = 3;
    const cols = 200;
    const values = randomGaussianF32(rows * cols, 77);
    values.fill(0, 0, 64); // row 0: groups 0-1 all zero
    values.fill(0, cols, 2 * cols); // row 1 all zero
    const next = mulberry32(5);
    for (let i = 2 * cols; i < 3 * cols; i++) values[i] *= 10 ** Math.floor(next() * 8 - 4); // 1e-4 .. 1e3
    for (const format of ["q4", "q8"] as const) {
      for (const scaleType of ["f32", "f16"] as const) {
        const source: DenseSource = { dtype: "f32", data: values };
        expect(checkRoundTrip(values, rows, cols, format, 32, scaleType, source)).toEqual([]);
      }
    }
  });

  test("f16 scales: quantization uses the rounded scale, not the exact one", () => {
    // q8: amax 100 -> d = 100/127 = 0.787401..., f16 rounds it to 0.78759765625.
    const values = new Float32Array(32);
    values[0] = 100;
    values[1] = 50.004;
    const m = quantize({ dtype: "f32", data: values }, 1, 32, { format: "q8", groupSize: 32, scaleType: "f16" });
    const d = getScale(m, 0);
    expect(d).toBe(0.78759765625);
    expect(Math.fround(100 / 127)).not.toBe(d);
    expect(getQ(m, 0, 0)).toBe(127); // 100 / 0.7876 = 126.97
    expect(getQ(m, 0, 1)).toBe(roundHalfAway(50.004 / d)); // 63.49 -> 63 (with the exact d it would be 63.50 -> 64)
    expect(getQ(m, 0, 1)).toBe(63);
    expect(roundHalfAway(50.004 / Math.fround(100 / 127))).toBe(64);
  });
});

describe("hand-picked groups", () => {
  test("q4: the largest-magnitude element maps to -8, opposite sign clamps at 7", () => {
    const values = new Float32Array(32);
    values.set([-4, 2, 3.5, 1, 3.9, 4, -0.2, 0.25]);
    const m = quantize({ dtype: "f32", data: values }, 1, 32, { format: "q4", groupSize: 32, scaleType: "f32" });
    expect(getScale(m, 0)).toBe(0.5); // -4 / -8
    expect([0, 1, 2, 3, 4, 5, 6, 7, 8].map((c) => getQ(m, 0, c))).toEqual([-8, 4, 7, 2, 7, 7, 0, 1, 0]);
    const deq = dequantize(m);
    expect(Array.from(deq.subarray(0, 8))).toEqual([-4, 2, 3.5, 1, 3.5, 3.5, 0, 0.5]);
  });

  test("q4: a positive maximum gives a negative scale", () => {
    const values = new Float32Array([8, -8, 4, 0]);
    const m = quantize({ dtype: "f32", data: values }, 1, 4, { format: "q4", groupSize: 32, scaleType: "f16" });
    expect(getScale(m, 0)).toBe(-1);
    expect([0, 1, 2, 3].map((c) => getQ(m, 0, c))).toEqual([-8, 7, -4, 0]);
  });

  test("q8: maxabs maps to 127, rounding is half away from zero", () => {
    const values = new Float32Array([127, -63.5, 0.5, -0.5, 1.49, -127]);
    const m = quantize({ dtype: "f32", data: values }, 1, 6, { format: "q8", groupSize: 32, scaleType: "f32" });
    expect(getScale(m, 0)).toBe(1);
    expect([0, 1, 2, 3, 4, 5].map((c) => getQ(m, 0, c))).toEqual([127, -64, 1, -1, 1, -127]);
  });
});
