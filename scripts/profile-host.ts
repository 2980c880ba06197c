// Host (CPU) cost of one MoE layer call, issue() + take(), at S=1 and S=16 for the Qwen3-30B-A3B
// shape (D 2048, I 768, E 128, k 8), with every expert resident (the steady state of decoding).
//
// The GPU is taken out of the measurement: each GpuLayer ticket's vkQueueSubmit, vkWaitForFences
// and vkResetFences are replaced by no-ops in this script only (and the wait style set to "block",
// so nothing polls for GPU completion), so issue() and take() run exactly
// their JS (checks, work list, pool lookups and pins, tables built and copied into mapped memory, x copied,
// y read back) and nothing else. Three measurements per S:
//   1. issue() and take() uninstrumented (the headline numbers), median / p90 over --calls calls;
//   2. the same calls with the host phases wrapped in timers (each wrapper's own cost, measured on
//      a wrapped no-op, is subtracted): per phase, median µs per call summed over its invocations;
//      "rest" rows = the uninstrumented median less the phases' medians (tables, x copy, CPU-share
//      buffers, the returned ticket);
//   3. with the real submit: vkQueueSubmit alone (the ticket's Submission.submit timed), and the
//      take() that waits for the GPU (--real calls; on a CPU Vulkan device like Lavapipe a call's
//      GPU work takes long, so few).
// Under Deno the V8 heap growth per call of (1) is printed too (bytes allocated; Bun has no
// equivalent counter).
//   bun scripts/profile-host.ts [--layers N] [--calls N] [--real N] [--descriptor] [--s16-only | --s1-only]
import { readConfig } from "../src/config.ts";
import { MoeBackend } from "../src/moe/backend.ts";
import { BatchTicket } from "../src/pool/cache.ts";
import type { Routing } from "../src/moe/routing.ts";
import { Args, fail, runtimeName } from "./lib/cli.ts";
import { preloadExperts } from "./lib/moe-setup.ts";
import { expertShapeOf, QWEN3_30B_A3B, randomActivations, randomExpert, RoutingGenerator } from "./lib/synthetic.ts";
import { fmt, formatTable, median, percentile } from "./lib/table.ts";

const SCRIPT = "profile-host";
const opts = new Args(SCRIPT, { flags: ["--descriptor", "--s1-only", "--s16-only"], ints: ["--layers", "--calls", "--real"] });
const layers = opts.int("--layers", 1, 48) ?? 2;
const calls = opts.int("--calls", 10) ?? 4000;
const sizes = opts.flag("--s1-only") ? [1] : opts.flag("--s16-only") ? [16] : [1, 16];

const model = QWEN3_30B_A3B;
const shape = expertShapeOf(model);
const host = Array.from({ length: model.experts }, (_, e) => randomExpert(shape, e + 1));
const weights = (_l: number, e: number) => host[e]!;
using moe = MoeBackend.open({
  shape, experts: model.experts, topK: model.topK, layers, weights, log: () => {},
  addressing: opts.flag("--descriptor") ? "descriptor" : undefined,
}, readConfig());
const ctx = moe.context;
if (!ctx) fail(SCRIPT, `no GPU path: ${moe.why}`);
const pre = preloadExperts(moe, layers, model.experts, weights);
if (pre.notResident > 0) fail(SCRIPT, `${pre.notResident} experts did not fit the device budget; try --layers 1`);
const cpuDevice = ctx.device.info.type === 4;
const realCalls = opts.int("--real", 0) ?? (cpuDevice ? 3 : 500);
console.log(`${SCRIPT} (${runtimeName}) ${ctx.device.info.name}: ${model.name}, ${layers} layers resident, ${moe.pool!.addressing} addressing, ` +
  `${moe.options.tickets} tickets, ${moe.options.wait} wait; ${calls} calls per S with the GPU stubbed out, ${realCalls} real`);

// ---- internals reached by name (like scripts/profile-moe.ts) --------------------------------------
const anyMoe = moe as any;
const layer = anyMoe.gpu.layer;
const pool = anyMoe.gpu.pool;
const gpuTickets: any[] = layer.tickets;

const waitStyle: string = layer.waitStyle;

/**
 * Replaces the ticket's submit and fence calls by no-ops (true) or puts the real ones back
 * (false). While stubbed the layer waits "block" (straight to the stubbed fence): "spin" would
 * poll for a completion word that no GPU writes.
 */
