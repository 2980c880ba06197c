// Where the time of one MoE layer call goes on this device (Qwen3-30B-A3B shape), for each call
// mode (grouped, fused): GPU time of each stage (timestamps between the layer's own recorded
// dispatches) with the experts in L2 and in DRAM (after a streaming read that evicts the L2), the
// same commands replayed back to back in one submission (the GPU busy, no launch gaps), and the
// host side of forward() (issue, wait, take, and the phases of a spin wait).
// It reaches GpuLayer internals (tickets, pipelines, push constants) like scripts/lib/gpu-time.ts.
//   bun scripts/profile-moe.ts [--layers N] [--tokens S,...] [--calls N] [--warm] [--sweep] [--kernel WG,ROWS,COLT,LANES]
import { readConfig } from "../src/config.ts";
import { MoeBackend } from "../src/moe/backend.ts";
import { CommandPool, Fence, QueryPool, Submission, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, type CommandBuffer } from "../src/vk/index.ts";
import { args, runtimeName } from "./lib/cli.ts";
import { CacheFlusher, emptyRoundTrip, readBandwidth, submitPollUs, timeOnGpu } from "./lib/gpu-time.ts";
import { preloadExperts } from "./lib/moe-setup.ts";
import { expertShapeOf, QWEN3_30B_A3B, randomActivations, randomExpert, RoutingGenerator } from "./lib/synthetic.ts";
import { fmt, median, percentile } from "./lib/table.ts";

const argv = args();
const opt = (name: string, dflt: string) => (argv.includes(name) ? argv[argv.indexOf(name) + 1]! : dflt);
const layers = Number(opt("--layers", "4"));
/** Timed forward() calls per (mode, wait style); fewer for a quick check on a slow device. */
const calls = Number(opt("--calls", "300"));
const sizes = opt("--tokens", "1,16").split(",").map(Number);
const kernelArg = argv.includes("--kernel") ? opt("--kernel", "").split(",").map(Number) : undefined;
const kernel = kernelArg ? { workgroupSize: kernelArg[0]!, rowsPerWorkgroup: kernelArg[1]!, colThreads: kernelArg[2]!, rowLanes: kernelArg[3]! } : undefined;

const model = QWEN3_30B_A3B;
const shape = expertShapeOf(model);
const host = Array.from({ length: model.experts }, (_, e) => randomExpert(shape, e + 1));
const weights = (_l: number, e: number) => host[e]!;
const env = readConfig();
using moe = MoeBackend.open({ shape, experts: model.experts, topK: model.topK, layers, weights, tickets: 1, kernel, log: () => {} }, env);
const ctx = moe.context;
if (!ctx) throw new Error(`no GPU: ${moe.why}`);
preloadExperts(moe, layers, model.experts, weights);
const device = ctx.device;
if (argv.includes("--warm")) {
  // Keeps the GPU busy ~1 s (streaming reads) right before measuring: tells clock ramp-up apart from kernel cost.
  const t = performance.now();
  const bw = readBandwidth(device, 1 << 30, 300);
  console.log(`warm-up: streaming reads for ${fmt(performance.now() - t)} ms (${fmt(bw.gbs)} GB/s)`);
}
const period = device.info.limits.timestampPeriod;
const L = (moe as any).gpu.layer;
const t0 = L.tickets[0];
const p = L.pipelines;
console.log(`profile-moe (${runtimeName}) ${device.info.name}, ${layers} layers, kernel ${JSON.stringify(kernel ?? "table")}, ${moe.why}`);

using pool = new CommandPool(device);
using fence = new Fence(device);
using flusher = new CacheFlusher(device);
type Mode = "grouped" | "fused";
const MODES: Mode[] = p.fused ? ["grouped", "fused"] : ["grouped"];
const fusedDefault: number = L.fusedTokens;
/** One call's dispatches of `mode` on ticket 0 (the layer's own recording), `mark(i)` after dispatch i. */
const stages = (cb: CommandBuffer, mode: Mode, mark?: (i: number) => void) => {
  cb.barrier("transferToCompute");
  L.recordCall(cb, t0, mode, mark);
  cb.barrier("computeToCompute");
};
const stageNames = (mode: Mode) => mode === "fused" ? ["fused"] : [...(p.quantize ? ["quantize"] : []), "gate+up", "down", "sum"];

