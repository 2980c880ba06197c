/**
 * Pre-launched fused calls (GpuLayer header; the prelaunchPolls option, VKMOE_PRELAUNCH): while a
 * fused call runs, the next ticket's kernel is submitted already and waits on the GPU for the next
 * call's doorbell. Each path of that protocol must give the reference answer, under the validation
 * layer:
 *   - rung: a poll window far longer than the host needs, so every call after the first is served
 *     by the kernel launched during the previous one (counted: prelaunch.ran);
 *   - given up: a window of one poll, so the armed kernels stop unrung, and each call is submitted
 *     after the fact (gaveUp) or anew (cancelled);
 *   - another S or k than the armed kernel's: cancelled, submitted as usual;
 *   - two calls in flight (issue, issue, take, take) and ready();
 *   - a device lost while a kernel is armed: CPU answers, one log line, no hang;
 *   - off (prelaunchPolls 0, VKMOE_PRELAUNCH=off): never armed; by default only where the policy
 *     says (prelaunch-policy.ts: not on a CPU device such as Lavapipe, so the other tests set
 *     VKMOE_PRELAUNCH=on).
 * Every call has new x and routing, so a kernel that ran before its inputs were written, or on the
 * previous call's, gives the previous answer: far above the per-case bound (the negative control
 * at the end checks that bound tells two consecutive calls apart).
 */
import { describe, expect, test } from "bun:test";
import { mulberry32, nmse, randomGaussianF32 } from "../src/quant/index.ts";
import type { ExpertShape } from "../src/pool/expert-layout.ts";
import type { MoePath } from "../src/moe/reference.ts";
import { decidePrelaunch } from "../src/moe/prelaunch-policy.ts";
import { CASE_BOUND, MoeHarness, NMSE_BOUND, PooledError, makeExperts, outputWithSentinels, checkSentinels, randomRouting, reference, validationEnv } from "./cases/moe.ts";

const SHAPE: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 64, intermediate: 32 };
const E = 16;
const experts = makeExperts(SHAPE, E, 2, 41);
/** Polls no host takes to ring (Lavapipe polls in tens of ns); the kernel still ends by itself after them. */
const LONG_WINDOW = 1 << 24;

interface Run { pooled: PooledError; prelaunch: { ran: number; gaveUp: number; cancelled: number }; why: string; fusedCalls: number }

function run(opts: { polls?: number; calls: [S: number, k: number][]; path?: MoePath; addressing?: "bda" | "descriptor"; env?: Record<string, string>; seed: number }): Run {
  const path = opts.path ?? "float";
  const topK = Math.max(...opts.calls.map(([, k]) => k));
  using h = new MoeHarness(
    { shape: SHAPE, experts: E, topK, layers: 2, shared: true, weights: (l, e) => experts[l]![e]!, addressing: opts.addressing ?? "bda", budgetMB: 64, prelaunchPolls: opts.polls },
    validationEnv({ VKMOE_PRELAUNCH: "on", ...(path === "integer-dot" ? { VKMOE_IDP: "on" } : {}), ...opts.env }),
  );
  expect(h.moe.mode, h.moe.why).toBe("gpu");
  const pooled = new PooledError();
  const rnd = mulberry32(opts.seed);
  opts.calls.forEach(([S, k], i) => {
    const layer = i % 2;
    const r = randomRouting(rnd, S, k, E, i % 3 === 0);
    const x = randomGaussianF32(S * SHAPE.hidden, opts.seed * 31 + i);
    const y = outputWithSentinels(S * SHAPE.hidden);
    h.moe.forward(layer, x, r, y);
    const label = `call ${i} S=${S} k=${k} layer ${layer}`;
    checkSentinels(y, S * SHAPE.hidden, label);
    pooled.add(reference(x, r, experts[layer]!, E, true, undefined, path), y, CASE_BOUND, label);
  });
  const stats = h.moe.stats();
  const result = { pooled, prelaunch: stats.prelaunch!, why: h.moe.why, fusedCalls: stats.fusedCalls };
  h.finish();
  return result;
}

const same = (n: number, S = 1, k = 8): [number, number][] => Array.from({ length: n }, () => [S, k]);

