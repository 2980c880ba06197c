/**
 * moe_ggml (src/moe/ggml-experts.ts, shaders/moe_ggml.comp) + moe_sum on the real driver under the
 * validation layer: the grouped MoE call over routed experts stored as GGML blocks.
 *
 * Against a CPU reference built from the CPU GEMV over the same blocks (gemvGgmlBlocks, f64 sums of
 * GGML's exact weights): y[s] = Σ_j w_sj · down_e(silu(gate_e x_s) ⊙ up_e x_s), h rounded to f32 as
 * the GPU stores it; NMSE ≤ 1e-9. Random blocks with finite f16 scales; format pairs as K-quant files
 * mix them (Q4_K gate/up with Q6_K down, Q5_K/Q5_K, Q5_0/Q5_0, Q4_1/Q5_1); D=256, I=512 and D=512,
 * I=256; E = 8 experts; top-k 2..4; S = 1, 3, 8 (so items hold 1..8 slots, over and under a chunk).
 * Output buffers carry sentinel words past the end, checked after each call.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { GgmlExpertKernels, GgmlExpertLayer, moeRowsPerWorkgroup, writeWorkList } from "../src/moe/ggml-experts.ts";
import { WorkList, type Routing } from "../src/moe/routing.ts";
import type { GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { quantizeGroup } from "../src/quant/intdot.ts";
import { rmsNorm } from "../src/model/ops.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer, SENTINEL, u32 } from "./support/host-buffers.ts";
import { cpuMoe, gpuMoe, randomExperts, randomRouting, randomTensor, writeSlotList } from "./support/moe-ggml-cases.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => finish(ctx));

const PAIRS: [GgmlBlockType, GgmlBlockType][] = [["Q4_K", "Q6_K"], ["Q5_K", "Q5_K"], ["Q5_0", "Q5_0"], ["Q4_1", "Q5_1"]];
const SHAPES: [number, number][] = [[256, 512], [512, 256]];
const E = 8;

describe("moe_ggml: grouped MoE call over GGML block experts vs the CPU GEMVs (NMSE ≤ 1e-9)", () => {
  for (const [gu, dn] of PAIRS) {
    test(`gate/up ${gu}, down ${dn}: D×I 256×512 and 512×256, E = 8, k = 2..4, S = 1, 3, 8`, () => {
      using kernels = new GgmlExpertKernels(device, { gateUp: gu, down: dn });
      let seed = 100 * PAIRS.findIndex(([a, b]) => a === gu && b === dn);
      let worst = 0, cases = 0;
      for (const [D, I] of SHAPES) {
        const experts = randomExperts(E, D, I, gu, dn, seed++);
        using layer = new GgmlExpertLayer(device, experts);
        for (const [S, k] of [[1, 2], [3, 4], [8, 3]] as const) {
          const r = randomRouting(S, k, E, seed++);
          const x = randomGaussianF32(S * D, seed++);
          const e = nmse(cpuMoe(experts, x, r, D), gpuMoe(device, kernels, layer, x, r));
          if (!(e <= 1e-9)) throw new Error(`${gu}/${dn} D=${D} I=${I} S=${S} k=${k}: NMSE ${e}`);
          worst = Math.max(worst, e);
          cases++;
        }
      }
      console.log(`  ${gu}/${dn}: worst NMSE ${worst.toExponential(2)} over ${cases} calls`);
    }, 60_000);
  }
});

describe("other kernel shapes", () => {
  // Each shape is two more pipelines (Lavapipe compiles one in seconds): one format pair.
  test("Q4_K/Q6_K with 32 threads, 3 rows a workgroup (a partial last block), 3 slots a chunk; 16 threads, 1 row, 1 slot", () => {
    let seed = 900;
    for (const options of [{ workgroupSize: 32, rowsPerWorkgroup: 3, tokensPerChunk: 3 }, { workgroupSize: 16, rowsPerWorkgroup: 1, tokensPerChunk: 1 }]) {
      using kernels = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, options);
      const experts = randomExperts(E, 256, 512, "Q4_K", "Q6_K", seed++);
      using layer = new GgmlExpertLayer(device, experts);
      for (const [S, k] of [[1, 4], [8, 2]] as const) {
        const r = randomRouting(S, k, E, seed++);
        const x = randomGaussianF32(S * 256, seed++);
        expect(nmse(cpuMoe(experts, x, r, 256), gpuMoe(device, kernels, layer, x, r))).toBeLessThanOrEqual(1e-9);
      }
    }
  }, 60_000);
});

describe("slice kernel: lanes over a flat (row, slice) list", () => {
  // Rows per workgroup follow the row length (moeRowsPerWorkgroup); each case below is a shape or
  // reduction the defaults of the other tests do not reach.
  const cases: { what: string; gu: GgmlBlockType; dn: GgmlBlockType; D: number; I: number; options: ConstructorParameters<typeof GgmlExpertKernels>[2] }[] = [
    // 3 and 7 slices a row: a lane's slices fall in several rows
    { what: "Q5_0 D 96, I 224 (3 and 7 slices a row), default lanes", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: {} },
    { what: "the same without subgroup arithmetic (shared-memory tree)", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: { useSubgroup: false } },
    // 64 lanes: several subgroups on Lavapipe (8 lanes each), the shared step across them; D 768 = 24 slices
    { what: "Q4_K/Q6_K D 768, I 256, 64 lanes (several subgroups)", gu: "Q4_K", dn: "Q6_K", D: 768, I: 256, options: { workgroupSize: 64 } },
  ];
  for (const c of cases) {
    test(c.what, () => {
      using kernels = new GgmlExpertKernels(device, { gateUp: c.gu, down: c.dn }, c.options);
      let seed = 1300 + cases.indexOf(c) * 10;
      const experts = randomExperts(E, c.D, c.I, c.gu, c.dn, seed++);
      using layer = new GgmlExpertLayer(device, experts);
      for (const [S, k] of [[1, 8], [4, 8], [17, 2]] as const) {
        const r = randomRouting(S, k, E, seed++);
        const x = randomGaussianF32(S * c.D, seed++);
        const want = cpuMoe(experts, x, r, c.D);
        const e = nmse(want, gpuMoe(device, kernels, layer, x, r));
        if (!(e <= 1e-9)) throw new Error(`${c.what}: S=${S} k=${k}: NMSE ${e}`);
        // The 1-slot pipelines (chosen for per-slot lists) on items of several slots: chunks of one
        if (S === 17) expect(nmse(want, gpuMoe(device, kernels, layer, x, r, true))).toBeLessThanOrEqual(1e-9);
      }
    }, 60_000);
  }
  test("rows per workgroup: no idle lane where a row length allows it", () => {
    expect(moeRowsPerWorkgroup(64, 64)).toBe(1);  // D 2048
    expect(moeRowsPerWorkgroup(24, 64)).toBe(8);  // I 768: 192 slices, 3 a lane
    expect(moeRowsPerWorkgroup(16, 64)).toBe(4);  // I 512
    expect(moeRowsPerWorkgroup(7, 8)).toBe(8);
    expect(moeRowsPerWorkgroup(3, 64)).toBe(8);   // 24 of 64 lanes: the best there is
  });
});

describe("prompt chunks' kernel: moe_ggml_rows, a row per lane (lists grouped by expert)", () => {
  // Grouped lists (items < slots) take moe_ggml_rows by default; rowsForGrouped: false keeps them on
  // the slice kernel. Rows 96 and 224 leave the last 64-row workgroup partial; S 40 at k 2 over 8
  // experts puts ~10 slots in an item (a full chunk of 8 and a partial one), S 17 at k 8 ~17.
  const cases: { what: string; gu: GgmlBlockType; dn: GgmlBlockType; D: number; I: number; options: ConstructorParameters<typeof GgmlExpertKernels>[2] }[] = [
    { what: "Q5_0 D 96, I 224 (partial row blocks), default lanes and chunk of 8", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: {} },
    // 3 and 7 slices a row over 4 lanes: lanes with one slice fewer, still in the shuffles
    { what: "Q5_0 D 96, I 224, 4 lanes a row", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: { rowsLanes: 4 } },
    { what: "Q4_K/Q6_K D 256, I 512, a lane a row, chunks of 3 slots", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: { rowsLanes: 1, rowsTokensPerChunk: 3 } },
    { what: "Q4_K/Q6_K D 256, I 512, default lanes", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: {} },
    { what: "Q4_K/Q6_K D 256, I 512 on the slice kernel (rowsForGrouped false)", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: { rowsForGrouped: false } },
  ];
  for (const c of cases) {
    test(`${c.what}: S 40 k 2, S 17 k 8; NMSE <= 1e-9 of the CPU GEMVs`, () => {
      using kernels = new GgmlExpertKernels(device, { gateUp: c.gu, down: c.dn }, c.options);
      let seed = 1700 + cases.indexOf(c) * 10;
      const experts = randomExperts(E, c.D, c.I, c.gu, c.dn, seed++);
      using layer = new GgmlExpertLayer(device, experts);
      let worst = 0;
      for (const [S, k] of [[40, 2], [17, 8]] as const) {
        const r = randomRouting(S, k, E, seed++);
        const x = randomGaussianF32(S * c.D, seed++);
        const e = nmse(cpuMoe(experts, x, r, c.D), gpuMoe(device, kernels, layer, x, r));
        if (!(e <= 1e-9)) throw new Error(`${c.what}: S=${S} k=${k}: NMSE ${e}`);
        worst = Math.max(worst, e);
      }
      console.log(`  ${c.what}: worst NMSE ${worst.toExponential(2)}`);
    }, 60_000);
  }
  test("rowsTokensPerChunk outside 1..8, rowsLanes not 1, 2, 4 or 8: one clear error", () => {
    expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { rowsTokensPerChunk: 9 })).toThrow(/rowsTokensPerChunk must be an integer in 1\.\.8, got 9/);
    expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { rowsLanes: 3 })).toThrow(/rowsLanes must be 1, 2, 4 or 8/);
  });
});

describe("the decode graph's work lists", () => {
  // The graph dispatches a grid of the most items a call can have (dec_group_experts counts them on
  // the device) and dec_route writes NONE (0xFFFFFFFF) as the expert of a slot with NaN logits.
  test("workgroups past the header's item count return; an item with no expert (id >= E) is skipped, its slot weight 0", () => {
    const D = 256, I = 512, S = 3, k = 2;
    using kernels = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" });
    const experts = randomExperts(E, D, I, "Q4_K", "Q6_K", 77);
    using layer = new GgmlExpertLayer(device, experts);
    // tokens sharing experts: 3 items for 6 slots, so the grid (6, the most a call can have) has room past them
    const r: Routing = { S, k, ids: Int32Array.from([0, 1, 1, 0, 0, 2]), weights: Float32Array.from([0.7, 0.3, 0.6, 0.4, 0.9, 0.1]) };
    const x = randomGaussianF32(S * D, 79);
    const list = new WorkList(E, S * k + 1);
    list.build(r, E, false);
    const slots = S * k, grid = slots;
    expect(list.items).toBe(3);
    using xb = hostBuffer(device, S * D, "upload");
    using work = hostBuffer(device, 4 * (1 + grid), "upload");
    using pairs = hostBuffer(device, slots + 1, "upload");
    using sw = hostBuffer(device, slots + 1, "upload");
    using h = hostBuffer(device, (slots + 1) * I);
    using ypair = hostBuffer(device, (slots + 1) * D);
    using y = hostBuffer(device, S * D);
    using done = hostBuffer(device, 1);
    f32(xb, S * D).set(x);
    const w = u32(work, 4 * (1 + grid));
    writeWorkList(list, S, 5, w, u32(pairs, slots), f32(sw, slots));
    // one more item in the header: no expert, over an extra slot of weight 0 (past the S*k summed ones)
    w.set([0xffffffff, 0xffffffff, slots, 1], 4 * (1 + list.items));
    w[2] = list.items + 1;
    u32(pairs, 1, slots)[0] = slots;
    f32(sw, 1, slots)[0] = 0;
    // the grid's remaining entries: stale items (an expert no token chose, over item 2's slot), which
    // only a workgroup past the count would run, overwriting that slot's h and ypair rows
    for (let u = list.items + 1; u < grid; u++) w.set([3, 0, list.pairStart[2]!, 1], 4 * (1 + u));
    submitAndWait(device, (cb) => kernels.record(cb, { layer, S, items: grid, slotsPerToken: k, x: xb, work, pairs, slotWeight: sw, h, ypair, y, done }));
    expect(nmse(cpuMoe(experts, x, r, D), f32(y, S * D).slice())).toBeLessThanOrEqual(1e-9);
    // the skipped item's h and ypair rows were not written (still SENTINEL), nor anything past them
    expect([...u32(h, I, slots * I)].every((v) => v === SENTINEL)).toBe(true);
    expect([...u32(ypair, D, slots * D)].every((v) => v === SENTINEL)).toBe(true);
    for (const [b, n, what] of [[h, (slots + 1) * I, "h"], [ypair, (slots + 1) * D, "ypair"], [y, S * D, "y"]] as const) expectTail(b, n, what);
  }, 60_000);
});

/** The call on dec_route's list (item u = slot u, one slot each; `none`: slots given no expert), down summing each token's slots (itemPerSlot). */
function gpuMoeItemPerSlot(kernels: GgmlExpertKernels, layer: GgmlExpertLayer, x: Float32Array, r: Routing, none: number[] = []): Float32Array {
  const { D, I } = layer, slots = r.S * r.k;
  using xb = hostBuffer(device, r.S * D, "upload");
  using work = hostBuffer(device, 4 * (1 + slots), "upload");
  using pairs = hostBuffer(device, slots, "upload");
  using sw = hostBuffer(device, slots, "upload");
  using h = hostBuffer(device, slots * I);
  using ypair = hostBuffer(device, slots * D);
  using y = hostBuffer(device, r.S * D);
  using done = hostBuffer(device, 1);
  writeSlotList(x, r, { x: xb, work, pairs, slotWeight: sw }, none);
  submitAndWait(device, (cb) => kernels.record(cb, { layer, S: r.S, items: slots, slotsPerToken: r.k, x: xb, work, pairs, slotWeight: sw, h, ypair, y, done, singleSlotItems: true, itemPerSlot: true }));
  expectTail(y, r.S * D, "y");
  // down wrote y itself: ypair and the done word untouched
  expect([...u32(ypair, slots * D)].every((v) => v === SENTINEL)).toBe(true);
  expect(u32(done, 1)[0]).toBe(SENTINEL);
  return f32(y, r.S * D).slice();
}