/** Wraps `obj[name]` with a timer adding µs to `into[key]` (host phases of forward()). */
function timePhase(obj: any, name: string, into: Record<string, number[]>, key: string): () => void {
  const original = obj[name];
  into[key] = [];
  obj[name] = function (this: unknown, ...a: unknown[]) {
    const t = performance.now();
    const r = original.apply(this, a);
    into[key]!.push((performance.now() - t) * 1e3);
    return r;
  };
  return () => { obj[name] = original; };
}

for (const S of sizes) {
  if (argv.includes("--warm")) readBandwidth(device, 1 << 30, 150); // clocks up again before each S
  const gen = new RoutingGenerator(model, 11 + S);
  const x = randomActivations(S, shape.hidden, 5);
  const y = new Float32Array(S * shape.hidden);
  // Host side of forward(): issue (JS + submit), take (wait + read y), per call mode and wait style;
  // for "spin", the phases: vkQueueSubmit, the poll until the completion word, vkWaitForFences, vkResetFences.
  for (const mode of MODES) {
    L.fusedTokens = mode === "fused" ? 64 : 0;
    for (const style of ["block", "spin"] as const) {
      L.waitStyle = style;
      const phases: Record<string, number[]> = {};
      const undo = style === "spin" ? [
        timePhase(t0.submissions[mode], "submit", phases, "submit"), timePhase(L, "spinOnCompletionWord", phases, "poll"),
        timePhase(L, "pollFence", phases, "fence polls"), timePhase(t0.fence, "wait", phases, "fence wait"), timePhase(t0.fence, "reset", phases, "fence reset"),
      ] : [];
      const issueUs: number[] = [], takeUs: number[] = [], totalUs: number[] = [];
      for (let i = 0; i < calls + layers; i++) {
        const r = gen.next(S);
        const a = performance.now();
        const t = moe.issue(i % layers, x, r);
        const b = performance.now();
        t.take(y);
        const c = performance.now();
        if (i >= layers) { issueUs.push((b - a) * 1e3); takeUs.push((c - b) * 1e3); totalUs.push((c - a) * 1e3); }
      }
      undo.forEach((f) => f());
      const phaseText = Object.entries(phases).map(([k, v]) => `${k} ${fmt(median(v.slice(layers)))}`).join(", ");
      console.log(`S=${S} ${mode} host, ${style} wait: forward ${fmt(median(totalUs))} µs = issue ${fmt(median(issueUs))} + take ${fmt(median(takeUs))}${phaseText ? ` (${phaseText})` : ""}`);
    }
  }
  // From the completion word to the fence: vkGetFenceStatus polled without pause after the word.
  for (const mode of MODES) {
    L.fusedTokens = mode === "fused" ? 64 : 0;
    const gapUs: number[] = [], polls: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t = moe.issue(i % layers, x, gen.next(S));
      const word = t0.views.done;
      while (Atomics.load(word, 0) !== t0.seq) { /* the GPU writes it */ }
      const a = performance.now();
      let n = 1;
      while (!t0.fence.signaled()) n++;
      gapUs.push((performance.now() - a) * 1e3);
      polls.push(n);
      t.take(y);
    }
    console.log(`S=${S} ${mode}: completion word to fence signaled ${fmt(median(gapUs))} µs (p90 ${fmt(percentile(gapUs, 90))}), ${fmt(median(polls))} vkGetFenceStatus polls (p90 ${fmt(percentile(polls, 90))})`);
  }
  L.waitStyle = "block";
  L.fusedTokens = fusedDefault;
  {
    const rt = emptyRoundTrip(device, 300);
    console.log(`empty submit+wait: vkWaitForFences ${fmt(median(rt.wait))} µs, polling vkGetFenceStatus ${fmt(median(rt.spin))} µs`);
    // The same with one tiny dispatch (the sum kernel, one workgroup: writes y in host memory), then
    // with three dispatches of one workgroup and barriers between them: the fixed cost of real work.
    for (const [label, record] of [
      ["1 dispatch of 1 workgroup", (cb: CommandBuffer) => cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, L.pushSum).dispatch(1)],
      ["3 dispatches of 1 workgroup + barriers", (cb: CommandBuffer) => {
        cb.bind(p.gateUp, t0.sets.gateUp).pushConstants(p.gateUp, L.pushGateUp).dispatch(1).barrier("computeToCompute");
        cb.bind(p.down, t0.sets.down).pushConstants(p.down, L.pushDown).dispatch(1).barrier("computeToCompute");
        cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, L.pushSum).dispatch(1).barrier("computeToHost");
      }],
    ] as const) {
      const cb = pool.allocate().begin();
      record(cb);
      cb.end();
      using sub = new Submission(device, [cb], { fence });
      console.log(`submit+poll with ${label}: ${fmt(median(submitPollUs(sub, fence, 280)))} µs`);
    }
    // The layer's own command buffers with every indirect group count 0: their fixed cost (indirect
    // reads, barriers) without work. The next forward() rewrites the counts.
    for (const mode of MODES) {
      const saved = t0.views.indirect.slice();
      t0.views.indirect.fill(0);
      const us = submitPollUs(t0.submissions[mode], t0.fence, 280);
      t0.views.indirect.set(saved);
      console.log(`submit+poll of the layer's ${mode} command buffer with zero workgroups: ${fmt(median(us))} µs`);
    }
  }
  // The ticket now holds the last call's inputs (work list, slot tables, indirect counts), whose
  // mode was the default's. Fill both modes' counts for this S, then time each stage.
  {
    const items = t0.views.work[2], slotsPerToken = t0.views.work[1]; // (a script may read write-combined memory)
    L.submit(t0, x, S, slotsPerToken, items); L.wait(t0);
    for (const mode of MODES) {
      using q = new QueryPool(device, stageNames(mode).length + 1); // every query written: results() waits for all
      const names = stageNames(mode);
      const cb = pool.allocate().begin().resetQueries(q).timestamp(q, 0, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT);
      stages(cb, mode, (i) => cb.timestamp(q, i + 1, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT));
      cb.end();
      using sub = new Submission(device, [cb], { fence });
      // Odd samples run right after a streaming read that evicts the L2 (experts in DRAM, as in a
      // decode over many layers), even ones right after the previous call (experts in L2).
      const parts: number[][][] = [0, 1].map(() => names.map(() => []));
      const total: number[][] = [[], []];
      for (let i = 0; i < 100; i++) {
        const cold = i % 2;
        if (cold) flusher.flush();
        sub.submit(); fence.wait(); fence.reset();
        const ts = q.results();
        names.forEach((_, k) => parts[cold]![k]!.push(Number(ts[k + 1]! - ts[k]!) * period / 1e3));
        total[cold]!.push(Number(ts[names.length]! - ts[0]!) * period / 1e3);
      }
      for (const cold of [0, 1]) {
        console.log(`S=${S} ${mode}, one call per submit, experts in ${cold ? "DRAM" : "L2"}, GPU µs: ${names.map((n, k) => `${n} ${fmt(median(parts[cold]![k]!))}`).join(", ")}, total ${fmt(median(total[cold]!))}`);
      }
    }
  }
  for (const mode of MODES) for (const reps of [10, 100]) {
    const perCall = timeOnGpu(device, (cb) => { for (let i = 0; i < reps; i++) stages(cb, mode); }, 10) / reps / 1e3;
    console.log(`S=${S} ${mode} ${reps} calls back to back in one submit: ${fmt(perCall)} µs per call (same experts, best of 10 submits)`);
  }
}

