/** Test data for the attention kernels: f16 keys/values as the cache holds them, and byte views for uploads. */
import { f16BitsToF32, f32ToF16Bits } from "../../src/quant/half.ts";
import { randomGaussianF32 } from "../../src/quant/index.ts";

/** Random f32 values rounded to f16: the halves for the GPU and their exact values for the CPU. */
export function halves(count: number, s: number): { bits: Uint16Array; values: Float32Array } {
  const x = randomGaussianF32(count, s);
  const bits = new Uint16Array(count);
  const values = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    bits[i] = f32ToF16Bits(x[i]!);
    values[i] = f16BitsToF32(bits[i]!);
  }
  return { bits, values };
}

export function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}