describe("down with the slots' sum (the decode graph: dec_route's list, item u = slot u)", () => {
  const cases: { what: string; gu: GgmlBlockType; dn: GgmlBlockType; D: number; I: number; options: ConstructorParameters<typeof GgmlExpertKernels>[2] }[] = [
    { what: "Q4_K/Q6_K D 256, I 512, default lanes", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: {} },
    { what: "Q5_0 D 96, I 224 (7 slices a row), 16 lanes, 3 rows a workgroup (a partial last block), no subgroup arithmetic", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: { workgroupSize: 16, rowsPerWorkgroup: 3, useSubgroup: false } },
    { what: "Q4_K/Q6_K D 768, I 256, 64 lanes (several subgroups)", gu: "Q4_K", dn: "Q6_K", D: 768, I: 256, options: { workgroupSize: 64 } },
  ];
  for (const c of cases) {
    test(`${c.what}: k 1, 3, 8; S 1, 4; NMSE <= 1e-9 of the CPU GEMVs`, () => {
      using kernels = new GgmlExpertKernels(device, { gateUp: c.gu, down: c.dn }, c.options);
      let seed = 2100 + cases.indexOf(c) * 10;
      const experts = randomExperts(E, c.D, c.I, c.gu, c.dn, seed++);
      using layer = new GgmlExpertLayer(device, experts);
      for (const [S, k] of [[1, 1], [1, 8], [4, 3], [4, 8]] as const) {
        const r = randomRouting(S, k, E, seed++);
        const x = randomGaussianF32(S * c.D, seed++);
        const e = nmse(cpuMoe(experts, x, r, c.D), gpuMoeItemPerSlot(kernels, layer, x, r));
        if (!(e <= 1e-9)) throw new Error(`${c.what}: S=${S} k=${k}: NMSE ${e}`);
      }
    }, 60_000);
  }

  test("a slot with no expert (dec_route's NONE) adds nothing; more than 8 slots a token or a list of another length: one clear error", () => {
    using kernels = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" });
    const experts = randomExperts(E, 256, 512, "Q4_K", "Q6_K", 2500);
    using layer = new GgmlExpertLayer(device, experts);
    const r = randomRouting(2, 3, E, 2501);
    const x = randomGaussianF32(2 * 256, 2502);
    const skipped: Routing = { ...r, weights: r.weights.map((w, i) => (i === 1 || i === 5 ? 0 : w)) };
    expect(nmse(cpuMoe(experts, x, skipped, 256), gpuMoeItemPerSlot(kernels, layer, x, r, [1, 5]))).toBeLessThanOrEqual(1e-9);
    using b = hostBuffer(device, 64 * 1024, "upload");
    const call = { layer, x: b, work: b, pairs: b, slotWeight: b, h: b, ypair: b, y: b, done: b, itemPerSlot: true };
    expect(() => submitAndWait(device, (cb) => kernels.record(cb, { ...call, S: 1, items: 9, slotsPerToken: 9 }))).toThrow(/up to 8 slots a token/);
    expect(() => submitAndWait(device, (cb) => kernels.record(cb, { ...call, S: 2, items: 3, slotsPerToken: 2 }))).toThrow(/an item per slot has 4 items, got 3/);
  }, 60_000);
});