describe("pre-launched fused calls give the reference answer on every path of the protocol", () => {
  for (const [path, addressing] of [["float", "bda"], ["float", "descriptor"], ["integer-dot", "bda"]] as const) {
    test(`rung: each call served by the kernel launched during the previous one (${path}, ${addressing})`, () => {
      const calls = same(40);
      const r = run({ polls: LONG_WINDOW, calls, path, addressing, seed: 700 + calls.length + (path === "float" ? 0 : 1) + (addressing === "bda" ? 0 : 2) });
      console.log(`  rung ${path} ${addressing}: ${JSON.stringify(r.prelaunch)}, NMSE ${r.pooled.nmse.toExponential(2)}`);
      expect(r.why).toContain("(pre-launched)");
      expect(r.fusedCalls).toBe(calls.length);
      // Every call after the first finds a kernel armed for it, polling, and rings it.
      expect(r.prelaunch).toEqual({ ran: calls.length - 1, gaveUp: 0, cancelled: 0 });
      expect(r.pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    });
  }

  test("given up: a window of one poll; calls are submitted after the fact or anew, same answers", () => {
    const calls = same(30);
    const r = run({ polls: 1, calls, seed: 710 });
    console.log(`  one poll: ${JSON.stringify(r.prelaunch)}, NMSE ${r.pooled.nmse.toExponential(2)}`);
    expect(r.prelaunch.ran + r.prelaunch.gaveUp + r.prelaunch.cancelled).toBe(calls.length - 1);
    expect(r.prelaunch.gaveUp + r.prelaunch.cancelled).toBeGreaterThan(0);
    expect(r.pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
  });

  test("another S or k than the armed kernel's cancels it; grouped calls in between", () => {
    // fusedTokens is 4: S = 7 runs grouped (it cancels the kernel armed for S = 2, and arms none).
    const calls: [number, number][] = [[1, 8], [1, 8], [2, 8], [2, 8], [1, 4], [1, 4], [7, 8], [2, 8], [1, 8], [4, 3], [4, 3]];
    const r = run({ polls: LONG_WINDOW, calls, seed: 720 });
    console.log(`  shape changes: ${JSON.stringify(r.prelaunch)}, NMSE ${r.pooled.nmse.toExponential(2)}`);
    // Each fused call arms the next for its own S and k; a grouped call arms nothing. Calls 1, 3, 5
    // and 10 ring (same shape as the call before); 2, 4, 6 (grouped), 8 and 9 cancel; 7 follows the
    // grouped call and finds nothing armed.
    expect(r.prelaunch).toEqual({ ran: 4, gaveUp: 0, cancelled: 5 });
    expect(r.pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
  });

  // A call trusts a completion word or doorbell that holds its sequence number. Memory a new
  // backend gets may hold an earlier owner's words (Lavapipe hands freed memory back as it was):
  // left as they were, a ticket's first armed kernel looked stopped before its doorbell whenever its
  // done[1] happened to hold the number (the rung test then counted a cancel about one run in six).
  // Here the earlier owner's words are set to every number the next backend's first calls will use.
  test("a new backend's tickets start with zeroed completion words and doorbells, whatever the memory held", () => {
    const open = () => new MoeHarness({ shape: SHAPE, experts: E, topK: 8, layers: 2, shared: true, weights: (l, e) => experts[l]![e]!, addressing: "bda", budgetMB: 64, prelaunchPolls: LONG_WINDOW }, validationEnv({ VKMOE_PRELAUNCH: "on" }));
    type Words = { views: { done: Int32Array; gate: Int32Array } };
    const ticketsOf = (h: MoeHarness): Words[] => (h.moe as unknown as { gpu: { layer: { tickets: Words[] } } }).gpu.layer.tickets;
    const poisonAndClose = (h: MoeHarness) => {
      for (const t of ticketsOf(h)) for (const words of [t.views.done, t.views.gate]) for (let i = 0; i < words.length; i++) words[i] = 2 + (i % 2);
      h.finish();
    };
    poisonAndClose(open());
    for (let round = 0; round < 4; round++) {
      const h = open();
      for (const [n, t] of ticketsOf(h).entries()) {
        expect(Array.from(t.views.done), `round ${round} ticket ${n} done`).toEqual(Array.from(t.views.done, () => 0));
        expect(Array.from(t.views.gate), `round ${round} ticket ${n} gate`).toEqual(Array.from(t.views.gate, () => 0));
      }
      poisonAndClose(h);
      // And end to end: the next backend's first calls each ring the kernel armed for them.
      expect(run({ polls: LONG_WINDOW, calls: same(4), seed: 725 + round }).prelaunch).toEqual({ ran: 3, gaveUp: 0, cancelled: 0 });
    }
  });

  test("two calls in flight (issue, issue, take, take) and ready()", async () => {
    using h = new MoeHarness({ shape: SHAPE, experts: E, topK: 8, layers: 2, shared: true, weights: (l, e) => experts[l]![e]!, addressing: "bda", budgetMB: 64, prelaunchPolls: LONG_WINDOW }, validationEnv({ VKMOE_PRELAUNCH: "on" }));
    const rnd = mulberry32(730);
    const pooled = new PooledError();
    for (let i = 0; i < 12; i++) {
      const inputs = [0, 1].map((j) => ({ r: randomRouting(rnd, 1, 8, E), x: randomGaussianF32(SHAPE.hidden, 7300 + 2 * i + j) }));
      const a = h.moe.issue(0, inputs[0]!.x, inputs[0]!.r);
      const b = h.moe.issue(1, inputs[1]!.x, inputs[1]!.r);
      const ya = new Float32Array(SHAPE.hidden), yb = new Float32Array(SHAPE.hidden);
      if (i % 2) await b.ready();
      a.take(ya);
      b.take(yb);
      pooled.add(reference(inputs[0]!.x, inputs[0]!.r, experts[0]!, E, true), ya, CASE_BOUND, `pair ${i} a`);
      pooled.add(reference(inputs[1]!.x, inputs[1]!.r, experts[1]!, E, true), yb, CASE_BOUND, `pair ${i} b`);
    }
    const p = h.moe.stats().prelaunch!;
    console.log(`  two in flight: ${JSON.stringify(p)}, NMSE ${pooled.nmse.toExponential(2)}`);
    expect(p.ran).toBeGreaterThan(0);
    expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    h.finish();
  });

  for (const [label, polls, env] of [["prelaunchPolls 0", 0, {}], ["VKMOE_PRELAUNCH=off", LONG_WINDOW, { VKMOE_PRELAUNCH: "off" }]] as const) {
    test(`${label}: never armed`, () => {
      const r = run({ polls, calls: same(6), env, seed: 740 });
      expect(r.why).not.toContain("(pre-launched)");
      if (polls > 0) expect(r.why).toContain("(not pre-launched: VKMOE_PRELAUNCH=off)");
      expect(r.prelaunch).toEqual({ ran: 0, gaveUp: 0, cancelled: 0 });
      expect(r.pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    });
  }

  test("a lost device while a kernel is armed: the call that meets it and the next are right (CPU), nothing hangs", () => {
    using h = new MoeHarness({ shape: SHAPE, experts: E, topK: 8, layers: 2, shared: true, weights: (l, e) => experts[l]![e]!, addressing: "bda", budgetMB: 64, prelaunchPolls: LONG_WINDOW }, validationEnv({ VKMOE_PRELAUNCH: "on" }));
    const rnd = mulberry32(760);
    const pooled = new PooledError();
    for (let i = 0; i < 6; i++) {
      if (i === 3) {
        const p = h.moe.stats().prelaunch!;
        expect(p.ran + p.gaveUp + p.cancelled).toBe(2); // calls 1 and 2 found armed kernels; call 3's is armed
        h.moe.injectDeviceLost();
      }
      const r = randomRouting(rnd, 1, 8, E), x = randomGaussianF32(SHAPE.hidden, 7600 + i);
      const y = new Float32Array(SHAPE.hidden);
      h.moe.forward(i % 2, x, r, y);
      pooled.add(reference(x, r, experts[i % 2]!, E, true), y, CASE_BOUND, `call ${i}`);
    }
    expect(h.moe.mode).toBe("cpu");
    expect(h.logs).toHaveLength(1);
    expect(h.logs[0]).toContain("device lost");
    expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    h.finish();
  });

  test("VKMOE_PRELAUNCH=auto follows the policy for this device", () => {
    using h = new MoeHarness({ shape: SHAPE, experts: E, topK: 8, layers: 2, shared: true, weights: (l, e) => experts[l]![e]!, addressing: "bda", budgetMB: 64 }, validationEnv({ VKMOE_PRELAUNCH: "auto" }));
    const want = decidePrelaunch("auto", h.moe.context!.device.info);
    console.log(`  auto on ${h.moe.context!.device.info.name}: ${want.on ? "on" : "off"} (${want.why})`);
    expect(h.moe.why.includes("(pre-launched)")).toBe(want.on);
    if (!want.on) expect(h.moe.why).toContain(`(not pre-launched: ${want.why})`); // the reason reaches the user
    h.finish();
  });

  test("negative control: the per-case bound tells a call's answer from the previous call's", () => {
    const rnd = mulberry32(750);
    const refs = [0, 1].map((i) => reference(randomGaussianF32(SHAPE.hidden, 7500 + i), randomRouting(rnd, 1, 8, E), experts[0]!, E, true));
    expect(nmse(refs[0]!, Float32Array.from(refs[1]!))).toBeGreaterThan(1e3 * CASE_BOUND);
  });
});
