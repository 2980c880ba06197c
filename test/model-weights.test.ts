/** Weight conversions of the model layer that the fixtures do not reach: GGUF Q4_0 experts widened to q8 when a layer mixes Q4_0 and Q8_0. */
import { expect, test } from "bun:test";
import { widenQ4 } from "../src/model/weights.ts";
import { dequantize } from "../src/quant/dequantize.ts";
import { quantize } from "../src/quant/quantize.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";

test("widenQ4 keeps every weight and scale: q8 dequantizes to the q4's exact values, odd column counts included", () => {
  for (const [rows, cols] of [[1, 32], [7, 33], [64, 200]] as const) {
    const q4 = quantize({ dtype: "f32", data: randomGaussianF32(rows * cols, rows + cols) }, rows, cols, { format: "q4", groupSize: 32, scaleType: "f16" });
    const q8 = widenQ4(q4);
    expect(q8.format).toBe("q8");
    expect(Array.from(dequantize(q8))).toEqual(Array.from(dequantize(q4)));
  }
});
