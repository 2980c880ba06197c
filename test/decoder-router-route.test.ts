/**
 * dec_router_route (src/kernels/decoder/router-route.ts) on the real driver, under the validation
 * layer, against the two steps it replaces: dec_gemv_half, a barrier, dec_route (the same workgroup
 * size, rows per workgroup and reductions), on the same inputs. The logits and every table (work
 * list, pairs, slot weights, slot experts, chosen ids) must be bit-identical; the logits are also
 * checked against an f64 GEMV (NMSE ≤ 1e-10, dec_gemv_half's bound) and the ids and weights against
 * ops.ts routeTopK (ids exact, weights within 1e-5 relative; logits drawn so that no near-tie can
 * reorder them). All cases of a test run in one command buffer, one after another on one arrival
 * word (a barrier between calls, as in the decode graph), which must be 0 after each submit: a
 * word left nonzero would keep every later call from routing. Outputs carry sentinel words past
 * their ends.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { GemvHalfKernel, RmsNormKernel, RouteKernel, submitAndWait } from "../src/kernels/decoder/index.ts";
import type { GemvWeightDType } from "../src/kernels/decoder/gemv-half.ts";
import { ROUTER_ROUTE_MAX_S, routerNormTokens, RouterRouteKernel } from "../src/kernels/decoder/router-route.ts";
import { routeTopK } from "../src/model/ops.ts";
import { f32ToBf16Bits, f32ToF16Bits, bf16BitsToF32, f16BitsToF32 } from "../src/quant/half.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32, randomGaussianF32, randomWords } from "../src/quant/random.ts";
import type { CommandBuffer } from "../src/vk/commands.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));

interface Shape {
  name: string;
  workgroupSize: number;
  rowsPerWorkgroup: number;
  useSubgroup: boolean;
}
// The graph's shape (GemvHalfKernel's and RouteKernel's defaults); 16 threads with 3 rows a
// workgroup (E not a multiple: a last block of 1 or 2 rows; route's stage 2 from E = 32) and
// shared-memory reductions only.
const SHAPES: Shape[] = [
  { name: "128 threads, 4 rows", workgroupSize: 128, rowsPerWorkgroup: 4, useSubgroup: device.info.subgroup.arithmetic },
  { name: "16 threads, 3 rows, no subgroup ops", workgroupSize: 16, rowsPerWorkgroup: 3, useSubgroup: false },
];
const kernels = SHAPES.map((s) => ({
  shape: s,
  fused: new RouterRouteKernel(device, s),
  gemv: new GemvHalfKernel(device, s),
  route: new RouteKernel(device, { workgroupSize: s.workgroupSize, useSubgroup: s.useSubgroup }),
}));
// one arrival word for every call of the file, as the graph's one word for every layer
const arrived = hostBuffer(device, 1);
u32(arrived, 1)[0] = 0;
afterAll(() => {
  arrived[Symbol.dispose]();
  for (const k of kernels) for (const x of [k.fused, k.gemv, k.route]) x[Symbol.dispose]();
  finish(ctx);
});

let seed = 4242;

interface Case {
  E: number;
  k: number;
  S: number;
  cols: number;
  dtype: GemvWeightDType;
  normalize: boolean;
}

/** Router weights of `dtype` as stored (uint words) and as the f64 reference reads them. */
function routerWeights(E: number, cols: number, dtype: GemvWeightDType, s: number): { words: Uint32Array; values: Float64Array } {
  const next = mulberry32(s), n = E * cols;
  const values = new Float64Array(n);
  if (dtype === "f32") {
    const w = new Float32Array(n);
    for (let i = 0; i < n; i++) values[i] = w[i] = (next() - 0.5) * 4;
    return { words: new Uint32Array(w.buffer), values };
  }
  const halves = new Uint16Array(2 * Math.ceil(n / 2));
  const [to, from] = dtype === "f16" ? [f32ToF16Bits, f16BitsToF32] : [f32ToBf16Bits, bf16BitsToF32];
  for (let i = 0; i < n; i++) values[i] = from((halves[i] = to((next() - 0.5) * 4)));
  return { words: new Uint32Array(halves.buffer), values };
}

