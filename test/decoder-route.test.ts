/**
 * dec_route (src/kernels/decoder/route.ts) on the real driver, under the validation layer, against
 * src/model/ops.ts routeTopK: expert ids exact, weights within 1e-5 relative, and the MoE layer's
 * tables it writes (work list header and items, pairs, slot experts from a table of random
 * handles at a nonzero offset). Random logits are drawn so that the k + 1 largest of each token
 * are at least 1e-4 apart (no near-ties an f32 softmax could reorder); exact ties are tested
 * separately, as are rows of small integer logits (many exact ties, inside and across threads'
 * groups of experts). Every kernel variant runs: 128 and 16 threads (one expert per thread up to
 * E = 128 / 16, else stage 2's candidates), softmax reductions with and without subgroup ops.
 * Every output buffer carries sentinel words past its end, checked after each run.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { ROUTE_MAX_S, RouteKernel, submitAndWait, type RouteArgs } from "../src/kernels/decoder/index.ts";
import { routeTopK } from "../src/model/ops.ts";
import { randomGaussianF32, randomWords } from "../src/quant/random.ts";
import { CommandPool } from "../src/vk/commands.ts";
import { Buffer, type MemoryUse } from "../src/vk/memory.ts";
import { Fence, Submission } from "../src/vk/sync.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer as deviceHostBuffer, SENTINEL, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
const route = new RouteKernel(device);
const route16 = new RouteKernel(device, { workgroupSize: 16 }); // 32 experts per thread at E = 512
const routeShared = new RouteKernel(device, { useSubgroup: false }); // softmax max and sum through shared memory only
const route16Shared = new RouteKernel(device, { workgroupSize: 16, useSubgroup: false });
const KERNELS = [["128 threads", route], ["16 threads", route16], ["128 threads, no subgroup ops", routeShared], ["16 threads, no subgroup ops", route16Shared]] as const;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const [, kernel] of KERNELS) kernel[Symbol.dispose]();
  finish(ctx);
});

let seed = 1234;
const hostBuffer = (words: number, memory?: MemoryUse) => deviceHostBuffer(device, words, memory);
const WEIGHT_TOL = 1e-5;

interface Reference {
  ids: Int32Array;
  weights: Float32Array;
}

function reference(logits: Float32Array, S: number, E: number, k: number, normalize: boolean, logitsOffset = 0): Reference {
  const ids = new Int32Array(S * k), weights = new Float32Array(S * k), probs = new Float64Array(E);
  for (let t = 0; t < S; t++) routeTopK(logits.subarray(logitsOffset + t * E, logitsOffset + (t + 1) * E), E, k, normalize, probs, ids, weights, t * k);
  return { ids, weights };
}

/**
 * Throws unless every id matches exactly and every weight is within `tol` relative of the
 * reference (a zero reference weight must be exactly 0); returns the worst relative error.
 */
function compareRouting(ref: Reference, ids: ArrayLike<number>, weights: ArrayLike<number>, tol: number, what: string): number {
  if (ids.length !== ref.ids.length || weights.length !== ref.weights.length) throw new Error(`${what}: ${ids.length} ids / ${weights.length} weights, want ${ref.ids.length}`);
  let worst = 0;
  for (let u = 0; u < ref.ids.length; u++) {
    if (ids[u] !== ref.ids[u]) throw new Error(`${what}: slot ${u}: expert ${ids[u]}, want ${ref.ids[u]}`);
    const want = ref.weights[u]!, got = weights[u]!;
    const rel = want === 0 ? (got === 0 ? 0 : Infinity) : Math.abs(got - want) / Math.abs(want);
    if (!(rel <= tol)) throw new Error(`${what}: slot ${u}: weight ${got}, want ${want} (relative error ${rel})`);
    worst = Math.max(worst, rel);
  }
  return worst;
}