/**
 * Calls of down with the slots' sum and the norm tail (NORM_TAIL) in one command buffer on one
 * arrival word (a barrier between them, as the graph has); each call's y, and its residual, xn and
 * quantized xn after it.
 */
function normTailCalls(kernels: GgmlExpertKernels, layer: GgmlExpertLayer, calls: { x: Float32Array; r: Routing; res: Float32Array; w: Float32Array; wOffset: number; quantize: boolean }[]) {
  const { D, I } = layer;
  const owned = new DisposableStack();
  try {
    using control = hostBuffer(device, 1);
    u32(control, 1)[0] = 0;
    const made = calls.map((c) => {
      const slots = c.r.S * c.r.k, S = c.r.S;
      const b = (words: number, memory?: "upload") => owned.use(hostBuffer(device, words, memory));
      const xb = b(S * D, "upload"), work = b(4 * (1 + slots), "upload"), pairs = b(slots, "upload"), sw = b(slots, "upload");
      const h = b(slots * I), ypair = b(slots * D), y = b(S * D), done = b(1);
      const residual = b(S * D), weights = b(c.wOffset + D, "upload"), xn = b(S * D);
      const xq = b((S * D) / 4), xscale = b(S * D / 16), xsum = b(S * D / 16);
      writeSlotList(c.x, c.r, { x: xb, work, pairs, slotWeight: sw });
      f32(residual, S * D).set(c.res);
      f32(weights, c.wOffset + D).set(c.w, c.wOffset);
      return { c, S, slots, xb, work, pairs, sw, h, ypair, y, done, residual, weights, xn, xq, xscale, xsum };
    });
    submitAndWait(device, (cb) => {
      for (const m of made) {
        const normTail = { residual: m.residual, weights: m.weights, wOffset: m.c.wOffset, eps: 1e-6, xn: m.xn, ...(m.c.quantize && { quantized: { xq: m.xq, xscale: m.xscale, xsum: m.xsum } }) };
        kernels.record(cb, { layer, S: m.S, items: m.slots, slotsPerToken: m.c.r.k, x: m.xb, work: m.work, pairs: m.pairs, slotWeight: m.sw, h: m.h, ypair: m.ypair, y: m.y, done: m.done, control, singleSlotItems: true, itemPerSlot: true, normTail });
        cb.barrier("computeToCompute");
      }
    });
    // every call left the arrival word at zero
    expect(u32(control, 1)[0]).toBe(0);
    return made.map((m) => {
      const n = m.S * D;
      for (const [b, words, what] of [[m.y, n, "y"], [m.residual, n, "residual"], [m.xn, n, "xn"], [m.xq, n / 4, "xq"], [m.xscale, n / 16, "xscale"], [m.xsum, n / 16, "xsum"]] as const) expectTail(b, words, what);
      return {
        y: f32(m.y, n).slice(), residual: f32(m.residual, n).slice(), xn: f32(m.xn, n).slice(),
        xq: new Int8Array(u32(m.xq, n / 4).slice().buffer), xscale: f32(m.xscale, n / 16).slice(), xsum: new Int32Array(u32(m.xsum, n / 16).slice().buffer),
      };
    });
  } finally {
    owned.dispose();
  }
}

