/**
 * moe_ggml_chain (src/moe/ggml-experts.ts `chained`, shaders/moe_ggml_chain.comp) on the real driver
 * under the validation layer: the decode graph's GGML experts call (dec_route's list, item u = slot
 * u, down summing each token's slots) as one dispatch whose down workgroups wait on their token's
 * gate+up blocks. Against the CPU GEMVs over the same blocks (cpuMoe), NMSE <= 1e-9; several calls
 * on one control buffer (its counters must come back to zero after each, or the next call's down
 * blocks would not wait, or wait forever); partial row blocks; slots with no expert.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { chainControlWords, GgmlExpertKernels, GgmlExpertLayer, type GgmlExpertKernelOptions } from "../src/moe/ggml-experts.ts";
import type { Routing } from "../src/moe/routing.ts";
import type { GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { nmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { CommandBuffer } from "../src/vk/commands.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer, SENTINEL, u32 } from "./support/host-buffers.ts";
import { cpuMoe, randomExperts, randomRouting, writeSlotList } from "./support/moe-ggml-cases.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => finish(ctx));

const E = 8;

/** Calls in one command buffer (a barrier between them, as the graph has), on one control buffer; returns each call's y. */
function chainedCalls(kernels: GgmlExpertKernels, layer: GgmlExpertLayer, calls: { x: Float32Array; r: Routing; none?: number[] }[]): Float32Array[] {
  const { D, I } = layer;
  const maxS = Math.max(...calls.map((c) => c.r.S)), maxSlots = Math.max(...calls.map((c) => c.r.S * c.r.k));
  using control = hostBuffer(device, chainControlWords(maxS));
  u32(control, chainControlWords(maxS)).fill(0);
  using h = hostBuffer(device, maxSlots * I);
  u32(h, maxSlots * I).fill(0x7fc00000); // NaN: a read before the write shows
  using ypair = hostBuffer(device, maxSlots * D);
  using done = hostBuffer(device, 1);
  const owned = new DisposableStack();
  const ys = calls.map(({ x, r, none = [] }) => {
    const slots = r.S * r.k;
    const xb = owned.use(hostBuffer(device, r.S * D, "upload"));
    const work = owned.use(hostBuffer(device, 4 * (1 + slots), "upload"));
    const pairs = owned.use(hostBuffer(device, slots, "upload"));
    const sw = owned.use(hostBuffer(device, slots, "upload"));
    const y = owned.use(hostBuffer(device, r.S * D));
    writeSlotList(x, r, { x: xb, work, pairs, slotWeight: sw }, none);
    return { S: r.S, slots, xb, work, pairs, sw, y, k: r.k };
  });
  try {
    submitAndWait(device, (cb: CommandBuffer) => {
      for (const c of ys) {
        kernels.record(cb, { layer, S: c.S, items: c.slots, slotsPerToken: c.k, x: c.xb, work: c.work, pairs: c.pairs, slotWeight: c.sw, h, ypair, y: c.y, done, control, singleSlotItems: true, itemPerSlot: true });
        cb.barrier("computeToCompute");
      }
    });
    // every call left its counters at zero; ypair and the done word are not the chain's
    expect([...u32(control, chainControlWords(maxS))]).toEqual(new Array(chainControlWords(maxS)).fill(0));
    expect([...u32(ypair, maxSlots * D)].every((v) => v === SENTINEL)).toBe(true);
    expect(u32(done, 1)[0]).toBe(SENTINEL);
    return ys.map((c) => {
      expectTail(c.y, c.S * D, "y");
      return f32(c.y, c.S * D).slice();
    });
  } finally {
    owned.dispose();
  }
}

