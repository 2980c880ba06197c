// Where the time of one MoE layer call goes on this device (Qwen3-30B-A3B shape): GPU time of each
// stage (timestamps between the recorded dispatches), the same commands replayed back to back in
// one submission (the GPU busy, no launch gaps), and the host side of forward() (issue, wait, take).
// It reaches GpuLayer internals (tickets, pipelines, push constants) like scripts/lib/gpu-time.ts.
//   bun scripts/profile-moe.ts [--layers N] [--tokens S] [--kernel WG,ROWS,COLT,LANES]
import { readConfig } from "../src/config.ts";
import { MoeBackend } from "../src/moe/backend.ts";
import { CommandPool, Fence, QueryPool, Submission, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, type CommandBuffer } from "../src/vk/index.ts";
import { args, runtimeName } from "./lib/cli.ts";
import { emptyRoundTrip, readBandwidth, submitPollUs, timeOnGpu } from "./lib/gpu-time.ts";
import { preloadExperts } from "./lib/moe-setup.ts";
import { expertShapeOf, QWEN3_30B_A3B, randomActivations, randomExpert, RoutingGenerator } from "./lib/synthetic.ts";
import { fmt, median } from "./lib/table.ts";

const argv = args();
const opt = (name: string, dflt: string) => (argv.includes(name) ? argv[argv.indexOf(name) + 1]! : dflt);
const layers = Number(opt("--layers", "4"));
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
const stages = (cb: CommandBuffer, q?: QueryPool, base = 0) => {
  cb.barrier("transferToCompute");
  if (p.quantize) cb.bind(p.quantize, t0.sets.quantize).pushConstants(p.quantize, L.pushQuantize).dispatchIndirect(t0.indirect, 36n).barrier("computeToCompute");
  cb.bind(p.gateUp, t0.sets.gateUp).pushConstants(p.gateUp, L.pushGateUp).dispatchIndirect(t0.indirect, 0n);
  if (q) cb.timestamp(q, base + 1, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT);
  cb.barrier("computeToCompute").bind(p.down, t0.sets.down).pushConstants(p.down, L.pushDown).dispatchIndirect(t0.indirect, 12n);
  if (q) cb.timestamp(q, base + 2, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT);
  cb.barrier("computeToCompute").bind(p.sum, t0.sets.sum).pushConstants(p.sum, new Uint32Array([shape.hidden])).dispatchIndirect(t0.indirect, 24n);
  if (q) cb.timestamp(q, base + 3, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT);
  cb.barrier("computeToCompute");
};

