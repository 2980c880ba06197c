/** Random GGML block tensors for the GPU tests of the GGML kernels. */
import { GGML_BLOCK_LAYOUTS, ggmlBlockTensor, type GgmlBlockTensor, type GgmlBlockType } from "../../src/quant/ggml-blocks.ts";
import { f32ToF16Bits } from "../../src/quant/half.ts";
import { mulberry32 } from "../../src/quant/random.ts";

/** Random block bytes whose f16 scales are finite, of either sign, within 2^lo .. 2^(lo+11) (sub-scales and q random). */
export function randomGgmlBlocks(type: GgmlBlockType, rows: number, cols: number, rand: () => number, lo = -10): Uint8Array {
  const { blockElements, blockBytes, halfOffsets } = GGML_BLOCK_LAYOUTS[type];
  const bytes = new Uint8Array(rows * (cols / blockElements) * blockBytes);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(rand() * 256);
  for (let p = 0; p < bytes.length; p += blockBytes) {
    for (const h of halfOffsets) {
      const bits = f32ToF16Bits((rand() < 0.5 ? -1 : 1) * 2 ** (lo + 11 * rand()));
      bytes[p + h] = bits & 0xff;
      bytes[p + h + 1] = bits >> 8;
    }
  }
  return bytes;
}

/** A random tensor of `blocks` blocks a row (randomGgmlBlocks from mulberry32(seed)). */
export function randomGgmlTensor(type: GgmlBlockType, rows: number, blocks: number, seed: number, lo = -10): GgmlBlockTensor {
  const cols = blocks * GGML_BLOCK_LAYOUTS[type].blockElements;
  return ggmlBlockTensor(type, randomGgmlBlocks(type, rows, cols, mulberry32(seed), lo), rows, cols);
}
