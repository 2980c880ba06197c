import { describe, expect, test } from "bun:test";
import { f16BitsToF32, f32ToF16Bits } from "../src/quant/half.ts";
import { createQuantMatrix, getQ, getScale, getScaleBits, setQ, setScaleBits } from "../src/quant/layout.ts";
import { quantize } from "../src/quant/quantize.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";

describe("q4 bit layout", () => {
  test("columns 0-3 are low nibbles of bytes 0-3, columns 4-7 the high nibbles", () => {
    const m = createQuantMatrix("q4", 1, 8, 32, "f32");
    for (let c = 0; c < 8; c++) setQ(m, 0, c, c); // stored nibbles 8..15
    // byte j = nibble(col j) | nibble(col j+4) << 4: 0xC8, 0xD9, 0xEA, 0xFB
    expect(m.weights[0]).toBe(0xfbead9c8);
    expect(m.weights[0] & 0x0f0f0f0f).toBe(0x0b0a0908); // columns 0-3, one byte each
    expect((m.weights[0] >>> 4) & 0x0f0f0f0f).toBe(0x0f0e0d0c); // columns 4-7
    for (let c = 0; c < 8; c++) expect(getQ(m, 0, c)).toBe(c);
  });

  test("a single -8 at column 5 clears the high nibble of byte 1", () => {
    const m = createQuantMatrix("q4", 1, 8, 32, "f32");
    expect(m.weights[0]).toBe(0x88888888); // fresh matrix: all q = 0
    setQ(m, 0, 5, -8);
    expect(m.weights[0]).toBe(0x88880888);
  });

  test("word w holds columns 8w..8w+7 and rows are rowWords apart", () => {
    const m = createQuantMatrix("q4", 2, 40, 32, "f32");
    expect(m.rowWords).toBe(8); // ceil(40/32)*4
    setQ(m, 0, 9, 7); // word 1, low nibble of byte 1
    setQ(m, 1, 36, -1); // row 1, word 4, high nibble of byte 0
    expect(m.weights[1]).toBe(0x88888f88);
    expect(m.weights[8 + 4]).toBe(0x88888878);
  });

  test("every q value -8..7 round-trips at every column position", () => {
    const m = createQuantMatrix("q4", 1, 8, 32, "f32");
    for (let c = 0; c < 8; c++) {
      for (let q = -8; q <= 7; q++) {
        setQ(m, 0, c, q);
        expect(getQ(m, 0, c)).toBe(q);
      }
      setQ(m, 0, c, 0);
    }
    expect(m.weights[0]).toBe(0x88888888);
  });
});

describe("q8 bit layout", () => {
  test("column 4w+j is two's-complement byte j of word w", () => {
    const m = createQuantMatrix("q8", 1, 8, 32, "f32");
    [1, -1, 127, -128, 0, 5, -6, 100].forEach((q, c) => setQ(m, 0, c, q));
    expect(m.weights[0]).toBe(0x807fff01);
    expect(m.weights[1]).toBe(0x64fa0500);
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((c) => getQ(m, 0, c))).toEqual([1, -1, 127, -128, 0, 5, -6, 100]);
  });
});

describe("row padding", () => {
  test("q4, 33 columns: one real column in word 4, words 5-7 are zero-q padding", () => {
    const x = randomGaussianF32(2 * 33, 1);
    const m = quantize({ dtype: "f32", data: x }, 2, 33, { format: "q4", groupSize: 32, scaleType: "f16" });
    expect(m.rowWords).toBe(8);
    expect(m.groupsPerRow).toBe(2);
    for (let r = 0; r < 2; r++) {
      const w4 = m.weights[r * 8 + 4];
      expect((w4 & ~0xf) >>> 0).toBe(0x88888880); // columns 33..39 are q = 0
      for (let w = 5; w < 8; w++) expect(m.weights[r * 8 + w]).toBe(0x88888888);
    }
  });

  test("q8, 33 columns: rowWords 12, words 9-11 zero", () => {
    const x = randomGaussianF32(33, 2);
    const m = quantize({ dtype: "f32", data: x }, 1, 33, { format: "q8", groupSize: 32, scaleType: "f32" });
    expect(m.rowWords).toBe(12);
    expect(m.weights[8] & ~0xff).toBe(0);
    for (let w = 9; w < 12; w++) expect(m.weights[w]).toBe(0);
  });

  test("rowWords for a few widths", () => {
    const widths: [number, number, number][] = [
      [1, 4, 4],
      [16, 4, 4],
      [17, 4, 8],
      [32, 4, 8],
      [33, 8, 12],
      [100, 16, 28],
      [4097, 516, 1028],
    ];
    for (const [cols, q4Words, q8Words] of widths) {
      expect(createQuantMatrix("q4", 1, cols, 32, "f32").rowWords).toBe(q4Words);
      expect(createQuantMatrix("q8", 1, cols, 32, "f32").rowWords).toBe(q8Words);
    }
  });
});

describe("scale storage", () => {
  test("f16: scale k in half k&1 of word k>>1, low half first; the spare half is 0", () => {
    const m = createQuantMatrix("q8", 3, 16, 32, "f16"); // 3 rows x 1 group = 3 scales -> 2 words
    expect(m.scales.length).toBe(2);
    [1, -2, 0.5].forEach((v, k) => setScaleBits(m, k, f32ToF16Bits(v)));
    expect(m.scales[0]).toBe(0xc0003c00);
    expect(m.scales[1]).toBe(0x3800);
    expect([0, 1, 2].map((k) => getScale(m, k))).toEqual([1, -2, 0.5]);
  });

  test("the scale index runs across rows: k = row * groupsPerRow + group", () => {
    const rows = 2;
    const cols = 100;
    const data = new Float32Array(rows * cols);
    // Group g of row r holds a single non-zero value 127*(r*4+g+1) at its first column; q8 scale = value/127.
    for (let r = 0; r < rows; r++) for (let g = 0; g < 4; g++) data[r * cols + g * 32] = 127 * (r * 4 + g + 1);
    const m = quantize({ dtype: "f32", data }, rows, cols, { format: "q8", groupSize: 32, scaleType: "f32" });
    expect(m.groupsPerRow).toBe(4);
    expect(m.scales.length).toBe(8);
    for (let k = 0; k < 8; k++) expect(getScale(m, k)).toBe(k + 1);
    const h = quantize({ dtype: "f32", data }, rows, cols, { format: "q8", groupSize: 32, scaleType: "f16" });
    expect(h.scales.length).toBe(4);
    for (let k = 0; k < 8; k++) expect(f16BitsToF32(getScaleBits(h, k))).toBe(k + 1);
  });
});
