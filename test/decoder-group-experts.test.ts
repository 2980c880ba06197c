/**
 * dec_group_experts (src/kernels/decoder/group-experts.ts) on the real driver under the validation
 * layer, against the work list computed on the host: the header (S, k, items, seq), one item per
 * distinct chosen expert in id order with its handle (from a table at a nonzero offset), pairStart
 * and pairCount, each item's slots (as a set: the fill order is free), and slot weight 0 for a slot
 * with no expert (id >= E) while every other weight stays as written. Cases: E 1..512 (past one
 * expert a thread: 2 a thread at 256 threads, 16 at 32), k 1..8, S 1..64, skewed and uniform
 * choices, ids >= E, and a 32-thread workgroup (16 ids a thread). With maxSlots, an expert's slots
 * as runs of at most maxSlots items (1, 3, 8, 64). Sentinels past every output. Negative control (by
 * hand, Lavapipe, 2026-12-06): items of one run each whatever maxSlots fails the maxSlots case.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { groupedItemsMax } from "../src/kernels/decoder/group-experts.ts";
import { GroupExpertsKernel, submitAndWait } from "../src/kernels/decoder/index.ts";
import { mulberry32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
const wide = new GroupExpertsKernel(device);
const narrow = new GroupExpertsKernel(device, { workgroupSize: 32 });
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  wide[Symbol.dispose]();
  narrow[Symbol.dispose]();
  finish(ctx);
});

const TABLE_OFFSET = 3, CHOSEN_OFFSET = 5, SEQ = 77;

/** k distinct ids a token out of E (skewed: low ids more often), a few replaced by ids >= E. */
function choices(rnd: () => number, S: number, k: number, E: number, skewed: boolean, none: number): Uint32Array {
  const chosen = new Uint32Array(S * k);
  for (let t = 0; t < S; t++) {
    const taken = new Set<number>();
    for (let j = 0; j < k; j++) {
      let e: number;
      do e = Math.floor((skewed ? rnd() ** 3 : rnd()) * E); while (taken.has(e));
      taken.add(e);
      chosen[t * k + j] = e;
    }
  }
  for (let i = 0; i < none; i++) chosen[Math.floor(rnd() * S * k)] = E + Math.floor(rnd() * 3) * 1000;
  return chosen;
}

function run(kernel: GroupExpertsKernel, S: number, k: number, E: number, chosen: Uint32Array, label: string, maxSlots = 0): void {
  const slots = S * k, items = groupedItemsMax(S, E, k, maxSlots);
  using chosenBuf = hostBuffer(device, CHOSEN_OFFSET + slots, "upload");
  u32(chosenBuf, slots, CHOSEN_OFFSET).set(chosen);
  using table = hostBuffer(device, 2 * (TABLE_OFFSET + E), "upload");
  const handles = u32(table, 2 * E, 2 * TABLE_OFFSET);
  for (let i = 0; i < 2 * E; i++) handles[i] = (i * 2654435761) >>> 0;
  using work = hostBuffer(device, 4 * (1 + items));
  using pairs = hostBuffer(device, slots);
  using weights = hostBuffer(device, slots);
  const w = f32(weights, slots);
  for (let u = 0; u < slots; u++) w[u] = 1 + u;
  submitAndWait(device, (cb) => kernel.record(cb, { chosen: chosenBuf, table, work, pairs, slotWeight: weights, S, E, k, seq: SEQ, chosenOffset: CHOSEN_OFFSET, tableOffset: TABLE_OFFSET, maxSlots }));
  // the host's list: distinct ids in order, their slots; with maxSlots, an expert's items are runs of at most maxSlots of them
  const bySlot = new Map<number, number[]>();
  for (let u = 0; u < slots; u++) if (chosen[u]! < E) bySlot.set(chosen[u]!, [...(bySlot.get(chosen[u]!) ?? []), u]);
  const ids = [...bySlot.keys()].sort((a, b) => a - b);
  const runs = ids.map((e) => (maxSlots ? Math.ceil(bySlot.get(e)!.length / maxSlots) : 1));
  const total = runs.reduce((a, b) => a + b, 0);
  expect(total, `${label}: items within groupedItemsMax`).toBeLessThanOrEqual(items);
  const header = u32(work, 4);
  expect([...header], `${label}: header`).toEqual([S, k, total, SEQ]);
  const p = u32(pairs, slots);
  let start = 0, i = 0;
  ids.forEach((e, n) => {
    const want = bySlot.get(e)!;
    for (let r = 0; r < runs[n]!; r++, i++) {
      const count = maxSlots ? Math.min(maxSlots, want.length - r * maxSlots) : want.length;
      expect([...u32(work, 4, 4 * (1 + i))], `${label}: item ${i} (expert ${e}, run ${r})`).toEqual([handles[2 * e]!, handles[2 * e + 1]!, start + r * (maxSlots || 0), count]);
    }
    expect([...p.subarray(start, start + want.length)].sort((a, b) => a - b), `${label}: expert ${e}'s slots`).toEqual(want);
    start += want.length;
  });
  for (let u = 0; u < slots; u++) expect(w[u], `${label}: slot ${u}'s weight`).toBe(chosen[u]! < E ? 1 + u : 0);
  expectTail(work, 4 * (1 + items), `${label}: work`);
  expectTail(pairs, slots, `${label}: pairs`);
  expectTail(weights, slots, `${label}: slot weights`);
}