/** f64 logits [S][E] of the router on x. */
function refLogits(w: Float64Array, x: Float32Array, E: number, cols: number, S: number): Float32Array {
  const y = new Float32Array(S * E);
  for (let s = 0; s < S; s++) for (let e = 0; e < E; e++) {
    let acc = 0;
    for (let c = 0; c < cols; c++) acc += w[e * cols + c]! * x[s * cols + c]!;
    y[s * E + e] = acc;
  }
  return y;
}

/** Inputs whose f64 logits have the k + 1 largest of each token >= 1e-3 apart (redrawn until so). */
function drawInputs(c: Case) {
  for (;;) {
    const w = routerWeights(c.E, c.cols, c.dtype, seed++);
    const x = randomGaussianF32(c.S * c.cols, seed++, 1 / Math.sqrt(c.cols)); // logits of std ~1.2
    const ref = refLogits(w.values, x, c.E, c.cols, c.S);
    let ok = true;
    for (let t = 0; t < c.S && ok; t++) {
      const top = Array.from(ref.subarray(t * c.E, (t + 1) * c.E)).sort((a, b) => b - a).slice(0, Math.min(c.k + 1, c.E));
      ok = top.every((v, i) => i === 0 || top[i - 1]! - v >= 1e-3);
    }
    if (ok) return { w, x, ref };
  }
}

const TABLES = ["work", "pairs", "slotWeight", "slotExpert", "chosen"] as const;
type Tables = Record<(typeof TABLES)[number], Buffer>;

/** One case's buffers: inputs at nonzero offsets, and two sets of outputs (two steps, fused). */
function setUp(c: Case) {
  const { E, k, S, cols } = c;
  const slots = S * k, weightOffset = 4 + (seed % 3), xOffset = 1 + (seed % 4), logitsOffset = 2 + (seed % 5), tableOffset = 3 + (seed % 7), chosenOffset = 1 + (seed % 3);
  const { w, x, ref } = drawInputs(c);
  const wb = hostBuffer(device, weightOffset + w.words.length, "upload");
  u32(wb, w.words.length, weightOffset).set(w.words);
  const xb = hostBuffer(device, xOffset + S * cols, "upload");
  f32(xb, S * cols, xOffset).set(x);
  const handles = randomWords(2 * (tableOffset + E), seed++);
  const table = hostBuffer(device, handles.length, "upload");
  u32(table, handles.length).set(handles);
  const outputs = (): Tables & { logits: Buffer } => ({
    logits: hostBuffer(device, logitsOffset + S * E), work: hostBuffer(device, 4 * (1 + slots)), pairs: hostBuffer(device, slots),
    slotWeight: hostBuffer(device, slots), slotExpert: hostBuffer(device, 2 * slots), chosen: hostBuffer(device, chosenOffset + slots),
  });
  const two = outputs(), fused = outputs();
  const seq = (seed++ * 2654435761) >>> 0;
  const common = { S, E, k, normalize: c.normalize, seq, logitsOffset, tableOffset, chosenOffset, table };
  const gemvArgs = { weights: wb, x: xb, rows: E, cols, S, dtype: c.dtype, weightOffset, xOffset, yOffset: logitsOffset };
  return {
    c, ref, x,
    recordTwo(cb: CommandBuffer, g: GemvHalfKernel, r: RouteKernel) {
      g.record(cb, { ...gemvArgs, y: two.logits });
      cb.barrier("computeToCompute");
      r.record(cb, { ...common, ...two });
    },
    recordFused(cb: CommandBuffer, f: RouterRouteKernel) {
      f.record(cb, { ...common, ...fused, weights: wb, x: xb, cols, dtype: c.dtype, weightOffset, xOffset, arrived });
    },
    /** Throws unless the fused outputs are the two steps' bit for bit (and right); returns the logits' NMSE. */
    check(what: string): number {
      const words = { logits: logitsOffset + S * E, work: 4 * (1 + slots), pairs: slots, slotWeight: slots, slotExpert: 2 * slots, chosen: chosenOffset + slots };
      for (const name of ["logits", ...TABLES] as const) {
        const a = u32(two[name], words[name]), b = u32(fused[name], words[name]);
        const bad = a.findIndex((v, i) => v !== b[i]);
        if (bad >= 0) throw new Error(`${what}: ${name}[${bad}] = 0x${b[bad]!.toString(16)}, the two steps wrote 0x${a[bad]!.toString(16)}`);
        expectTail(fused[name], words[name], `${what} ${name}`);
      }
      // the two steps themselves against the references
      const logits = f32(fused.logits, S * E, logitsOffset);
      const ids = new Int32Array(slots), weights = new Float32Array(slots), probs = new Float64Array(E);
      for (let t = 0; t < S; t++) routeTopK(logits.subarray(t * E, (t + 1) * E), E, k, c.normalize, probs, ids, weights, t * k);
      const gotIds = u32(fused.chosen, slots, chosenOffset), gotW = f32(fused.slotWeight, slots);
      for (let u = 0; u < slots; u++) {
        if (gotIds[u] !== ids[u]) throw new Error(`${what}: slot ${u}: expert ${gotIds[u]}, routeTopK ${ids[u]}`);
        if (!(Math.abs(gotW[u]! - weights[u]!) <= 1e-5 * Math.abs(weights[u]!))) throw new Error(`${what}: slot ${u}: weight ${gotW[u]}, routeTopK ${weights[u]}`);
        const h = [handles[2 * (tableOffset + ids[u]!)]!, handles[2 * (tableOffset + ids[u]!) + 1]!];
        expect({ what, u, item: Array.from(u32(fused.work, 4, 4 + 4 * u)), expert: Array.from(u32(fused.slotExpert, 2, 2 * u)) }).toEqual({ what, u, item: [...h, u, 1], expert: h });
      }
      expect({ what, header: Array.from(u32(fused.work, 4)) }).toEqual({ what, header: [S, k, slots, seq] });
      return nmse(ref, logits);
    },
    [Symbol.dispose]() {
      for (const b of [wb, xb, table, ...Object.values(two), ...Object.values(fused)]) b[Symbol.dispose]();
    },
  };
}

