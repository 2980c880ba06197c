/**
 * Random GGML expert layers and routings, the CPU reference of the MoE call over them, and one GPU call
 * of GgmlExpertKernels (tests of moe_ggml, moe_ggml_rows and moe_ggml_rows_idp).
 */
import { expect } from "bun:test";
import { submitAndWait } from "../../src/kernels/decoder/common.ts";
import { GgmlExpertKernels, GgmlExpertLayer, writeWorkList, type ExpertQuantScratch, type GgmlExpertTensors } from "../../src/moe/ggml-experts.ts";
import { WorkList, checkRouting, type Routing } from "../../src/moe/routing.ts";
import { ggmlBlockTensor, type GgmlBlockTensor, type GgmlBlockType } from "../../src/quant/ggml-blocks.ts";
import { gemvGgmlBlocks } from "../../src/quant/ggml-gemv.ts";
import { mulberry32 } from "../../src/quant/random.ts";
import type { Device } from "../../src/vk/device.ts";
import type { Buffer } from "../../src/vk/memory.ts";
import { expectTail, f32, hostBuffer, u32 } from "./host-buffers.ts";
import { randomGgmlBlocks as randomBlocks } from "./ggml-blocks.ts";

export const randomTensor = (type: GgmlBlockType, rows: number, cols: number, rand: () => number): GgmlBlockTensor =>
  ggmlBlockTensor(type, randomBlocks(type, rows, cols, rand), rows, cols);

export function randomExperts(E: number, D: number, I: number, gu: GgmlBlockType, dn: GgmlBlockType, seed: number): GgmlExpertTensors[] {
  const rand = mulberry32(seed);
  return Array.from({ length: E }, () => ({ gate: randomTensor(gu, I, D, rand), up: randomTensor(gu, I, D, rand), down: randomTensor(dn, D, I, rand) }));
}

/** S tokens, k distinct experts each of E, random positive weights. */
export function randomRouting(S: number, k: number, E: number, seed: number): Routing {
  const rand = mulberry32(seed);
  const ids = new Int32Array(S * k), weights = new Float32Array(S * k);
  for (let s = 0; s < S; s++) {
    const perm = Array.from({ length: E }, (_, e) => e);
    for (let i = E - 1; i > 0; i--) {
      const j = Math.floor(rand() * (i + 1));
      [perm[i], perm[j]] = [perm[j]!, perm[i]!];
    }
    for (let j = 0; j < k; j++) {
      ids[s * k + j] = perm[j]!;
      weights[s * k + j] = 0.05 + rand();
    }
  }
  return { S, k, ids, weights };
}

export function gemv(w: GgmlBlockTensor, x: Float32Array): Float32Array {
  const y = new Float32Array(w.rows);
  gemvGgmlBlocks(w, x, 1, y);
  return y;
}

/**
 * y [S][D] in f64 from the CPU GEMVs; h rounded to f32 (the GPU's storage). `input` (default: as it
 * is) maps each GEMV's input row first: the integer-dot tests pass the quantization the GPU applies.
 */
export function cpuMoe(experts: GgmlExpertTensors[], x: Float32Array, r: Routing, D: number, input: (v: Float32Array) => Float32Array = (v) => v): Float64Array {
  const y = new Float64Array(r.S * D);
  for (let s = 0; s < r.S; s++) {
    const xs = x.subarray(s * D, (s + 1) * D);
    for (let j = 0; j < r.k; j++) {
      const e = experts[r.ids[s * r.k + j]!]!, w = r.weights[s * r.k + j]!;
      const xi = input(xs);
      const g = gemv(e.gate, xi), u = gemv(e.up, xi);
      const h = new Float32Array(g.length);
      for (let i = 0; i < h.length; i++) h[i] = (g[i]! / (1 + Math.exp(-g[i]!))) * u[i]!;
      const yd = gemv(e.down, input(h));
      for (let d = 0; d < D; d++) y[s * D + d] += w * yd[d]!;
    }
  }
  return y;
}

/** One GPU call of the grouped kernels on `layer` for routing r; returns y [S][D]. */
export function gpuMoe(device: Device, kernels: GgmlExpertKernels, layer: GgmlExpertLayer, x: Float32Array, r: Routing, singleSlotItems?: boolean, quantized?: ExpertQuantScratch): Float32Array {
  const { D, I } = layer;
  checkRouting(r, layer.experts);
  const list = new WorkList(layer.experts, r.S * r.k);
  list.build(r, layer.experts, false);
  const slots = r.S * list.slotsPerToken;
  using xb = hostBuffer(device, r.S * D, "upload");
  using work = hostBuffer(device, 4 * (1 + list.items), "upload");
  using pairs = hostBuffer(device, slots, "upload");
  using sw = hostBuffer(device, slots, "upload");
  using h = hostBuffer(device, slots * I);
  using ypair = hostBuffer(device, slots * D);
  using y = hostBuffer(device, r.S * D);
  using done = hostBuffer(device, 1);
  f32(xb, r.S * D).set(x);
  writeWorkList(list, r.S, 7, u32(work, 4 * (1 + list.items)), u32(pairs, slots), f32(sw, slots));
  submitAndWait(device, (cb) => kernels.record(cb, { layer, S: r.S, items: list.items, slotsPerToken: list.slotsPerToken, x: xb, work, pairs, slotWeight: sw, h, ypair, y, done, singleSlotItems, quantized }));
  for (const [b, n, what] of [[h, slots * I, "h"], [ypair, slots * D, "ypair"], [y, r.S * D, "y"], [done, 1, "done"]] as const) expectTail(b, n, what);
  expect(u32(done, 1)[0]).toBe(7);
  return f32(y, r.S * D).slice();
}


/**
 * dec_route's list in host-visible buffers (item u = slot u, one slot each; `none`: slots given no
 * expert), and x: the decode graph's per-slot call (itemPerSlot).
 */
export function writeSlotList(x: Float32Array, r: Routing, b: { x: Buffer; work: Buffer; pairs: Buffer; slotWeight: Buffer }, none: readonly number[] = []): void {
  const slots = r.S * r.k;
  f32(b.x, x.length).set(x);
  const w = u32(b.work, 4 * (1 + slots));
  w.set([r.S, r.k, slots, 9]);
  for (let u = 0; u < slots; u++) {
    w.set([none.includes(u) ? 0xffffffff : r.ids[u]!, u, u, 1], 4 * (1 + u));
    u32(b.pairs, slots)[u] = u;
    f32(b.slotWeight, slots)[u] = r.weights[u]!;
  }
}
