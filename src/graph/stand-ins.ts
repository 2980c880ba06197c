/**
 * Buffers of stand-in values for the graphs' warm dispatches (NormFeed.recordWarm, RouterWarm): a
 * pipeline run ahead of time on buffers of its own, so that nothing the real steps read or write is
 * touched. Ones, not zeros, where the values pick a code path (an all-zero row takes the quantizer's
 * zero-group branch, not the one the real rows take).
 */
import type { Device } from "../vk/device.ts";
import { Buffer } from "../vk/memory.ts";
import { uploadBytes } from "../vk/transfer.ts";

/** A device buffer of `floats` f32 values (at least 4), every one `value`. */
export function filledBuffer(device: Device, floats: number, value: number): Buffer {
  const b = new Buffer(device, { size: BigInt(4 * Math.max(4, floats)), memory: "device" });
  try {
    uploadBytes(device, b, 0n, new Uint8Array(new Float32Array(Number(b.size) / 4).fill(value).buffer));
    return b;
  } catch (e) {
    b[Symbol.dispose]();
    throw e;
  }
}
