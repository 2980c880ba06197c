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

/**
 * The split-GEMM tests' cases (decoder-gemm-ggml, decoder-gemm-ggml-idp): `runs` the column runs `splits` leaves for `blocks` blocks a row
 * (the last shorter where marked), for K-quants (256-element blocks) or the 32-element types.
 */
export const ggmlSplitCases = (kQuant: boolean) => kQuant
  ? [
    { rows: 70, blocks: 3, splits: 2, runs: 2, S: 13 }, // 512 + 256: a short last run
    { rows: 33, blocks: 5, splits: 5, runs: 5, S: 64 },
    { rows: 40, blocks: 3, splits: 3, runs: 3, S: 70 }, // two token tiles
    { rows: 7, blocks: 7, splits: 4, runs: 4, S: 64, xOffset: 4, yOffset: 3 }, // 3 x 512 + 256
  ]
  : [
    { rows: 70, blocks: 9, splits: 2, runs: 2, S: 13 }, // 160 + 128
    { rows: 33, blocks: 9, splits: 5, runs: 5, S: 64 }, // 4 x 64 + 32
    { rows: 40, blocks: 7, splits: 3, runs: 3, S: 70 }, // 96 + 96 + 32, two token tiles
    { rows: 7, blocks: 16, splits: 4, runs: 4, S: 64, xOffset: 4, yOffset: 3 },
  ];