/** Row-major [S][E] logits, std 2, redrawn per token until its k + 1 largest are >= 1e-4 apart. */
function separatedLogits(S: number, E: number, k: number): Float32Array {
  const x = new Float32Array(S * E);
  for (let t = 0; t < S; t++) {
    for (;;) {
      const row = randomGaussianF32(E, seed++, 2);
      const top = Array.from(row).sort((a, b) => b - a).slice(0, Math.min(k + 1, E));
      if (top.every((v, i) => i === 0 || top[i - 1]! - v >= 1e-4)) {
        x.set(row, t * E);
        break;
      }
    }
  }
  return x;
}

interface RunOptions {
  normalize: boolean;
  logitsOffset?: number;
  tableOffset?: number;
  chosenOffset?: number;
  seq?: number;
  kernel?: RouteKernel;
}

interface RunResult extends Reference {
  handles: Uint32Array;
  worst: number;
}

interface Dispatched {
  ids: Uint32Array;
  weights: Float32Array;
  handles: Uint32Array;
  header: Uint32Array;
  /** 4 words per slot. */
  items: Uint32Array;
  pairs: Uint32Array;
  /** 2 words per slot. */
  slotExpert: Uint32Array;
}

/**
 * One dispatch on fresh sentinel-filled buffers (a table of random handles); checks that nothing
 * but the S*k slots (and the work header) was written, the table untouched. Returns copies of the outputs.
 */
function dispatchRoute(logits: Float32Array, S: number, E: number, k: number, o: RunOptions): Dispatched {
  const logitsOffset = o.logitsOffset ?? 0, tableOffset = o.tableOffset ?? 0, chosenOffset = o.chosenOffset ?? 0, seq = o.seq ?? 0;
  const kernel = o.kernel ?? route;
  const slots = S * k;
  const handles = randomWords(2 * (tableOffset + E + 3), seed++); // words around the layer's rows too
  using lb = hostBuffer(logits.length, "upload");
  using tb = hostBuffer(handles.length, "upload");
  using work = hostBuffer(4 * (1 + slots));
  using pairs = hostBuffer(slots);
  using sw = hostBuffer(slots);
  using se = hostBuffer(2 * slots);
  using chosen = hostBuffer(chosenOffset + slots);
  f32(lb, logits.length).set(logits);
  u32(tb, handles.length).set(handles);
  submitAndWait(device, (cb) => kernel.record(cb, { logits: lb, table: tb, work, pairs, slotWeight: sw, slotExpert: se, chosen, S, E, k, normalize: o.normalize, seq, logitsOffset, tableOffset, chosenOffset }));
  expect(Array.from(u32(chosen, chosenOffset))).toEqual(new Array(chosenOffset).fill(SENTINEL));
  expectTail(work, 4 * (1 + slots), "work");
  expectTail(pairs, slots, "pairs");
  expectTail(sw, slots, "slotWeight");
  expectTail(se, 2 * slots, "slotExpert");
  expectTail(chosen, chosenOffset + slots, "chosen");
  expect(Array.from(u32(tb, handles.length))).toEqual(Array.from(handles));
  return {
    ids: u32(chosen, slots, chosenOffset).slice(), weights: f32(sw, slots).slice(), handles, header: u32(work, 4).slice(),
    items: u32(work, 4 * slots, 4).slice(), pairs: u32(pairs, slots).slice(), slotExpert: u32(se, 2 * slots).slice(),
  };
}

/**
 * dispatchRoute, then checks everything it wrote against the reference: ids exact, weights
 * within WEIGHT_TOL, the header, and every slot's work item, pair and expert handle.
 */