// --sweep: GPU µs of each MoE GEMV kernel alone for several workgroup shapes, on the last call's
// work list (same descriptor sets: the pipelines' set layouts are identically defined). Each
// kernel runs REPS times back to back (barriers between) in one submission, best of 13, so the
// GPU clocks are up: these are kernel costs, not the single-call latency above.
if (argv.includes("--sweep")) {
  const { createMoePipelines } = await import("../src/moe/shaders.ts");
  const { chooseMoeKernelConfig } = await import("../src/kernels/tuning.ts");
  const base = chooseMoeKernelConfig(device.info);
  const items = t0.views.work[2];
  const REPS = 20;
  const shapes: [number, number, number, number][] = [
    [32, 2, 0, 1], [32, 4, 0, 1], [32, 8, 0, 1], [32, 4, 16, 2], [32, 8, 16, 2], [32, 8, 8, 4], [32, 16, 8, 4],
    [64, 4, 0, 1], [64, 8, 32, 2], [64, 16, 8, 8], [128, 16, 16, 8], [128, 8, 32, 4],
  ];
  const timeReps = (record: (cb: CommandBuffer) => void): number =>
    timeOnGpu(device, (cb) => { for (let i = 0; i < REPS; i++) { record(cb); cb.barrier("computeToCompute"); } }, 13) / REPS / 1e3;
  const pathName = p.path;
  if (p.quantize) console.log(`sweep quantize_act: ${fmt(timeReps((cb) => cb.bind(p.quantize, t0.sets.quantize).pushConstants(p.quantize, L.pushQuantize).dispatchIndirect(t0.indirect, 36n)))} µs`);
  console.log(`sweep sum: ${fmt(timeReps((cb) => cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, L.pushSum).dispatchIndirect(t0.indirect, 24n)))} µs`);
  console.log(`sweep empty dispatch (sum with 1 workgroup): ${fmt(timeReps((cb) => cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, L.pushSum).dispatch(1)))} µs`);
  for (const [wg, rows, colThreads, rowLanes] of shapes) {
    const config = { ...base, workgroupSize: wg, rowsPerWorkgroup: rows, colThreads, rowLanes };
    using pl = createMoePipelines(device, config, shape, moe.pool!.addressing, pathName);
    const g = timeReps((cb) => cb.bind(pl.gateUp, t0.sets.gateUp).pushConstants(pl.gateUp, L.pushGateUp).dispatch(Math.ceil(shape.intermediate / rows), items));
    const d = timeReps((cb) => cb.bind(pl.down, t0.sets.down).pushConstants(pl.down, L.pushDown).dispatch(Math.ceil(shape.hidden / pl.downBlockRows), items));
    console.log(`sweep ${pathName} WG ${wg} rows ${rows} colThreads ${colThreads} rowLanes ${rowLanes} (S=${sizes.at(-1)}, ${items} experts): gate+up ${fmt(g)} µs, down ${fmt(d)} µs (down: its own shape, DOWN_KERNEL)`);
  }
  // The one-dispatch fused kernel per shape (rows = the block of I each workgroup owns).
  const fusedShapes: [number, number, number, number][] = [
    [256, 32, 32, 8], [128, 32, 32, 4], [128, 32, 16, 8], [256, 64, 32, 8], [256, 64, 16, 16], [512, 64, 32, 16], [64, 32, 8, 8], [256, 32, 16, 8],
  ];
  if (p.fused) for (const [wg, rows, colThreads, rowLanes] of fusedShapes) {
    if (wg > device.info.limits.maxComputeWorkGroupInvocations) continue;
    using pl = createMoePipelines(device, base, shape, moe.pool!.addressing, pathName, 0, { workgroupSize: wg, rowsPerWorkgroup: rows, colThreads, rowLanes });
    const S = t0.views.work[0], K = t0.views.work[1], slots = S * K;
    const f = timeReps((cb) => cb.bind(pl.fused!, t0.sets.fused).pushConstants(pl.fused!, L.pushFused).dispatch(Math.ceil(shape.intermediate / rows), K, S));
    console.log(`sweep fused WG ${wg} rows ${rows} colThreads ${colThreads} rowLanes ${rowLanes} (S=${sizes.at(-1)}, ${slots} slots): ${fmt(f)} µs`);
  }
}
