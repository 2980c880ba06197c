import { describe, expect, test } from "bun:test";
import { dequantize } from "../src/quant/dequantize.ts";
import { GgufLayoutError, NonFiniteValueError } from "../src/quant/errors.ts";
import { gemvCpu } from "../src/quant/gemv-cpu.ts";
import { gemvReference } from "../src/quant/gemv-reference.ts";
import { dequantizeGgufRow, fromGgufQ4_0, fromGgufQ8_0 } from "../src/quant/gguf.ts";
import { f16BitsToF32, f32ToF16Bits } from "../src/quant/half.ts";
import { getQ, getScaleBits } from "../src/quant/layout.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";

/** GGUF's own dequantization, straight from the bytes (what llama.cpp computes). */
function ggufDequantize(kind: "q4_0" | "q8_0", bytes: Uint8Array, rows: number, cols: number): Float32Array {
  const blockBytes = kind === "q4_0" ? 18 : 34;
  const out = new Float32Array(rows * cols);
  for (let b = 0; b < (rows * cols) / 32; b++) {
    const o = b * blockBytes;
    const d = f16BitsToF32(bytes[o] | (bytes[o + 1] << 8));
    for (let j = 0; j < 32; j++) {
      let q: number;
      if (kind === "q8_0") q = (bytes[o + 2 + j] << 24) >> 24;
      else q = j < 16 ? (bytes[o + 2 + j] & 15) - 8 : (bytes[o + 2 + j - 16] >> 4) - 8;
      out[b * 32 + j] = q * d;
    }
  }
  return out;
}

function randomGguf(kind: "q4_0" | "q8_0", rows: number, cols: number, seed: number): Uint8Array {
  const blockBytes = kind === "q4_0" ? 18 : 34;
  const bytes = new Uint8Array((rows * cols * blockBytes) / 32);
  const next = mulberry32(seed);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(next() * 256);
  for (let o = 0; o < bytes.length; o += blockBytes) {
    const d = f32ToF16Bits((next() - 0.5) * 0.02);
    bytes[o] = d & 0xff;
    bytes[o + 1] = d >> 8;
  }
  return bytes;
}

describe("GGUF Q4_0", () => {
  test("hand-built block: known values, scale bits and q order", () => {
    const block = new Uint8Array(18);
    block[0] = 0x00; // d = 0x3800 = 0.5, little-endian
    block[1] = 0x38;
    for (let j = 0; j < 16; j++) block[2 + j] = j | ((15 - j) << 4); // element j = j - 8, element j+16 = 7 - j
    const m = fromGgufQ4_0(block, 1, 32);
    expect(m.format).toBe("q4");
    expect(m.groupSize).toBe(32);
    expect(m.scaleType).toBe("f16");
    expect(getScaleBits(m, 0)).toBe(0x3800);
    for (let j = 0; j < 16; j++) {
      expect(getQ(m, 0, j)).toBe(j - 8);
      expect(getQ(m, 0, j + 16)).toBe(7 - j);
    }
    // word 0 = columns 0..7 = q -8..-1 -> nibbles 0..7: bytes (0|4<<4), (1|5<<4), (2|6<<4), (3|7<<4)
    expect(m.weights[0]).toBe(0x73625140);
    const deq = dequantize(m);
    for (let j = 0; j < 16; j++) {
      expect(deq[j]).toBe((j - 8) * 0.5);
      expect(deq[j + 16]).toBe((7 - j) * 0.5);
    }
  });

  test("random tensor: dequant equals GGUF's dequant bit for bit, scales bit-exact", () => {
    const rows = 5;
    const cols = 96;
    const bytes = randomGguf("q4_0", rows, cols, 1);
    const m = fromGgufQ4_0(bytes, rows, cols);
    expect(dequantize(m)).toEqual(ggufDequantize("q4_0", bytes, rows, cols));
    // a tensor at an odd address in the file (byte loads instead of 16-bit ones): the same matrix
    const shifted = new Uint8Array(bytes.length + 1);
    shifted.set(bytes, 1);
    expect(fromGgufQ4_0(shifted.subarray(1), rows, cols)).toEqual(m);
    for (let k = 0; k < rows * 3; k++) expect(getScaleBits(m, k)).toBe(bytes[k * 18] | (bytes[k * 18 + 1] << 8));
    const x = randomGaussianF32(3 * cols, 2);
    const y = new Float32Array(3 * rows);
    gemvCpu(m, x, 3, y);
    expect(nmse(gemvReference(m, x, 3), y)).toBeLessThanOrEqual(1e-9);
  });
});