/** Runs the cases in one command buffer (each: two steps, then fused, a barrier between calls); checks each and the word; returns the worst logits NMSE. */
function runCases(k: (typeof kernels)[number], cases: Case[], label: string): number {
  const set = cases.map(setUp);
  try {
    submitAndWait(device, (cb) => {
      for (const s of set) {
        s.recordTwo(cb, k.gemv, k.route);
        cb.barrier("computeToCompute");
        s.recordFused(cb, k.fused);
        cb.barrier("computeToCompute");
      }
    });
    let worst = 0;
    for (const s of set) {
      const e = s.check(`${label} E=${s.c.E} k=${s.c.k} S=${s.c.S} cols=${s.c.cols} ${s.c.dtype} normalize=${s.c.normalize}`);
      if (!(e <= 1e-10)) throw new Error(`${label}: logits NMSE ${e} against the f64 GEMV`);
      worst = Math.max(worst, e);
    }
    expect(u32(arrived, 1)[0]).toBe(0);
    expectTail(arrived, 1, "arrival word");
    return worst;
  } finally {
    for (const s of set) s[Symbol.dispose]();
  }
}

describe("dec_router_route vs dec_gemv_half + dec_route (logits and tables bit-identical)", () => {
  const EK: [number, number][] = [[8, 1], [8, 2], [64, 8], [128, 8], [256, 8], [128, 2], [60, 8], [7, 2]];
  for (const k of kernels) {
    for (const dtype of ["f32", "bf16", "f16"] as const) {
      test(`${k.shape.name}, ${dtype}: (E, k) ${EK.map((c) => `(${c})`).join(" ")}, S 1..4, normalize on/off, in a row on one arrival word`, () => {
        const cases: Case[] = [];
        let i = 0;
        for (const [E, kk] of EK) for (const normalize of [true, false]) {
          const S = 1 + (i % ROUTER_ROUTE_MAX_S), cols = [67, 96, 130, 33][i % 4]!; // odd cols (tails, unaligned rows), aligned
          cases.push({ E, k: kk, S, cols, dtype, normalize });
          i++;
        }
        for (let S = 1; S <= ROUTER_ROUTE_MAX_S; S++) cases.push({ E: 128, k: 8, S, cols: 64, dtype, normalize: S % 2 === 0 });
        const worst = runCases(k, cases, `${k.shape.name} ${dtype}`);
        console.log(`  router-route ${k.shape.name} ${dtype}: ${cases.length} calls bit-identical to the two steps; logits worst NMSE ${worst.toExponential(2)} vs f64`);
      }, 120_000);
    }
  }
});

