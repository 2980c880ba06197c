/**
 * The expert blob (pool/expert-layout.ts): gate and up by rows, down by 16-byte column blocks with
 * its scales by group. Checked element by element against the QuantMatrix, for both formats and
 * scale types, odd sizes, and a destination that is not 4-byte aligned. (The MoE tests check the
 * kernels read it that way: packing down by rows fails them, NMSE ~2.)
 */
import { describe, expect, test } from "bun:test";
import { expertLayout, packExpert, type ExpertShape } from "../src/pool/expert-layout.ts";
import { quantize, randomGaussianF32 } from "../src/quant/index.ts";

const SHAPES: ExpertShape[] = [
  { format: "q4", groupSize: 32, scaleType: "f16", hidden: 70, intermediate: 100 },
  { format: "q8", groupSize: 64, scaleType: "f32", hidden: 33, intermediate: 130 },
  { format: "q4", groupSize: 128, scaleType: "f16", hidden: 9, intermediate: 300 },
];

describe("expert blob layout", () => {
  for (const shape of SHAPES) for (const misaligned of [false, true]) {
    test(`${shape.format}/g${shape.groupSize}/${shape.scaleType} D=${shape.hidden} I=${shape.intermediate}${misaligned ? ", destination at an odd byte offset" : ""}`, () => {
      const layout = expertLayout(shape);
      const D = shape.hidden, I = shape.intermediate;
      const q = (rows: number, cols: number, seed: number) => quantize({ dtype: "f32", data: randomGaussianF32(rows * cols, seed) }, rows, cols, shape);
      const gate = q(I, D, 1), up = q(I, D, 2), down = q(D, I, 3);
      const backing = new Uint8Array(layout.bytes + 1).fill(0xa5); // a reused slab: stale bytes everywhere
      const blob = misaligned ? backing.subarray(1) : backing.subarray(0, layout.bytes);
      packExpert(layout, gate, up, down, blob);
      // every byte outside the parts' weights and scales (alignment gaps, the tail) is zero
      const written = new Uint8Array(layout.bytes);
      for (const p of [layout.gate, layout.up, layout.down]) {
        written.fill(1, p.weightOffset, p.weightOffset + p.weightBytes);
        written.fill(1, p.scaleOffset, p.scaleOffset + p.scaleBytes);
      }
      const staleGap = blob.findIndex((v, i) => written[i] === 0 && v !== 0);
      expect(staleGap).toBe(-1);
      const bytes = (m: typeof gate, arr: "weights" | "scales") => new Uint8Array(m[arr].buffer, m[arr].byteOffset, m[arr].byteLength);
      // gate and up: verbatim
      for (const [m, p] of [[gate, layout.gate], [up, layout.up]] as const) {
        expect(p.order).toBe("rows");
        expect(Array.from(blob.subarray(p.weightOffset, p.weightOffset + p.weightBytes))).toEqual(Array.from(bytes(m, "weights").subarray(0, p.weightBytes)));
        expect(Array.from(blob.subarray(p.scaleOffset, p.scaleOffset + p.scaleBytes))).toEqual(Array.from(bytes(m, "scales").subarray(0, p.scaleBytes)));
      }
      // down: uvec4 (o, c) at c * D + o; scale (o, g) at g * D + o
      const p = layout.down;
      expect(p.order).toBe("column-blocks");
      const w = bytes(down, "weights");
      for (let o = 0; o < D; o++) {
        for (let c = 0; c < p.rowWords / 4; c++) {
          const got = blob.subarray(p.weightOffset + 16 * (c * D + o), p.weightOffset + 16 * (c * D + o) + 16);
          const want = w.subarray(16 * (o * (p.rowWords / 4) + c), 16 * (o * (p.rowWords / 4) + c) + 16);
          if (got.some((v, i) => v !== want[i])) throw new Error(`down weights (row ${o}, block ${c}) misplaced`);
        }
      }
      const scaleBytes = shape.scaleType === "f16" ? 2 : 4;
      const s = bytes(down, "scales");
      for (let o = 0; o < D; o++) {
        for (let g = 0; g < p.groupsPerRow; g++) {
          const at = p.scaleOffset + scaleBytes * (g * D + o), from = scaleBytes * (o * p.groupsPerRow + g);
          for (let b = 0; b < scaleBytes; b++) if (blob[at + b] !== s[from + b]) throw new Error(`down scale (row ${o}, group ${g}) misplaced`);
        }
      }
    });
  }
});