for (const S of sizes) {
  const gen = new RoutingGenerator(model, 11 + S);
  const x = randomActivations(S, shape.hidden, 5);
  const y = new Float32Array(S * shape.hidden);
  // Host side of forward(): issue (JS + submit), take (wait + read y), for each wait style.
  for (const style of ["block", "spin"] as const) {
    L.waitStyle = style;
    const issueUs: number[] = [], takeUs: number[] = [], totalUs: number[] = [];
    for (let i = 0; i < 300 + layers; i++) {
      const r = gen.next(S);
      const a = performance.now();
      const t = moe.issue(i % layers, x, r);
      const b = performance.now();
      t.take(y);
      const c = performance.now();
      if (i >= layers) { issueUs.push((b - a) * 1e3); takeUs.push((c - b) * 1e3); totalUs.push((c - a) * 1e3); }
    }
    console.log(`S=${S} host, ${style} wait: forward ${fmt(median(totalUs))} µs = issue ${fmt(median(issueUs))} + take ${fmt(median(takeUs))}`);
  }
  L.waitStyle = "block";
  {
    const rt = emptyRoundTrip(device, 300);
    console.log(`empty submit+wait: vkWaitForFences ${fmt(median(rt.wait))} µs, polling vkGetFenceStatus ${fmt(median(rt.spin))} µs`);
    // The same with one tiny dispatch (the sum kernel, one workgroup: writes y in host memory), then
    // with three dispatches of one workgroup and barriers between them: the fixed cost of real work.
    for (const [label, record] of [
      ["1 dispatch of 1 workgroup", (cb: CommandBuffer) => cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, new Uint32Array([shape.hidden])).dispatch(1)],
      ["3 dispatches of 1 workgroup + barriers", (cb: CommandBuffer) => {
        cb.bind(p.gateUp, t0.sets.gateUp).pushConstants(p.gateUp, L.pushGateUp).dispatch(1).barrier("computeToCompute");
        cb.bind(p.down, t0.sets.down).pushConstants(p.down, L.pushDown).dispatch(1).barrier("computeToCompute");
        cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, new Uint32Array([shape.hidden])).dispatch(1).barrier("computeToHost");
      }],
    ] as const) {
      const cb = pool.allocate().begin();
      record(cb);
      cb.end();
      using sub = new Submission(device, [cb], { fence });
      console.log(`submit+poll with ${label}: ${fmt(median(submitPollUs(sub, fence, 280)))} µs`);
    }
    // The layer's own command buffer with every indirect group count 0: its fixed cost (indirect
    // reads, barriers) without work. The next forward() rewrites the counts.
    {
      const saved = t0.views.indirect.slice();
      t0.views.indirect.fill(0);
      const us = submitPollUs(t0.submission, t0.fence, 280);
      t0.views.indirect.set(saved);
      console.log(`submit+poll of the layer's command buffer with zero workgroups: ${fmt(median(us))} µs`);
    }
  }
  // The ticket now holds the last call's inputs (work list, indirect counts). Stage timestamps:
  {
    using q = new QueryPool(device, 4);
    const cb = pool.allocate().begin().resetQueries(q).timestamp(q, 0, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT);
    stages(cb, q);
    cb.end();
    using sub = new Submission(device, [cb], { fence });
    const parts: number[][] = [[], [], [], []];
    for (let i = 0; i < 100; i++) {
      sub.submit(); fence.wait(); fence.reset();
      const ts = q.results();
      for (let k = 1; k < 4; k++) parts[k - 1]!.push(Number(ts[k]! - ts[k - 1]!) * period / 1e3);
      parts[3]!.push(Number(ts[3]! - ts[0]!) * period / 1e3);
    }
    console.log(`S=${S} one call per submit, GPU µs: ${p.quantize ? "quantize + " : ""}gate+up ${fmt(median(parts[0]!))}, down ${fmt(median(parts[1]!))}, sum ${fmt(median(parts[2]!))}, total ${fmt(median(parts[3]!))}`);
  }
  for (const reps of [10, 100]) {
    const perCall = timeOnGpu(device, (cb) => { for (let i = 0; i < reps; i++) stages(cb); }, 10) / reps / 1e3;
    console.log(`S=${S} ${reps} calls back to back in one submit: ${fmt(perCall)} µs per call (same experts, best of 10 submits)`);
  }
}

// --sweep: GPU µs of each grouped kernel alone for several workgroup shapes, on the last call's
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
  console.log(`sweep sum: ${fmt(timeReps((cb) => cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, new Uint32Array([shape.hidden])).dispatchIndirect(t0.indirect, 24n)))} µs`);
  console.log(`sweep empty dispatch (sum with 1 workgroup): ${fmt(timeReps((cb) => cb.bind(p.sum, t0.sets.sum).pushConstants(p.sum, new Uint32Array([shape.hidden])).dispatch(1)))} µs`);
  for (const [wg, rows, colThreads, rowLanes] of shapes) {
    const config = { ...base, workgroupSize: wg, rowsPerWorkgroup: rows, colThreads, rowLanes };
    using pl = createMoePipelines(device, config, shape, moe.pool!.addressing, pathName);
    const g = timeReps((cb) => cb.bind(pl.gateUp, t0.sets.gateUp).pushConstants(pl.gateUp, L.pushGateUp).dispatch(Math.ceil(shape.intermediate / rows), items));
    const d = timeReps((cb) => cb.bind(pl.down, t0.sets.down).pushConstants(pl.down, L.pushDown).dispatch(Math.ceil(shape.hidden / rows), items));
    console.log(`sweep ${pathName} WG ${wg} rows ${rows} colThreads ${colThreads} rowLanes ${rowLanes} (S=${sizes.at(-1)}, ${items} experts): gate+up ${fmt(g)} µs, down ${fmt(d)} µs`);
  }
}