describe("down with the slots' sum and the next layer's input norm in its last workgroup (NORM_TAIL)", () => {
  const ulps = (ref: number, got: number) => Math.abs(ref - got) / 2 ** (Math.floor(Math.log2(Math.max(Math.abs(ref), 2 ** -126))) - 23);
  const cases: { what: string; gu: GgmlBlockType; dn: GgmlBlockType; D: number; I: number; options: ConstructorParameters<typeof GgmlExpertKernels>[2] }[] = [
    { what: "Q4_K/Q6_K D 256, I 512, default lanes", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: {} },
    { what: "Q5_0 D 96, I 224, 16 lanes, 3 rows a workgroup (a partial last block), no subgroup arithmetic", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: { workgroupSize: 16, rowsPerWorkgroup: 3, useSubgroup: false } },
    { what: "Q4_K/Q6_K D 2048, I 256, 64 lanes: 2048 workgroups count themselves", gu: "Q4_K", dn: "Q6_K", D: 2048, I: 256, options: { workgroupSize: 64 } },
  ];
  for (const c of cases) {
    test(`${c.what}: S 1, 4, 1 (k 8, 3, 1), quantized and not, on one arrival word: y NMSE <= 1e-9 of the CPU GEMVs; residual + y exact; xn within 8 ulps of rmsNorm; xq as quantize_act from xn`, () => {
      using kernels = new GgmlExpertKernels(device, { gateUp: c.gu, down: c.dn }, { ...c.options, normTail: true });
      let seed = 2700 + cases.indexOf(c) * 10;
      const experts = randomExperts(E, c.D, c.I, c.gu, c.dn, seed++);
      using layer = new GgmlExpertLayer(device, experts);
      const calls = ([[1, 8, true], [4, 3, false], [1, 1, true]] as const).map(([S, k, quantize]) => ({
        r: randomRouting(S, k, E, seed++), x: randomGaussianF32(S * c.D, seed++), res: randomGaussianF32(S * c.D, seed++), w: randomGaussianF32(c.D, seed++), wOffset: 4 * (seed % 3), quantize,
      }));
      const outs = normTailCalls(kernels, layer, calls);
      calls.forEach((call, i) => {
        const o = outs[i]!, S = call.r.S, n = S * c.D;
        const e = nmse(cpuMoe(experts, call.x, call.r, c.D), o.y);
        if (!(e <= 1e-9)) throw new Error(`${c.what}: call ${i}: y NMSE ${e}`);
        const res = new Float32Array(n);
        for (let j = 0; j < n; j++) res[j] = call.res[j]! + o.y[j]!;
        expect(o.residual).toEqual(res);
        const xn = new Float32Array(n);
        rmsNorm(res, call.w, c.D, S, 1e-6, xn);
        let worst = 0;
        for (let j = 0; j < n; j++) worst = Math.max(worst, ulps(xn[j]!, o.xn[j]!));
        if (!(worst <= 8)) throw new Error(`${c.what}: call ${i}: xn ${worst} ulps from rmsNorm`);
        if (!call.quantize) {
          expect([...new Uint32Array(o.xscale.buffer)].every((v) => v === SENTINEL)).toBe(true);
          return;
        }
        // quantize_act's rule (groups of 16) from the xn the GPU wrote
        const q = new Int8Array(n), scale: number[] = [], sum: number[] = [];
        for (let g = 0; g < n / 16; g++) {
          const r = quantizeGroup(o.xn, 16 * g, 16 * g + 16, q, 16 * g);
          scale.push(r.scale);
          sum.push(r.sum);
        }
        expect([...o.xq]).toEqual([...q]);
        expect([...o.xscale]).toEqual(scale);
        expect([...o.xsum]).toEqual(sum);
      });
    }, 120_000);
  }

  test("a call with the tail but no arrival word: one clear error", () => {
    using kernels = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { normTail: true });
    const experts = randomExperts(E, 256, 512, "Q4_K", "Q6_K", 2800);
    using layer = new GgmlExpertLayer(device, experts);
    using b = hostBuffer(device, 64 * 1024, "upload");
    const call = { layer, x: b, work: b, pairs: b, slotWeight: b, h: b, ypair: b, y: b, done: b, itemPerSlot: true, S: 1, items: 2, slotsPerToken: 2, normTail: { residual: b, weights: b, wOffset: 0, eps: 1e-6, xn: b } };
    expect(() => submitAndWait(device, (cb) => kernels.record(cb, call))).toThrow(/needs its arrival word/);
    expect(() => submitAndWait(device, (cb) => kernels.record(cb, { ...call, control: b, normTail: { ...call.normTail, wOffset: 2 } }))).toThrow(/wOffset 2/);
  }, 60_000);
});

describe("argument checks", () => {
  test("experts of mixed shapes or types, a layer on kernels of other formats", () => {
    const rand = mulberry32(3);
    const a = { gate: randomTensor("Q4_K", 256, 256, rand), up: randomTensor("Q4_K", 256, 256, rand), down: randomTensor("Q6_K", 256, 256, rand) };
    expect(() => new GgmlExpertLayer(device, [a, { ...a, down: randomTensor("Q4_K", 256, 256, rand) }])).toThrow(/expert 1 down/);
    expect(() => new GgmlExpertLayer(device, [])).toThrow(/at least one/);
    expect(() => new GgmlExpertKernels(device, { gateUp: "Q2_K" as GgmlBlockType, down: "Q6_K" })).toThrow(/Q2_K/);
  });
});
