/** Host-visible test buffers with sentinel words past the end, for kernels that must not write out of bounds. */
import { SENTINEL, SENTINEL_WORDS } from "../../src/kernels/gemv.ts";
import type { Device } from "../../src/vk/device.ts";
import { Buffer, type MemoryUse } from "../../src/vk/memory.ts";

export { SENTINEL, SENTINEL_WORDS };

/** A buffer of `words` 4-byte elements plus SENTINEL_WORDS more, every word set to SENTINEL. */
export function hostBuffer(device: Device, words: number, memory: MemoryUse = "readback"): Buffer {
  const b = new Buffer(device, { size: BigInt(4 * (words + SENTINEL_WORDS)), memory });
  new Uint32Array(b.host()).fill(SENTINEL);
  return b;
}

export const f32 = (b: Buffer, n: number, at = 0) => new Float32Array(b.host(), 4 * at, n);
export const u32 = (b: Buffer, n: number, at = 0) => new Uint32Array(b.host(), 4 * at, n);

/** Throws when a sentinel word after the first `words` elements was overwritten. */
export function expectTail(b: Buffer, words: number, what: string): void {
  const tail = u32(b, SENTINEL_WORDS, words);
  const bad = tail.findIndex((w) => w !== SENTINEL);
  if (bad >= 0) throw new Error(`${what}: sentinel word ${bad} past the end overwritten (0x${tail[bad]!.toString(16)})`);
}