function runRoute(logits: Float32Array, S: number, E: number, k: number, o: RunOptions, what: string, ref = reference(logits, S, E, k, o.normalize, o.logitsOffset ?? 0)): RunResult {
  const tableOffset = o.tableOffset ?? 0, seq = o.seq ?? 0;
  const slots = S * k;
  const d = dispatchRoute(logits, S, E, k, o);
  const ids = Int32Array.from(d.ids), weights = d.weights, handles = d.handles;
  const worst = compareRouting(ref, ids, weights, WEIGHT_TOL, what);
  expect({ what, header: Array.from(d.header) }).toEqual({ what, header: [S, k, slots, seq] });
  for (let u = 0; u < slots; u++) {
    const hx = handles[2 * (tableOffset + ids[u]!)]!, hy = handles[2 * (tableOffset + ids[u]!) + 1]!;
    const item = Array.from(d.items.subarray(4 * u, 4 * u + 4)), slotExpert = [d.slotExpert[2 * u]!, d.slotExpert[2 * u + 1]!];
    if (item.join() !== [hx, hy, u, 1].join() || slotExpert.join() !== [hx, hy].join() || d.pairs[u] !== u) {
      throw new Error(`${what}: slot ${u} (expert ${ids[u]}): item [${item}], slotExpert [${slotExpert}], pair ${d.pairs[u]}; want [${hx},${hy},${u},1], [${hx},${hy}], ${u}`);
    }
  }
  return { ids, weights, handles, worst };
}

// ---------------------------------------------------------------------------------------------
describe("dec_route vs ops.ts routeTopK (ids exact, weights within 1e-5 relative, tables checked)", () => {
  const cases: [number, number, number][] = [[8, 2, 1], [60, 4, 3], [128, 8, 1], [128, 8, 17], [256, 8, 64], [512, 16, 5], [7, 7, 2], [512, 1, 64], [1, 1, 3], [33, 16, 4]]; // [E, k, S]
  test("the subgroup path is the default where the device has subgroup arithmetic", () => {
    expect([route.useSubgroup, route16.useSubgroup, routeShared.useSubgroup]).toEqual([device.info.subgroup.arithmetic, device.info.subgroup.arithmetic, false]);
    expect([route.workgroupSize, route16.workgroupSize]).toEqual([128, 16]);
  });
  for (const [name, kernel] of KERNELS) {
    for (const normalize of [true, false]) {
      test(`${name}, normalize ${normalize}: (E, k, S) = ${cases.map((c) => `(${c.join(",")})`).join(" ")}`, () => {
        let worst = 0, n = 0;
        for (const [E, k, S] of cases) {
          const logitsOffset = 3 + (seed % 13), tableOffset = 5 + (seed % 7), chosenOffset = 2 + (seed % 5);
          const body = separatedLogits(S, E, k);
          const logits = new Float32Array(logitsOffset + S * E + 3).fill(1e6); // huge values around the rows: must not be read
          logits.set(body, logitsOffset);
          const seq = (seed * 2654435761) >>> 0;
          const r = runRoute(logits, S, E, k, { normalize, logitsOffset, tableOffset, chosenOffset, seq, kernel }, `E=${E} k=${k} S=${S}`);
          worst = Math.max(worst, r.worst);
          n += S * k;
          if (normalize) for (let t = 0; t < S; t++) expect(Math.abs(r.weights.subarray(t * k, (t + 1) * k).reduce((a, b) => a + b, 0) - 1)).toBeLessThan(1e-5);
        }
        console.log(`  dec_route ${name} normalize=${normalize}: ${n} slots, worst weight relative error ${worst.toExponential(2)}`);
      }, 60_000);
    }
  }
});