/**
 * The post-attention norm folded in (normCols): against dec_rmsnorm (x += o, y = its norm), a
 * barrier, then the unfolded dec_router_route over y, on the same inputs in one command buffer. The
 * new residual must be bit-identical (one add either way); the normed rows and logits may differ
 * from the two steps only by the order of the sum of squares (NMSE ≤ 1e-12); the routed ids equal
 * (logits drawn with margins of 1e-3) and the weights within 1e-5 relative. D = 2048 is the graphs'
 * hidden size; 130 a size no workgroup divides.
 */
describe("dec_router_route with the post-attention norm folded in vs dec_rmsnorm + dec_router_route", () => {
  for (const shape of SHAPES) {
    test(`${shape.name}: D 130 and 2048, S 1..4, E 128 k 8 and E 60 k 2, f32 and bf16 routers`, () => {
      using norm = new RmsNormKernel(device, { useSubgroup: shape.useSubgroup });
      const plain = kernels.find((k) => k.shape === shape)!.fused;
      let worst = 0;
      for (const D of [130, 2048]) {
        using folded = new RouterRouteKernel(device, { ...shape, normCols: D });
        // Lavapipe's 32 KiB hold 3 tokens of 2048 beside the rest; 48 KiB (NVIDIA) all 4
        expect(folded.normTokens).toBe(routerNormTokens(device, D, shape.workgroupSize, shape.rowsPerWorkgroup));
        expect(folded.normTokens).toBeGreaterThanOrEqual(D === 2048 && device.info.limits.maxComputeSharedMemorySize < 49152 ? 3 : ROUTER_ROUTE_MAX_S);
        for (const [E, k, S0, dtype] of [[128, 8, 1, "f32"], [60, 2, 4, "bf16"], [128, 8, 3, "bf16"], [128, 8, 2, "f32"]] as const) {
          const S = Math.min(S0, folded.normTokens);
          const xOffset = 1 + (seed % 3), wOffset = 2 + (seed % 5), eps = 1e-6;
          const w = routerWeights(E, D, dtype, seed++);
          const h = randomGaussianF32(S * D, seed++), o = randomGaussianF32(S * D, seed++, 0.5), nw = randomGaussianF32(D, seed++, 1 / Math.sqrt(D));
          const table = hostBuffer(device, 2 * E, "upload");
          u32(table, 2 * E).set(randomWords(2 * E, seed++));
          const wb = hostBuffer(device, w.words.length, "upload");
          u32(wb, w.words.length).set(w.words);
          const nwb = hostBuffer(device, wOffset + D, "upload");
          f32(nwb, D, wOffset).set(nw);
          const side = () => {
            const b = { h: hostBuffer(device, xOffset + S * D, "upload"), o: hostBuffer(device, xOffset + S * D, "upload"), xn: hostBuffer(device, xOffset + S * D), logits: hostBuffer(device, S * E), work: hostBuffer(device, 4 * (1 + S * k)), pairs: hostBuffer(device, S * k), slotWeight: hostBuffer(device, S * k), slotExpert: hostBuffer(device, 2 * S * k), chosen: hostBuffer(device, S * k) };
            f32(b.h, S * D, xOffset).set(h);
            f32(b.o, S * D, xOffset).set(o);
            return b;
          };
          const two = side(), one = side();
          const route = { S, E, k, normalize: true, seq: seed++, table, weights: wb, dtype, cols: D, arrived, xOffset, logitsOffset: 0 };
          try {
            submitAndWait(device, (cb) => {
              norm.record(cb, { x: two.h, add: two.o, w: nwb, wOffset, y: two.xn, rows: S, n: D, eps, xOffset, addOffset: xOffset, yOffset: xOffset });
              cb.barrier("computeToCompute");
              plain.record(cb, { ...route, ...two, x: two.xn });
              cb.barrier("computeToCompute");
              folded.record(cb, { ...route, ...one, x: one.xn, norm: { h: one.h, add: one.o, weights: nwb, weightOffset: wOffset, eps, xn: one.xn } });
            });
            const what = `${shape.name} D=${D} E=${E} k=${k} S=${S} ${dtype}`;
            const hTwo = u32(two.h, S * D, xOffset), hOne = u32(one.h, S * D, xOffset);
            const bad = hTwo.findIndex((v, i) => v !== hOne[i]);
            if (bad >= 0) throw new Error(`${what}: h[${bad}] differs from dec_rmsnorm's h + o`);
            const eXn = nmse(f32(two.xn, S * D, xOffset), f32(one.xn, S * D, xOffset)), eLogits = nmse(f32(two.logits, S * E), f32(one.logits, S * E));
            if (!(eXn <= 1e-12 && eLogits <= 1e-12)) throw new Error(`${what}: normed rows NMSE ${eXn}, logits NMSE ${eLogits} against the two steps`);
            worst = Math.max(worst, eXn, eLogits);
            const ids = [u32(two.chosen, S * k), u32(one.chosen, S * k)], wts = [f32(two.slotWeight, S * k), f32(one.slotWeight, S * k)];
            expect({ what, ids: Array.from(ids[1]!) }).toEqual({ what, ids: Array.from(ids[0]!) });
            for (let u = 0; u < S * k; u++) if (!(Math.abs(wts[1]![u]! - wts[0]![u]!) <= 1e-5 * Math.abs(wts[0]![u]!))) throw new Error(`${what}: slot ${u} weight ${wts[1]![u]} vs ${wts[0]![u]}`);
            expect(Array.from(u32(one.work, 4))).toEqual([S, k, S * k, route.seq]);
            expect(u32(arrived, 1)[0]).toBe(0);
          } finally {
            for (const b of [table, wb, nwb, ...Object.values(two), ...Object.values(one)]) b[Symbol.dispose]();
          }
        }
      }
      console.log(`  router-route + norm ${shape.name}: worst NMSE against the two steps ${worst.toExponential(2)}`);
    }, 120_000);
  }

  test("a folded kernel without norm arguments, norm arguments on a plain kernel, a norm of other columns: clear errors", () => {
    using folded = new RouterRouteKernel(device, { normCols: 8 });
    using b = hostBuffer(device, 4096);
    using c = hostBuffer(device, 64);
    using d = hostBuffer(device, 64);
    using e = hostBuffer(device, 64);
    using h = hostBuffer(device, 64);
    using o = hostBuffer(device, 64);
    using xn = hostBuffer(device, 64);
    const args = { weights: b, x: b, logits: b, table: b, work: c, pairs: d, slotWeight: e, slotExpert: b, chosen: b, arrived, E: 8, cols: 8, S: 1, k: 2, normalize: true, dtype: "f32" as const };
    const normArgs = { h, add: o, weights: b, weightOffset: 0, eps: 1e-6, xn };
    expect(() => submitAndWait(device, (cb) => folded.record(cb, args))).toThrow(/give `norm`/);
    expect(() => submitAndWait(device, (cb) => kernels[0]!.fused.record(cb, { ...args, norm: normArgs }))).toThrow(/normCols/);
    expect(() => submitAndWait(device, (cb) => folded.record(cb, { ...args, cols: 16, norm: normArgs }))).toThrow(/a norm of 8 columns on a router of 16/);
    expect(() => submitAndWait(device, (cb) => folded.record(cb, { ...args, norm: { ...normArgs, xn: h } }))).toThrow(/buffers of their own/);
    expect(() => submitAndWait(device, (cb) => folded.record(cb, { ...args, S: folded.normTokens + 1, norm: normArgs }))).toThrow(InvalidArgumentError); // past normTokens (or past the route's 4)
    expect(() => new RouterRouteKernel(device, { normCols: 1 << 20 })).toThrow(/shared memory/);
  });
});

describe("dec_router_route argument checks", () => {
  test("S past 4, a shared arrival buffer, workgroups below 16 threads: clear errors", () => {
    const k = kernels[0]!.fused;
    using b = hostBuffer(device, 4096);
    using c = hostBuffer(device, 64);
    using d = hostBuffer(device, 64);
    using e = hostBuffer(device, 64);
    const args = { weights: b, x: b, logits: b, table: b, work: c, pairs: d, slotWeight: e, slotExpert: b, chosen: b, arrived, E: 8, cols: 8, S: 1, k: 2, normalize: true, dtype: "f32" as const };
    expect(() => submitAndWait(device, (cb) => k.record(cb, { ...args, S: 5 }))).toThrow(InvalidArgumentError);
    expect(() => submitAndWait(device, (cb) => k.record(cb, { ...args, arrived: c }))).toThrow(InvalidArgumentError);
    expect(() => new RouterRouteKernel(device, { workgroupSize: 8 })).toThrow(InvalidArgumentError);
  });
});
