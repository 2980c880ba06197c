// Where the host time of one S=1 MoE layer call goes (Qwen3-30B-A3B shape, layers rotating), with
// fused calls pre-launched and then submitted when made, twice each in one run: forward() split at
// the end of GpuLayer.submit (the doorbell rung, or the vkQueueSubmit returned), the end of issue()
// (a pre-launched call also submits the next call's kernel there, while the GPU runs), the
// completion word seen, the fence seen, and take() done. It wraps GpuLayer internals like
// scripts/profile-moe.ts.
//   bun scripts/profile-call.ts [--layers N] [--calls N]
import { readConfig } from "../src/config.ts";
import { MoeBackend } from "../src/moe/backend.ts";
import { Args, fail, runtimeName } from "./lib/cli.ts";
import { readBandwidth } from "./lib/gpu-time.ts";
import { preloadExperts } from "./lib/moe-setup.ts";
import { expertShapeOf, QWEN3_30B_A3B, randomActivations, randomExpert, RoutingGenerator } from "./lib/synthetic.ts";
import { fmt, median } from "./lib/table.ts";

const SCRIPT = "profile-call";
const opts = new Args(SCRIPT, { flags: [], ints: ["--layers", "--calls"] });
const layers = opts.int("--layers", 1, 48) ?? 16;
const calls = opts.int("--calls") ?? 400;
const model = QWEN3_30B_A3B;
const shape = expertShapeOf(model);
const host = Array.from({ length: model.experts }, (_, e) => randomExpert(shape, e + 1));
const weights = (_l: number, e: number) => host[e]!;
using moe = MoeBackend.open({ shape, experts: model.experts, topK: model.topK, layers, weights, log: () => {} }, readConfig());
const ctx = moe.context;
if (!ctx) fail(SCRIPT, `no GPU: ${moe.why}`);
preloadExperts(moe, layers, model.experts, weights);
const L = (moe as any).gpu.layer;
console.log(`profile-call (${runtimeName}) ${ctx.device.info.name}, ${layers} layers, ${moe.why}`);
if (!L.prelaunched) console.log("(this driver does not pre-launch by default: VKMOE_PRELAUNCH=on to measure it)");
const gen = new RoutingGenerator(model, 7);
const xs = Array.from({ length: 4 }, (_, i) => randomActivations(1, shape.hidden, 3 + i));
const y = new Float32Array(shape.hidden);
let tSubmit = NaN, tWord = NaN, tFence = NaN;
/** Marks the time `name` returns (spin and poll: only when they succeed, so a slow device shows "—"). */
const after = (name: string, mark: (t: number) => void, onlyIfTrue = false) => {
  const f = L[name];
  L[name] = function (this: unknown, ...a: unknown[]) { const r = f.apply(this, a); if (!onlyIfTrue || r) mark(performance.now()); return r; };
};
after("submit", (t) => { tSubmit = t; });
after("spinOnCompletionWord", (t) => { tWord = t; }, true);
after("pollFence", (t) => { tFence = t; }, true);
for (const pre of [true, false, true, false]) {
  L.setPrelaunch(pre);
  readBandwidth(ctx.device, 1 << 30, 100); // clocks up
  const rows: number[][] = [];
  const before = { ...L.prelaunchCounts };
  for (let i = 0; i < calls + 50; i++) {
    const r = gen.next(1);
    tSubmit = tWord = tFence = NaN;
    const a = performance.now();
    const t = moe.issue(i % layers, xs[i % 4]!, r);
    const b = performance.now();
    t.take(y);
    const c = performance.now();
    if (i >= 50) rows.push([tSubmit - a, b - tSubmit, tWord - b, tFence - tWord, c - tFence, c - a].map((v) => v * 1e3));
  }
  const m = (k: number) => {
    const v = rows.map((row) => row[k]!).filter(Number.isFinite);
    return v.length > rows.length / 2 ? fmt(median(v)) : "—";
  };
  const n = L.prelaunchCounts;
  console.log(`${L.prelaunched ? "pre-launched" : "submitted   "}: forward ${m(5)} µs = to ${L.prelaunched ? "the doorbell" : "vkQueueSubmit's return"} ${m(0)} + rest of issue ${m(1)} + to the completion word ${m(2)} + to the fence ${m(3)} + take ${m(4)}` +
    (L.prelaunched ? ` (kernels rung ${n.ran - before.ran}, rung too late ${n.gaveUp - before.gaveUp}, cancelled ${n.cancelled - before.cancelled})` : ""));
}