// Each ticket has one submission per call mode (grouped, fused): both are stubbed and wrapped.
const MODES = ["grouped", "fused"] as const;
const realGpu = gpuTickets.map((t) => ({ submit: t.submissions.grouped.submit, wait: t.fence.wait, waitSpin: t.fence.waitSpin, reset: t.fence.reset }));
const noop = () => {};
const yes = () => true;
function stubGpu(on: boolean): void {
  layer.waitStyle = on ? "block" : waitStyle;
  gpuTickets.forEach((t, i) => {
    // Assigned back rather than deleted: a delete would leave these objects slow (dictionary mode).
    const r = realGpu[i]!;
    for (const m of MODES) t.submissions[m].submit = on ? noop : r.submit;
    t.fence.wait = on ? yes : r.wait;
    t.fence.waitSpin = on ? yes : r.waitSpin;
    t.fence.reset = on ? noop : r.reset;
  });
}

// ---- phase timers ------------------------------------------------------------------------------
const now = () => performance.now();
interface Phase { label: string; where: "issue" | "take"; ms: number; n: number; perCall: number[]; invocations: number }
const phases: Phase[] = [];
const restore: (() => void)[] = [];

function wrap(obj: any, method: string, label: string, where: "issue" | "take"): void {
  if (typeof obj?.[method] !== "function") return; // not in this version of the code
  const original = obj[method];
  const phase: Phase = { label, where, ms: 0, n: 0, perCall: [], invocations: 0 };
  phases.push(phase);
  // Fixed arity (no rest array allocated per call); the wrapped methods take at most 4 arguments.
  obj[method] = function (this: unknown, a0: unknown, a1: unknown, a2: unknown, a3: unknown) {
    const t0 = now();
    try {
      return original.call(this, a0, a1, a2, a3);
    } finally {
      phase.ms += now() - t0;
      phase.n++;
    }
  };
  restore.push(() => (obj[method] = original)); // not delete: that would leave obj slow (dictionary mode)
}

/** What a wrapper reports around a function that does nothing. */
function wrapperOverheadUs(): number {
  const dummy = { f(_a: number) {} };
  wrap(dummy, "f", "calibration", "issue");
  const p = phases.pop()!;
  for (let i = 0; i < 200_000; i++) dummy.f(i);
  p.ms = 0; p.n = 0;
  for (let i = 0; i < 200_000; i++) dummy.f(i);
  restore.pop()!();
  return (p.ms * 1e3) / p.n;
}

function instrument(): void {
  // issue(): every host phase the code has (methods missing in a version are skipped).
  wrap(anyMoe, "checkInput", "checkInput (x, routing, layer)", "issue");
  wrap(anyMoe, "checkValues", "checkValues (x finite; after the submit)", "issue");
  wrap(anyMoe.work, "build", "WorkList.build", "issue");
  wrap(layer, "acquire", "GpuLayer.acquire", "issue");
  wrap(pool, "beginBatch", "pool.beginBatch", "issue");
  wrap(pool.cache, "beginBatch", "cache.beginBatch", "issue");
  wrap(pool.cache, "has", "cache.has (onMiss cpu)", "issue");
  wrap(BatchTicket.prototype, "tryEnsure", "batch.tryEnsure (lookup + pin; hits pinned after the submit)", "issue");
  wrap(BatchTicket.prototype, "ensureFast", "batch.ensureFast (lookup + pin)", "issue");
  wrap(pool, "locate", "pool.locate (bigint address)", "issue");
  wrap(layer, "slotOf", "GpuLayer.slotOf (descriptor)", "issue");
  wrap(pool, "flush", "pool.flush", "issue");
  wrap(layer, "submit", "GpuLayer.submit (JS; vkQueueSubmit stubbed)", "issue");
  // take()
  wrap(layer, "wait", "GpuLayer.wait (fence stubbed)", "take");
  wrap(BatchTicket.prototype, "release", "batch.release (unpin)", "take");
  wrap(layer, "releaseTicket", "GpuLayer.releaseTicket", "take");
}

// ---- runs ----------------------------------------------------------------------------------------
interface Inputs { S: number; x: Float32Array; y: Float32Array; routings: Routing[] }

function inputs(S: number): Inputs {
  const gen = new RoutingGenerator(model, 100 + S);
  return { S, x: randomActivations(S, shape.hidden, 7 + S), y: new Float32Array(S * shape.hidden), routings: Array.from({ length: 64 }, () => gen.next(S)) };
}

/** n issue()+take() pairs rotating through the layers and the prepared routings; µs of each half. */
function run(inp: Inputs, n: number, perCall?: () => void): { issue: number[]; take: number[] } {
  const issue: number[] = [], take: number[] = [];
  for (let i = 0; i < n; i++) {
    const r = inp.routings[i % inp.routings.length]!;
    const a = now();
    const t = moe.issue(i % layers, inp.x, r);
    const b = now();
    t.take(inp.y);
    const c = now();
    issue.push((b - a) * 1e3);
    take.push((c - b) * 1e3);
    perCall?.();
  }
  return { issue, take };
}

/** n issue()+take() pairs that record nothing themselves. */
function quietRun(inp: Inputs, n: number): void {
  for (let i = 0; i < n; i++) moe.issue(i % layers, inp.x, inp.routings[i % inp.routings.length]!).take(inp.y);
}