describe("dec_route ties and edge values", () => {
  test("exact ties: the lowest ids first, within and across the k boundary, across and within threads", () => {
    const E = 64, k = 8;
    const rows: Float32Array[] = [];
    rows.push(new Float32Array(E).fill(0.5)); // all equal: ids 0..7
    const a = randomGaussianF32(E, seed++, 0.2); // below 1.0
    for (const e of [40, 10, 50]) a[e] = 2;
    for (const e of [5, 63, 20, 33, 1, 2]) a[e] = 1.5; // 3 + 6 ties straddle k: 10, 40, 50, 1, 2, 5, 20, 33
    rows.push(a);
    const b = randomGaussianF32(E, seed++, 0.2);
    for (const e of [48, 16, 32, 0]) b[e] = 3; // with 16 threads all four are thread 0's; with 128 each its own
    rows.push(b);
    const logits = new Float32Array(rows.length * E);
    rows.forEach((r, t) => logits.set(r, t * E));
    for (const [name, kernel] of KERNELS) {
      for (const normalize of [true, false]) {
        const r = runRoute(logits, rows.length, E, k, { normalize, kernel, tableOffset: 1 }, `ties, ${name}, normalize=${normalize}`);
        expect(Array.from(r.ids.subarray(0, k))).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
        expect(Array.from(r.ids.subarray(k, 2 * k))).toEqual([10, 40, 50, 1, 2, 5, 20, 33]);
        expect(Array.from(r.ids.subarray(2 * k, 2 * k + 4))).toEqual([0, 16, 32, 48]);
        if (normalize) expect(Array.from(r.weights.subarray(0, k))).toEqual(new Array(k).fill(1 / 8));
      }
    }
  }, 60_000);

  test("small integer logits (exact ties everywhere): ids and weights as routeTopK, every kernel, E 2..512", () => {
    // values from a few levels, so each token's top k has runs of equal probabilities that cross
    // group boundaries (PER = ceil(E / threads) contiguous experts per thread) and the k boundary
    const cases: [number, number, number, number][] = [[2, 1, 3, 2], [16, 16, 2, 3], [17, 16, 3, 2], [48, 8, 4, 3], [64, 16, 3, 4], [100, 10, 5, 3], [129, 8, 3, 5], [255, 16, 4, 4], [300, 10, 2, 6], [512, 10, 4, 3], [512, 16, 2, 2]]; // [E, k, S, levels]
    let rng = seed++;
    const next = () => (rng = (Math.imul(rng, 1103515245) + 12345) >>> 0) / 2 ** 32;
    for (const [E, k, S, levels] of cases) {
      const logits = new Float32Array(S * E);
      for (let i = 0; i < logits.length; i++) logits[i] = Math.floor(next() * levels) - 1;
      for (let e = 0; e < E; e += 7) logits[e] = levels - 1; // a tie of the largest value at a stride across groups
      for (const [name, kernel] of KERNELS) {
        for (const normalize of [true, false]) runRoute(logits, S, E, k, { normalize, kernel, tableOffset: 2, chosenOffset: 1 }, `integer ties E=${E} k=${k} S=${S}, ${name}, normalize=${normalize}`);
      }
    }
  }, 60_000);

  test("NaN logits: no read outside the table; ids 0xFFFFFFFF where nothing compares, else distinct non-NaN experts", () => {
    const E = 40, k = 8, S = 3;
    const logits = separatedLogits(S, E, k);
    logits.fill(NaN, 0, E); // token 0: every logit NaN: every slot NONE
    for (let e = 0; e < E; e++) if (e % 8 !== 3) logits[E + e] = NaN; // token 1: 5 finite logits, k = 8
    logits[2 * E + 11] = NaN; // token 2: one NaN
    const NONE = 0xffffffff;
    for (const [name, kernel] of KERNELS) {
      for (const normalize of [true, false]) {
        const what = `NaN, ${name}, normalize=${normalize}`;
        const o = dispatchRoute(logits, S, E, k, { normalize, kernel, tableOffset: 3 });
        const ids = Array.from(o.ids);
        expect({ what, ids: ids.slice(0, k) }).toEqual({ what, ids: new Array(k).fill(NONE) });
        for (let t = 1; t < S; t++) {
          const row = ids.slice(t * k, (t + 1) * k), real = row.filter((id) => id !== NONE);
          expect({ what, t, distinct: new Set(real).size === real.length, finite: real.every((id) => id < E && !Number.isNaN(logits[t * E + id]!)) }).toEqual({ what, t, distinct: true, finite: true });
          if (t === 1) expect({ what, real: real.length }).toEqual({ what, real: real.length === 0 ? 0 : 5 }); // max NaN or not: none or all five
        }
        for (let u = 0; u < S * k; u++) {
          const want = ids[u] === NONE ? [NONE, NONE] : [o.handles[2 * (3 + ids[u]!)]!, o.handles[2 * (3 + ids[u]!) + 1]!];
          expect({ what, u, slotExpert: Array.from(o.slotExpert.subarray(2 * u, 2 * u + 2)), item: Array.from(o.items.subarray(4 * u, 4 * u + 4)) })
            .toEqual({ what, u, slotExpert: want, item: [...want, u, 1] });
        }
      }
    }
  }, 60_000);

  test("k = E (every expert, by probability); -Infinity logits: probability 0, chosen last by id", () => {
    runRoute(separatedLogits(3, 7, 7), 3, 7, 7, { normalize: false }, "k = E = 7");
    const x = new Float32Array(8).fill(-Infinity);
    x[6] = 1;
    x[3] = 2;
    const y = new Float32Array(200).fill(-Infinity); // E > 128: stage 2 with every kernel
    for (const e of [150, 7, 64]) y[e] = e / 100;
    for (const [name, kernel] of KERNELS) {
      for (const normalize of [true, false]) {
        const r = runRoute(x, 1, 8, 4, { normalize, kernel }, `-Infinity, ${name}, normalize=${normalize}`);
        expect(Array.from(r.ids)).toEqual([3, 6, 0, 1]);
        expect(Array.from(r.weights.subarray(2))).toEqual([0, 0]);
        const r2 = runRoute(y, 1, 200, 6, { normalize, kernel }, `-Infinity E=200, ${name}, normalize=${normalize}`);
        expect(Array.from(r2.ids)).toEqual([150, 64, 7, 0, 1, 2]);
      }
    }
  }, 60_000);
});

