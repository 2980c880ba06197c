import { describe, expect, test } from "bun:test";
import { InvalidArgumentError, VkmoeError } from "../src/errors.ts";
import { dequantize } from "../src/quant/dequantize.ts";
import {
  BufferTooShortError,
  InvalidDimensionError,
  NonFiniteValueError,
  ScaleRangeError,
  ShapeMismatchError,
  UnsupportedFormatError,
  UnsupportedGroupSizeError,
} from "../src/quant/errors.ts";
import { gateUpCpu, gemvCpu } from "../src/quant/gemv-cpu.ts";
import { gateUpReference, gemvReference } from "../src/quant/gemv-reference.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { gemvIntDotEmulated, quantizeActivations } from "../src/quant/intdot.ts";
import { setScaleBits } from "../src/quant/layout.ts";
import { quantize } from "../src/quant/quantize.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { QuantMatrix } from "../src/quant/types.ts";
import { checkGemvArgs, validateQuantMatrix } from "../src/quant/validate.ts";

type ErrorClass = new (...args: never[]) => Error;

/** The guard is real: the valid call passes, the broken one throws `cls` with a message naming the problem. */
function expectGuard(valid: () => unknown, broken: () => unknown, cls: ErrorClass, message: RegExp): void {
  expect(valid).not.toThrow();
  let caught: unknown;
  try {
    broken();
  } catch (error) {
    caught = error;
  }
  expect(caught).toBeInstanceOf(cls);
  expect(caught).toBeInstanceOf(InvalidArgumentError);
  expect(caught).toBeInstanceOf(VkmoeError);
  expect((caught as VkmoeError).code).toBe("INVALID_ARGUMENT");
  expect((caught as Error).name).toBe(cls.name);
  expect((caught as Error).message).toMatch(message);
}

const ROWS = 3;
const COLS = 100;

function matrix(format: "q4" | "q8" = "q4", scaleType: "f16" | "f32" = "f16"): QuantMatrix {
  return quantize({ dtype: "f32", data: randomGaussianF32(ROWS * COLS, 1) }, ROWS, COLS, {
    format,
    groupSize: 32,
    scaleType,
  });
}

const broken = (change: (m: QuantMatrix) => void) => {
  const m = matrix();
  change(m);
  return m;
};

describe("validateQuantMatrix", () => {
  test("unsupported group size 48", () => {
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => ((m as { groupSize: number }).groupSize = 48))), UnsupportedGroupSizeError, /group size 48/);
  });

  test("unsupported format and scale type", () => {
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => ((m as { format: string }).format = "q3"))), UnsupportedFormatError, /format "q3"/);
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => ((m as { scaleType: string }).scaleType = "bf16"))), UnsupportedFormatError, /scale type "bf16"/);
  });

  test("weights array too short", () => {
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.weights = m.weights.subarray(1)))), BufferTooShortError, /weights array too short.*need 48 u32 words, got 47/);
  });

  test("scales array too short (f16 and f32)", () => {
    // 3 rows x 4 groups = 12 scales: 6 words as f16, 12 as f32
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.scales = m.scales.subarray(0, 5)))), BufferTooShortError, /scales array too short.*need 6 u32 words, got 5/);
    const f32 = matrix("q8", "f32");
    expectGuard(() => validateQuantMatrix(f32), () => validateQuantMatrix({ ...f32, scales: f32.scales.subarray(0, 11) }), BufferTooShortError, /need 12 u32 words, got 11/);
  });

  test("NaN / Inf scale names row and group", () => {
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => setScaleBits(m, 1 * 4 + 2, 0x7e00))), NonFiniteValueError, /row 1, group 2/);
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => setScaleBits(m, 2 * 4 + 3, 0xfc00))), NonFiniteValueError, /row 2, group 3/);
    const f32 = matrix("q8", "f32");
    expectGuard(() => validateQuantMatrix(f32), () => {
      const m = matrix("q8", "f32");
      m.scales[5] = 0x7fc00000; // NaN
      validateQuantMatrix(m);
    }, NonFiniteValueError, /row 1, group 1/);
    // odd scale count with f16: the last scale sits alone in the low half of the last word
    const odd = quantize({ dtype: "f32", data: randomGaussianF32(32, 2) }, 1, 32, { format: "q4", groupSize: 32, scaleType: "f16" });
    expectGuard(() => validateQuantMatrix(odd), () => validateQuantMatrix({ ...odd, scales: new Uint32Array([0x7c00]) }), NonFiniteValueError, /row 0, group 0/);
  });

  test("rowWords and groupsPerRow must match cols", () => {
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.rowWords = 20))), ShapeMismatchError, /rowWords is 20 but a q4 row of 100 columns needs 16/);
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.groupsPerRow = 3))), ShapeMismatchError, /groupsPerRow is 3/);
  });

  test("non-integer and non-positive dimensions", () => {
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.rows = 2.5))), InvalidDimensionError, /rows must be an integer, got 2.5/);
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.cols = 0))), InvalidDimensionError, /cols must be >= 1, got 0/);
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.rows = -1))), InvalidDimensionError, /rows must be >= 1/);
    expectGuard(() => validateQuantMatrix(matrix()), () => validateQuantMatrix(broken((m) => (m.cols = NaN))), InvalidDimensionError, /cols must be an integer, got NaN/);
  });

  test("every entry point validates the matrix", () => {
    const bad = broken((m) => setScaleBits(m, 0, 0x7e00));
    const x = randomGaussianF32(COLS, 3);
    const act = quantizeActivations(x, 1, COLS, 32);
    const good = matrix();
    for (const call of [
      (m: QuantMatrix) => dequantize(m),
      (m: QuantMatrix) => gemvReference(m, x, 1),
      (m: QuantMatrix) => gemvCpu(m, x, 1, new Float32Array(ROWS)),
      (m: QuantMatrix) => gateUpCpu(m, good, x, 1, new Float32Array(ROWS)),
      (m: QuantMatrix) => gateUpReference(good, m, x, 1),
      (m: QuantMatrix) => gemvIntDotEmulated(m, act, 1),
    ]) {
      expectGuard(() => call(good), () => call(bad), NonFiniteValueError, /row 0, group 0/);
    }
  });
});