/** V8 heap bytes per issue()+take() (Deno). */
function heapBytesPerCall(inp: Inputs): number | undefined {
  const deno = (globalThis as any).Deno;
  if (!deno) return undefined;
  const per: number[] = [];
  const calls = 200;
  for (let rep = 0; rep < 150; rep++) quietRun(inp, calls); // warm: the loop itself optimized too
  for (let rep = 0; rep < 15; rep++) {
    const before = deno.memoryUsage().heapUsed;
    quietRun(inp, calls);
    const after = deno.memoryUsage().heapUsed;
    // A scavenge in between shrinks heapUsed: such a sample is dropped.
    if (after >= before) per.push((after - before) / calls);
  }
  return per.length ? median(per) : undefined;
}

const overheadUs = wrapperOverheadUs();
const out: string[][] = [["phase (µs per call, median)", ...sizes.map((S) => `S=${S}`)]];
const cols: Map<string, string>[] = [];
const rowOrder: string[] = [];
const put = (col: Map<string, string>, label: string, v: string) => {
  if (!rowOrder.includes(label)) rowOrder.push(label);
  col.set(label, v);
};

// Pass 1, every S: uninstrumented calls (and the heap growth under Deno) before any wrapper has
// touched the objects. Pass 2: the same calls with the phases wrapped. Pass 3: the real GPU.
const inps = sizes.map(inputs);
const plains = sizes.map((_S, k) => {
  const inp = inps[k]!;
  stubGpu(true);
  run(inp, Math.min(calls, 1000)); // warm-up: JIT tiers
  return { ...run(inp, calls), bytes: heapBytesPerCall(inp) };
});
sizes.forEach((_S, k) => {
  const inp = inps[k]!, plain = plains[k]!;
  const col = new Map<string, string>();
  cols.push(col);
  instrument();
  run(inp, Math.min(calls, 500));
  for (const p of phases) { p.ms = 0; p.n = 0; p.perCall.length = 0; }
  run(inp, calls, () => {
    for (const p of phases) {
      p.perCall.push(p.ms * 1e3 - p.n * overheadUs);
      p.invocations = p.n;
      p.ms = 0; p.n = 0;
    }
  });
  const issueMed = median(plain.issue), takeMed = median(plain.take);
  put(col, "**issue() total, JS only**", `**${fmt(issueMed)}** (p90 ${fmt(percentile(plain.issue, 90))})`);
  let issueParts = 0, takeParts = 0;
  for (const p of phases) {
    if (p.invocations === 0 && median(p.perCall) <= 0) continue;
    const m = Math.max(0, median(p.perCall));
    if (p.where === "issue") issueParts += m; else takeParts += m;
    put(col, `  ${p.where === "issue" ? "" : "take: "}${p.label}`, `${fmt(m)}${p.invocations > 1 ? ` (${p.invocations}×)` : ""}`);
  }
  put(col, "  rest of issue() (tables, x copy, CPU share, ticket)", fmt(Math.max(0, issueMed - issueParts)));
  put(col, "**take() total, JS only (y copy, unpin)**", `**${fmt(takeMed)}** (p90 ${fmt(percentile(plain.take, 90))})`);
  put(col, "  rest of take() (y copy, checks)", fmt(Math.max(0, takeMed - takeParts)));
  put(col, "V8 heap bytes per call (Deno only)", plain.bytes === undefined ? "—" : fmt(plain.bytes));
  while (restore.length) restore.pop()!();
  phases.length = 0;
});
stubGpu(false);
if (realCalls > 0) {
  sizes.forEach((_S, k) => {
    const inp = inps[k]!, col = cols[k]!;
    const submitUs: number[] = [];
    gpuTickets.forEach((t, i) => {
      const submit = realGpu[i]!.submit;
      for (const m of MODES) {
        const sub = t.submissions[m];
        sub.submit = () => {
          const a = now();
          submit.call(sub);
          submitUs.push((now() - a) * 1e3);
        };
      }
    });
    run(inp, Math.min(realCalls, 3));
    submitUs.length = 0;
    const real = run(inp, realCalls);
    gpuTickets.forEach((t, i) => MODES.forEach((m) => (t.submissions[m].submit = realGpu[i]!.submit)));
    put(col, "vkQueueSubmit (real, alone)", fmt(median(submitUs)));
    put(col, "issue() with the real submit", fmt(median(real.issue)));
    put(col, "take() with the real wait", fmt(median(real.take)));
  });
}
for (const label of rowOrder) out.push([label, ...cols.map((c) => c.get(label) ?? "—")]);
console.log(`timer overhead subtracted: ${fmt(overheadUs * 1e3)} ns per wrapped call`);
console.log(formatTable(out));
