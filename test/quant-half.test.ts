import { describe, expect, test } from "bun:test";
import { bf16BitsToF32, f16ArrayToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits } from "../src/quant/half.ts";

describe("f16 -> f32", () => {
  test("known bit patterns", () => {
    expect(f16BitsToF32(0x3c00)).toBe(1);
    expect(f16BitsToF32(0xbc00)).toBe(-1);
    expect(f16BitsToF32(0x7bff)).toBe(65504);
    expect(f16BitsToF32(0x0400)).toBe(2 ** -14);
    expect(f16BitsToF32(0x0001)).toBe(2 ** -24);
    expect(f16BitsToF32(0x03ff)).toBe(1023 * 2 ** -24);
    expect(Object.is(f16BitsToF32(0x8000), -0)).toBe(true);
    expect(Object.is(f16BitsToF32(0x0000), 0)).toBe(true);
    expect(f16BitsToF32(0x7c00)).toBe(Infinity);
    expect(f16BitsToF32(0xfc00)).toBe(-Infinity);
    expect(Number.isNaN(f16BitsToF32(0x7e00))).toBe(true);
    expect(Number.isNaN(f16BitsToF32(0x7c01))).toBe(true);
  });

  test("array decoder agrees with the scalar one on all 65536 patterns", () => {
    const all = new Uint16Array(65536).map((_, i) => i);
    const decoded = f16ArrayToF32(all);
    for (let h = 0; h < 65536; h++) {
      const want = f16BitsToF32(h);
      if (Number.isNaN(want)) expect(Number.isNaN(decoded[h])).toBe(true);
      else expect(Object.is(decoded[h], want)).toBe(true);
    }
  });
});

describe("f32 -> f16", () => {
  test("known values", () => {
    expect(f32ToF16Bits(1)).toBe(0x3c00);
    expect(f32ToF16Bits(-2)).toBe(0xc000);
    expect(f32ToF16Bits(65504)).toBe(0x7bff);
    expect(f32ToF16Bits(2 ** -24)).toBe(0x0001);
    expect(f32ToF16Bits(2 ** -14)).toBe(0x0400);
    expect(f32ToF16Bits(-0)).toBe(0x8000);
    expect(f32ToF16Bits(0)).toBe(0x0000);
    expect(f32ToF16Bits(Infinity)).toBe(0x7c00);
    expect(f32ToF16Bits(-Infinity)).toBe(0xfc00);
    const nan = f32ToF16Bits(NaN);
    expect(nan & 0x7c00).toBe(0x7c00);
    expect(nan & 0x3ff).not.toBe(0);
    expect(f32ToF16Bits(1e-10)).toBe(0); // far below the smallest subnormal
    expect(f32ToF16Bits(1e-45)).toBe(0); // an f32 subnormal
    expect(f32ToF16Bits(1e6)).toBe(0x7c00); // overflow
  });

  test("ties round to even", () => {
    expect(f32ToF16Bits(1 + 2 ** -11)).toBe(0x3c00); // halfway 1 .. 1+2^-10: even is 1
    expect(f32ToF16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02); // halfway 0x3c01 .. 0x3c02: even is 0x3c02
    expect(f32ToF16Bits(65520)).toBe(0x7c00); // halfway 65504 .. "65536": rounds to infinity
    expect(f32ToF16Bits(65519.996)).toBe(0x7bff);
    expect(f32ToF16Bits(2 ** -25)).toBe(0x0000); // halfway 0 .. 2^-24: even is 0
    expect(f32ToF16Bits(3 * 2 ** -25)).toBe(0x0002); // halfway 1 .. 2 subnormal units: even is 2
    expect(f32ToF16Bits(1.5 * 2 ** -25)).toBe(0x0001);
    expect(f32ToF16Bits(2 ** -14 - 2 ** -25)).toBe(0x0400); // halfway max subnormal .. min normal: even is 0x400
  });

  test("every half survives a round trip", () => {
    for (let h = 0; h < 65536; h++) {
      const v = f16BitsToF32(h);
      if (Number.isNaN(v)) continue;
      expect(f32ToF16Bits(v)).toBe(h);
    }
  });

  test("exhaustive midpoints: ties go to even, neighbours of the tie go to the nearer half", () => {
    const f32 = new Float32Array(1);
    const u32 = new Uint32Array(f32.buffer);
    // The f32 next to v with larger (+1) or smaller (-1) magnitude.
    const nextF32 = (v: number, dir: 1 | -1) => {
      f32[0] = v;
      u32[0] += dir;
      return f32[0];
    };
    for (const sign of [0, 0x8000]) {
      for (let h = 0; h < 0x7bff; h++) {
        const lo = f16BitsToF32(sign | h);
        const hi = f16BitsToF32(sign | (h + 1));
        const mid = (lo + hi) / 2; // exact in f32: halves have at most 11 significant bits
        expect(Math.fround(mid)).toBe(mid);
        const even = (h & 1) === 0 ? h : h + 1;
        if (mid === 0) continue;
        expect(f32ToF16Bits(mid)).toBe(sign | even);
        expect(f32ToF16Bits(nextF32(mid, -1))).toBe(sign | h);
        expect(f32ToF16Bits(nextF32(mid, 1))).toBe(sign | (h + 1));
      }
    }
  });
});

describe("bf16", () => {
  test("known values", () => {
    expect(bf16BitsToF32(0x3f80)).toBe(1);
    expect(bf16BitsToF32(0xc040)).toBe(-3);
    expect(bf16BitsToF32(0x7f80)).toBe(Infinity);
    expect(Number.isNaN(bf16BitsToF32(0x7fc0))).toBe(true);
    expect(Object.is(bf16BitsToF32(0x8000), -0)).toBe(true);
  });

  test("f32 -> bf16 rounds to nearest even and keeps NaN", () => {
    expect(f32ToBf16Bits(1)).toBe(0x3f80);
    expect(f32ToBf16Bits(1 + 2 ** -8)).toBe(0x3f80); // tie, even stays
    expect(f32ToBf16Bits(1 + 3 * 2 ** -8)).toBe(0x3f82); // tie, rounds up to even
    expect(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -20)).toBe(0x3f81);
    expect(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(NaN)))).toBe(true);
    for (let b = 0; b < 65536; b++) {
      const v = bf16BitsToF32(b);
      if (!Number.isNaN(v)) expect(f32ToBf16Bits(v)).toBe(b);
    }
  });
});