describe("checkGemvArgs", () => {
  const m = matrix();
  const x = (S: number) => randomGaussianF32(S * COLS, 4);
  const ok = () => checkGemvArgs(m, x(2), 2, new Float32Array(2 * ROWS));

  test("x length must be S*cols", () => {
    expectGuard(ok, () => checkGemvArgs(m, x(2).subarray(1), 2), ShapeMismatchError, /x length must be S\*cols = 2\*100 = 200, got 199/);
  });

  test("y length must be S*rows", () => {
    expectGuard(ok, () => checkGemvArgs(m, x(2), 2, new Float32Array(5)), ShapeMismatchError, /y length must be S\*rows = 2\*3 = 6, got 5/);
    expectGuard(ok, () => gemvCpu(m, x(2), 2, new Float32Array(7)), ShapeMismatchError, /y length/);
  });

  test("S must be an integer in 1..64", () => {
    expectGuard(() => checkGemvArgs(m, x(64), 64), () => checkGemvArgs(m, new Float32Array(0), 0), InvalidDimensionError, /S must be an integer in 1\.\.64, got 0/);
    expectGuard(() => checkGemvArgs(m, x(64), 64), () => checkGemvArgs(m, x(65), 65), InvalidDimensionError, /got 65/);
    expectGuard(ok, () => checkGemvArgs(m, x(2), 1.5), InvalidDimensionError, /got 1.5/);
    expectGuard(ok, () => quantizeActivations(x(2), 65, COLS, 32), InvalidDimensionError, /got 65/);
  });

  test("NaN or Inf in x names token and column", () => {
    const withNaN = x(2);
    withNaN[1 * COLS + 3] = NaN;
    expectGuard(ok, () => checkGemvArgs(m, withNaN, 2), NonFiniteValueError, /x\[token 1, column 3\] is NaN/);
    expectGuard(ok, () => gemvCpu(m, withNaN, 2, new Float32Array(2 * ROWS)), NonFiniteValueError, /token 1, column 3/);
    const withInf = x(1);
    withInf[7] = -Infinity;
    expectGuard(ok, () => gemvReference(m, withInf, 1), NonFiniteValueError, /x\[token 0, column 7\] is infinite/);
    expectGuard(ok, () => quantizeActivations(withInf, 1, COLS, 32), NonFiniteValueError, /column 7/);
  });

  test("x and y must be Float32Array", () => {
    expectGuard(ok, () => checkGemvArgs(m, new Float64Array(2 * COLS) as unknown as Float32Array, 2), UnsupportedFormatError, /x must be a Float32Array/);
  });
});