describe("moe_ggml_chain: gate+up and down with the slots' sum in one dispatch, vs the CPU GEMVs (NMSE <= 1e-9)", () => {
  const cases: { what: string; gu: GgmlBlockType; dn: GgmlBlockType; D: number; I: number; options: GgmlExpertKernelOptions }[] = [
    { what: "Q4_K/Q6_K D 256, I 512, the default shape", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: {} },
    { what: "Q5_0 D 96, I 224, 16 lanes, 3 gate+up rows and 2 down rows a block (partial last blocks), 1 slice ahead, no subgroup arithmetic", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: { workgroupSize: 16, useSubgroup: false, chainShape: { gateUpRows: 3, downRows: 2, prefetch: 1 } } },
    { what: "Q5_K/Q5_K D 768, I 256, 64 lanes (several subgroups), 8 rows and 3 slices ahead", gu: "Q5_K", dn: "Q5_K", D: 768, I: 256, options: { workgroupSize: 64, chainShape: { gateUpRows: 8, downRows: 8, prefetch: 3 } } },
    { what: "Q4_1/Q5_1 D 128, I 96, 32 lanes", gu: "Q4_1", dn: "Q5_1", D: 128, I: 96, options: { workgroupSize: 32 } },
    // gate+up blocks far heavier than down's (8 rows of 2048 columns against one 32-column slice):
    // down blocks start while the last gate+up blocks still run, so without the wait they read h
    // before it is written (this case fails then, even on two CPU threads)
    { what: "Q5_0 D 2048, I 32: gate+up blocks of 8 rows against down blocks of one slice", gu: "Q5_0", dn: "Q5_0", D: 2048, I: 32, options: { chainShape: { gateUpRows: 8, downRows: 1, prefetch: 1 } } },
  ];
  for (const c of cases) {
    test(`${c.what}: S 1 k 1, S 1 k 8, S 4 k 3, S 4 k 8 in one command buffer on one control buffer`, () => {
      using kernels = new GgmlExpertKernels(device, { gateUp: c.gu, down: c.dn }, { ...c.options, chained: true });
      let seed = 3100 + cases.indexOf(c) * 10;
      const experts = randomExperts(E, c.D, c.I, c.gu, c.dn, seed++);
      using layer = new GgmlExpertLayer(device, experts);
      const calls = ([[1, 1], [1, 8], [4, 3], [4, 8]] as const).map(([S, k]) => ({ r: randomRouting(S, k, E, seed++), x: randomGaussianF32(S * c.D, seed++) }));
      const ys = chainedCalls(kernels, layer, calls);
      calls.forEach(({ x, r }, i) => {
        const e = nmse(cpuMoe(experts, x, r, c.D), ys[i]!);
        if (!(e <= 1e-9)) throw new Error(`${c.what}: S=${r.S} k=${r.k}: NMSE ${e}`);
      });
    }, 120_000);
  }

  test("slots with no expert (dec_route's NONE) add nothing; a call without its control words: one clear error", () => {
    using kernels = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { chained: true });
    const experts = randomExperts(E, 256, 512, "Q4_K", "Q6_K", 3500);
    using layer = new GgmlExpertLayer(device, experts);
    const r = randomRouting(2, 3, E, 3501);
    const x = randomGaussianF32(2 * 256, 3502);
    const skipped: Routing = { ...r, weights: r.weights.map((w, i) => (i === 1 || i === 5 ? 0 : w)) };
    const [y] = chainedCalls(kernels, layer, [{ x, r, none: [1, 5] }]);
    expect(nmse(cpuMoe(experts, x, skipped, 256), y!)).toBeLessThanOrEqual(1e-9);
    using b = hostBuffer(device, 64 * 1024, "upload");
    const call = { layer, x: b, work: b, pairs: b, slotWeight: b, h: b, ypair: b, y: b, done: b, itemPerSlot: true, S: 1, items: 2, slotsPerToken: 2 };
    expect(() => submitAndWait(device, (cb) => kernels.record(cb, call))).toThrow(/needs its control words/);
    expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { chained: true, chainShape: { gateUpRows: 9, downRows: 1, prefetch: 4 } })).toThrow(/chainShape.gateUpRows must be an integer in 1..8, got 9/);
  }, 60_000);
});