describe("dec_group_experts: the work list by expert, laid out by a prefix sum", () => {
  const cases: [S: number, k: number, E: number, skewed: boolean, none: number][] = [
    [1, 1, 1, false, 0], [1, 8, 8, false, 0], [64, 8, 128, false, 0], [64, 8, 256, true, 3], [64, 8, 512, false, 0],
    [64, 8, 512, true, 0], [37, 3, 257, false, 2], [64, 1, 513 - 1, true, 1], [5, 8, 60, false, 0], [64, 4, 200, true, 5],
  ];
  for (const [name, kernel] of [["256 threads", wide], ["32 threads", narrow]] as const) {
    test(`${name}: ${cases.length} calls (E 1..512, k 1..8, S 1..64, ids >= E): items, slots, weights as the host's list`, () => {
      const rnd = mulberry32(4242);
      for (const [S, k, E, skewed, none] of cases) run(kernel, S, k, E, choices(rnd, S, k, E, skewed, none), `${name} S=${S} k=${k} E=${E}`);
    });
  }

  test("maxSlots: an expert of more slots becomes runs of at most maxSlots items (1, 3, 8, 64), its slots still one contiguous range", () => {
    const rnd = mulberry32(4343);
    for (const maxSlots of [1, 3, 8, 64]) {
      for (const [S, k, E, skewed, none] of [[64, 8, 128, true, 2], [64, 8, 8, false, 0], [37, 3, 40, true, 0], [5, 2, 4, false, 1]] as const) {
        run(wide, S, k, E, choices(rnd, S, k, E, skewed, none), `maxSlots ${maxSlots} S=${S} k=${k} E=${E}`, maxSlots);
      }
    }
    expect(groupedItemsMax(64, 128, 8, 8)).toBe(128 + 64);
    expect(groupedItemsMax(4, 128, 8, 8)).toBe(32);
    expect(() => submitAndWait(device, (cb) => wide.record(cb, { chosen: wide as never, table: wide as never, work: wide as never, pairs: wide as never, slotWeight: wide as never, S: 1, E: 1, k: 1, maxSlots: -1 }))).toThrow(/maxSlots must be a non-negative integer, got -1/);
  });

  test("a workgroup size outside 8..256 or not a power of two: one clear error", () => {
    expect(() => new GroupExpertsKernel(device, { workgroupSize: 48 })).toThrow(InvalidArgumentError);
    expect(() => new GroupExpertsKernel(device, { workgroupSize: 512 })).toThrow(/power of two in 8..256, got 512/);
  });
});