describe("gate/up and activation guards", () => {
  const x = randomGaussianF32(COLS, 5);
  test("gate and up must have identical shapes", () => {
    const gate = matrix();
    const up = matrix();
    const wider = quantize({ dtype: "f32", data: randomGaussianF32(ROWS * 128, 6) }, ROWS, 128, { format: "q4", groupSize: 32, scaleType: "f16" });
    const h = new Float32Array(ROWS);
    expectGuard(() => gateUpCpu(gate, up, x, 1, h), () => gateUpCpu(gate, wider, x, 1, h), ShapeMismatchError, /gate.cols = 100, up.cols = 128/);
    expectGuard(() => gateUpReference(gate, up, x, 1), () => gateUpReference(gate, matrix("q8"), x, 1), ShapeMismatchError, /gate.format = q4, up.format = q8/);
  });

  test("limit must be a finite positive number", () => {
    const gate = matrix();
    const h = new Float32Array(ROWS);
    for (const limit of [0, -1, NaN, Infinity]) {
      expectGuard(() => gateUpCpu(gate, gate, x, 1, h, 7), () => gateUpCpu(gate, gate, x, 1, h, limit), InvalidArgumentError, /limit must be a finite number > 0/);
    }
  });

  test("activations must match the matrix they are used with", () => {
    const m = matrix();
    expectGuard(() => gemvIntDotEmulated(m, quantizeActivations(x, 1, COLS, 32), 1), () => gemvIntDotEmulated(m, quantizeActivations(x, 1, COLS, 64), 1), ShapeMismatchError, /groupSize=64/);
    expectGuard(() => quantizeActivations(x, 1, COLS, 32), () => quantizeActivations(x, 1, COLS, 48), UnsupportedGroupSizeError, /48/);
  });
});

describe("quantizer guards", () => {
  const data = () => randomGaussianF32(ROWS * COLS, 8);
  const options = { format: "q8", groupSize: 32, scaleType: "f16" } as const;

  test("NaN / Inf input names row and col, for every dtype", () => {
    const f32 = data();
    f32[2 * COLS + 17] = NaN;
    expectGuard(() => quantize({ dtype: "f32", data: data() }, ROWS, COLS, options), () => quantize({ dtype: "f32", data: f32 }, ROWS, COLS, options), NonFiniteValueError, /input row 2, col 17 is NaN/);
    const f16 = new Uint16Array(ROWS * COLS);
    f16[COLS + 4] = 0x7c00;
    expectGuard(() => quantize({ dtype: "f16", data: new Uint16Array(ROWS * COLS) }, ROWS, COLS, options), () => quantize({ dtype: "f16", data: f16 }, ROWS, COLS, options), NonFiniteValueError, /input row 1, col 4 is infinite/);
    const bf16 = new Uint16Array(ROWS * COLS);
    bf16[5] = 0x7fc0;
    expectGuard(() => quantize({ dtype: "bf16", data: new Uint16Array(ROWS * COLS) }, ROWS, COLS, options), () => quantize({ dtype: "bf16", data: bf16 }, ROWS, COLS, options), NonFiniteValueError, /input row 0, col 5 is NaN/);
  });

  test("data length, dtype and array type", () => {
    expectGuard(() => quantize({ dtype: "f32", data: data() }, ROWS, COLS, options), () => quantize({ dtype: "f32", data: data() }, ROWS, COLS + 1, options), ShapeMismatchError, /rows\*cols = 3\*101 = 303, got 300/);
    expectGuard(() => quantize({ dtype: "f32", data: data() }, ROWS, COLS, options), () => quantize({ dtype: "f16", data: data() } as never, ROWS, COLS, options), UnsupportedFormatError, /f16 needs data as Uint16Array/);
    expectGuard(() => quantize({ dtype: "f32", data: data() }, ROWS, COLS, options), () => quantize({ dtype: "f8", data: data() } as never, ROWS, COLS, options), UnsupportedFormatError, /dtype "f8"/);
  });

  test("options and dimensions", () => {
    const ok = () => quantize({ dtype: "f32", data: data() }, ROWS, COLS, options);
    expectGuard(ok, () => quantize({ dtype: "f32", data: data() }, ROWS, COLS, { ...options, groupSize: 48 as never }), UnsupportedGroupSizeError, /group size 48/);
    expectGuard(ok, () => quantize({ dtype: "f32", data: data() }, 1.5, 200, options), InvalidDimensionError, /rows must be an integer, got 1.5/);
  });

  test("a scale that overflows f16 is refused rather than stored as infinity", () => {
    const big = new Float32Array(32).fill(1);
    big[3] = 1e7; // q8 scale 1e7/127 = 78740 > 65504
    const fits = new Float32Array(32).fill(1);
    fits[3] = 8e6; // 62992: fits
    expectGuard(() => quantize({ dtype: "f32", data: fits }, 1, 32, options), () => quantize({ dtype: "f32", data: big }, 1, 32, options), ScaleRangeError, /row 0, group 0 overflows f16/);
    expect(() => quantize({ dtype: "f32", data: big }, 1, 32, { ...options, scaleType: "f32" })).not.toThrow();
    expect(f32ToF16Bits(1e7 / 127)).toBe(0x7c00);
  });
});