describe("dec_route negative controls and argument checks", () => {
  test("the comparison catches a wrong id, a 2e-5 weight error, the wrong normalization, and a swapped pair", () => {
    const S = 4, E = 60, k = 4;
    const logits = separatedLogits(S, E, k);
    const ref = reference(logits, S, E, k, true);
    const r = runRoute(logits, S, E, k, { normalize: true }, "control");
    expect(compareRouting(ref, r.ids, r.weights, WEIGHT_TOL, "unperturbed")).toBeLessThanOrEqual(WEIGHT_TOL);
    const ids = r.ids.slice();
    ids[5] = (ids[5]! + 1) % E;
    expect(() => compareRouting(ref, ids, r.weights, WEIGHT_TOL, "wrong id")).toThrow(/slot 5: expert/);
    const w = r.weights.slice();
    w[6] = w[6]! * (1 + 2e-5);
    expect(() => compareRouting(ref, r.ids, w, WEIGHT_TOL, "weight")).toThrow(/slot 6: weight/);
    const unnormalized = reference(logits, S, E, k, false);
    expect(() => compareRouting(unnormalized, r.ids, r.weights, WEIGHT_TOL, "normalization")).toThrow(/weight/);
    const swapped = r.ids.slice(), sw = r.weights.slice();
    [swapped[0], swapped[1]] = [swapped[1]!, swapped[0]!];
    [sw[0], sw[1]] = [sw[1]!, sw[0]!];
    expect(() => compareRouting(ref, swapped, sw, WEIGHT_TOL, "order")).toThrow(/slot 0: expert/);
    // and runRoute itself fails when handed a wrong reference (here: the other normalization)
    expect(() => runRoute(logits, S, E, k, { normalize: true }, "wrong reference", unnormalized)).toThrow(/weight/);
  }, 60_000);

  test("invalid arguments throw InvalidArgumentError naming the value; nothing is recorded", () => {
    const S = 2, E = 16, k = 4, slots = S * k;
    using logits = hostBuffer(S * E, "upload");
    using table = hostBuffer(2 * E, "upload");
    using work = hostBuffer(4 * (1 + slots));
    using pairs = hostBuffer(slots);
    using sw = hostBuffer(slots);
    using se = hostBuffer(2 * slots);
    using chosen = hostBuffer(slots);
    using tiny = new Buffer(device, { size: 4n, memory: "readback" });
    const base: RouteArgs = { logits, table, work, pairs, slotWeight: sw, slotExpert: se, chosen, S, E, k, normalize: true };
    const bad: [Partial<RouteArgs> | Record<string, unknown>, RegExp][] = [
      [{ S: 0 }, /^S must/], [{ S: ROUTE_MAX_S + 1 }, /^S must/], [{ S: 1.5 }, /^S must/],
      [{ E: 0 }, /^E must/], [{ E: 513 }, /^E must/],
      [{ k: 0 }, /^k must/], [{ k: 17, E: 16 }, /^k must/], [{ k: 5, E: 4 }, /^k must.*E = 4/], [{ k: 2.5 }, /^k must/],
      [{ normalize: 1 }, /^normalize must/],
      [{ seq: 2 ** 32 }, /^seq must/], [{ seq: -1 }, /^seq must/],
      [{ logitsOffset: -1 }, /^logitsOffset must/], [{ logitsOffset: 0.5 }, /^logitsOffset must/], [{ tableOffset: NaN }, /^tableOffset must/], [{ chosenOffset: -2 }, /^chosenOffset must/],
      [{ logitsOffset: 17 }, /route logits/], [{ tableOffset: 9 }, /route table/], [{ chosenOffset: 17 }, /route chosen/], [{ S: 4 }, /route logits/], // 16 sentinel words past each
      [{ logits: tiny }, /route logits/], [{ table: tiny }, /route table/], [{ work: tiny }, /route work/], [{ pairs: tiny }, /route pairs/],
      [{ slotWeight: tiny }, /route slotWeight/], [{ slotExpert: tiny }, /route slotExpert/], [{ chosen: tiny }, /route chosen/],
      [{ pairs: work }, /distinct/], [{ slotExpert: sw }, /distinct/],
    ];
    submitAndWait(device, (cb) => {
      for (const [patch, message] of bad) {
        const args = { ...base, ...patch } as RouteArgs;
        let caught: unknown;
        try {
          route.record(cb, args);
        } catch (e) {
          caught = e;
        }
        expect({ patch: Object.keys(patch), isArgError: caught instanceof InvalidArgumentError }).toEqual({ patch: Object.keys(patch), isArgError: true });
        expect((caught as Error).message).toMatch(message);
      }
    });
    // the work list was never written (every record above threw before dispatching)
    expect(Array.from(u32(work, 4 * (1 + slots)))).toEqual(new Array(4 * (1 + slots)).fill(SENTINEL));
    for (const wg of [8, 100, 2048, 0]) expect(() => new RouteKernel(device, { workgroupSize: wg })).toThrow(InvalidArgumentError);
  }, 60_000);

  test("one recording replayed on new logits: every table rewritten, descriptor set reused", () => {
    const S = 6, E = 128, k = 8, slots = S * k;
    using lb = hostBuffer(S * E, "upload");
    using tb = hostBuffer(2 * E, "upload");
    using work = hostBuffer(4 * (1 + slots));
    using pairs = hostBuffer(slots);
    using sw = hostBuffer(slots);
    using se = hostBuffer(2 * slots);
    using chosen = hostBuffer(slots);
    const handles = randomWords(2 * E, seed++);
    u32(tb, 2 * E).set(handles);
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    route.record(cb, { logits: lb, table: tb, work, pairs, slotWeight: sw, slotExpert: se, chosen, S, E, k, normalize: true, seq: 77 });
    cb.barrier("computeToHost").end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    for (let r = 0; r < 3; r++) {
      const x = separatedLogits(S, E, k);
      f32(lb, S * E).set(x);
      submission.submit();
      expect(fence.wait()).toBe(true);
      fence.reset();
      const ref = reference(x, S, E, k, true);
      compareRouting(ref, Int32Array.from(u32(chosen, slots)), f32(sw, slots), WEIGHT_TOL, `replay ${r}`);
      const id0 = ref.ids[0]!;
      expect(Array.from(u32(work, 8))).toEqual([S, k, slots, 77, handles[2 * id0]!, handles[2 * id0 + 1]!, 0, 1]);
    }
    expectTail(work, 4 * (1 + slots), "work");
  }, 60_000);
});