describe("GGUF Q8_0", () => {
  test("hand-built block: -128 survives, d = 2", () => {
    const block = new Uint8Array(34);
    block[0] = 0x00; // d = 0x4000 = 2
    block[1] = 0x40;
    const q = [-128, -127, -1, 0, 1, 127, 5, -6];
    for (let j = 0; j < 32; j++) block[2 + j] = q[j % 8] & 0xff;
    const m = fromGgufQ8_0(block, 1, 32);
    expect(m.weights[0]).toBe(0x00ff8180);
    for (let j = 0; j < 32; j++) expect(getQ(m, 0, j)).toBe(q[j % 8]);
    expect(Array.from(dequantize(m).subarray(0, 8))).toEqual(q.map((v) => 2 * v));
  });

  test("random tensor: dequant equals GGUF's dequant bit for bit", () => {
    const rows = 4;
    const cols = 160;
    const bytes = randomGguf("q8_0", rows, cols, 3);
    const m = fromGgufQ8_0(bytes, rows, cols);
    expect(dequantize(m)).toEqual(ggufDequantize("q8_0", bytes, rows, cols));
    // an odd block count: the last f16 scale alone in its word
    const odd = randomGguf("q8_0", 3, 96, 4);
    const m3 = fromGgufQ8_0(odd, 3, 96);
    const shifted = new Uint8Array(odd.length + 1);
    shifted.set(odd, 1);
    expect(fromGgufQ8_0(shifted.subarray(1), 3, 96)).toEqual(m3);
    expect(dequantize(m3)).toEqual(ggufDequantize("q8_0", odd, 3, 96));
    for (let k = 0; k < 9; k++) expect(getScaleBits(m3, k)).toBe(odd[k * 34] | (odd[k * 34 + 1] << 8));
  });
});

describe("GGUF guards", () => {
  test("cols not a multiple of 32", () => {
    expect(() => fromGgufQ4_0(new Uint8Array(18), 1, 32)).not.toThrow();
    expect(() => fromGgufQ4_0(new Uint8Array(18), 1, 48)).toThrow(GgufLayoutError);
    expect(() => fromGgufQ8_0(new Uint8Array(34), 1, 33)).toThrow(/multiple of 32/);
  });

  test("byte length must match the shape", () => {
    expect(() => fromGgufQ8_0(new Uint8Array(68), 2, 32)).not.toThrow();
    expect(() => fromGgufQ8_0(new Uint8Array(67), 2, 32)).toThrow(GgufLayoutError);
    expect(() => fromGgufQ4_0(new Uint8Array(35), 1, 64)).toThrow(/36 bytes, got 35/);
  });

  test("a NaN block scale is rejected, naming row and block", () => {
    const bytes = new Uint8Array(2 * 2 * 18);
    bytes[3 * 18 + 1] = 0x7e; // row 1, block 1: d = 0x7e00 = NaN
    expect(() => fromGgufQ4_0(bytes, 2, 64)).toThrow(NonFiniteValueError);
    expect(() => fromGgufQ4_0(bytes, 2, 64)).toThrow(/row 1, group 1/);
  });
});

describe("GGUF rows straight from the blocks (embedding rows)", () => {
  for (const kind of ["q4_0", "q8_0"] as const) {
    test(`${kind}: every row of a random tensor (96 columns, odd rows) equals GGUF's dequant bit for bit`, () => {
      const rows = 13, cols = 96;
      const bytes = randomGguf(kind, rows, cols, 7);
      const want = ggufDequantize(kind, bytes, rows, cols);
      const out = new Float32Array(cols + 3).fill(-1);
      for (let r = 0; r < rows; r++) {
        dequantizeGgufRow(kind === "q4_0" ? "Q4_0" : "Q8_0", bytes, rows, cols, r, out);
        expect(Array.from(out.subarray(0, cols))).toEqual(Array.from(want.subarray(r * cols, (r + 1) * cols)));
      }
      expect(out[cols]).toBe(-1); // nothing written past the row
    });
  }

  test("a row outside the tensor, a short out, a NaN scale: typed errors", () => {
    const bytes = new Uint8Array(2 * 2 * 18);
    expect(() => dequantizeGgufRow("Q4_0", bytes, 2, 64, 2, new Float32Array(64))).toThrow(/row 2 is outside 0..1/);
    expect(() => dequantizeGgufRow("Q4_0", bytes, 2, 64, 0, new Float32Array(63))).toThrow(GgufLayoutError);
    expect(() => dequantizeGgufRow("Q8_0", bytes, 2, 64, 1, new Float32Array(64))).toThrow(/ends past/); // 2 rows of Q8_0 need 136 bytes
    bytes[3 * 18 + 1] = 0x7e; // row 1, block 1: d = NaN
    expect(() => dequantizeGgufRow("Q4_0", bytes, 2, 64, 0, new Float32Array(64))).not.toThrow();
    expect(() => dequantizeGgufRow("Q4_0", bytes, 2, 64, 1, new Float32Array(64))).toThrow(NonFiniteValueError);
    expect(() => dequantizeGgufRow("Q4_0", bytes, 2, 64, 1, new Float32Array(64))).toThrow(/row 1, block 1/);
  });
});
