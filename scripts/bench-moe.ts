// MoE layer benchmark: per-layer time of MoeBackend.forward for S = 1, 4, 16, 64 tokens, with the
// routed experts spread over enough layers (each layer its own device copy, calls rotating through
// the layers) that the experts one pass touches are several times the GPU's last-level cache.
// One table per shape (Qwen3-30B-A3B; a Qwen3.6-35B-A3B-like shape with a shared expert) giving,
// from one run:
//   host µs     host-observed time of forward() (issue + submit + fence wait + read back), median;
//               with the backend's defaults (2 tickets, fused calls pre-launched)
//   not pre-launched  the same calls right after with pre-launch off: each submitted when made
//   GPU µs      GPU timestamps around the layer's own recorded command buffer, median
//   GB/s        expert bytes read per call ÷ GPU time (median over calls), and its share of the
//               device read bandwidth measured in the same run (streaming-read kernel)
//   efficiency  (expert bytes ÷ read bandwidth + empty submit+wait round trip) ÷ host µs, median;
//               the round trip is an empty recorded command buffer, the faster of blocking in
//               vkWaitForFences and polling vkGetFenceStatus (both printed); measured again after
//               each S's timed calls, with a warning when it moved by over half (the host changed
//               speed mid-run: that S's host µs and efficiency are not comparable)
//   hot GPU µs  GPU time with one fixed routing reused every call at one layer: that working set
//               can sit in the GPU cache (its size is printed; at large S it does not fit)
//   FFI/call    Vulkan FFI calls per forward() (countCalls), and how many are vkGetFenceStatus polls
//   clocks      a GPU left idle lowers its clocks, and this light load does not raise them again (an
//               H200 stayed near 345-390 MHz: a layer call took ~2.5x longer). So ~0.5 s of
//               streaming reads precede the bandwidth measurement and each S's timed calls, and one
//               S=1 figure is taken before any warm-up ("idle clocks") and printed beside the table
//   CPU µs      the CPU fallback (VKMOE_GPU=0 path) on the first calls; GPU speedup = CPU µs ÷
//               host µs; NMSE of the GPU outputs against the CPU fallback's on those calls
//   bun scripts/bench-moe.ts [--quick] [--tokens N] [--layers N]
//     --tokens N  passes over all layers per S (each pass: one call per layer); default 8, --quick 2
//     --layers N  layers to rotate through; default: 48 where the device budget holds them
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { describeKernelPlan, planKernels } from "../src/kernels/setup.ts";
import { MoeBackend, type MoeOptions } from "../src/moe/backend.ts";
import type { ExpertWeights } from "../src/moe/reference.ts";
import type { Routing } from "../src/moe/routing.ts";
import { hostAvailableBytes } from "../src/pool/budget.ts";
import { describeDevice, formatDriverVersion } from "../src/vk/banner.ts";
import { Args, fail, oneLine, runtimeName } from "./lib/cli.ts";
import { emptyRoundTrip, LayerTimer, readBandwidth, withCallCounter, type ReadBandwidth, type RoundTrip } from "./lib/gpu-time.ts";
import { NmseAccumulator, preloadExperts } from "./lib/moe-setup.ts";
import { formatBytes, Progress } from "./lib/progress.ts";
import {
  distinctExperts, expertBytes, expertShapeOf, expertsPerLayer, QWEN3_30B_A3B, QWEN36_35B_A3B, randomActivations, randomExpert,
  RoutingGenerator, type ModelShape,
} from "./lib/synthetic.ts";
import { fmt, formatTable, median, percentile } from "./lib/table.ts";

const SCRIPT = "bench-moe";
const SIZES = [1, 4, 16, 64];
const MAX_LAYERS = 48;
const MB = 1e6;

const opts = new Args(SCRIPT, { flags: ["--quick"], ints: ["--tokens", "--layers"] });
const quick = opts.flag("--quick");
const tokensArg = opts.int("--tokens", 1, 10_000);
const layersArg = opts.int("--layers", 1, 4096);

interface Row {
  S: number;
  experts: number;
  bytes: number;
  hostUs: number[];
  /** Host µs of the same calls with pre-launch off (fused calls, where the layer pre-launches). */
  submittedUs: number[];
  gpuUs: number[];
  gbs: number[];
  efficiency: number[];
  hotUs: number[];
  hotBytes: number;
  ffi: number;
  polls: number;
  ffiNames: string;
  cpuUs: number[];
  nmse: number;
}

interface ShapeResult {
  /** The backend's wait style, tickets, and its "GPU: ..., addressing, path" line. */
  wait: string;
  tickets: number;
  path: string;
  /** "name, driver info (driver version)", or why there is no GPU. */
  device: string;
  lines: string[];
  table: string;
}

function benchShape(model: ModelShape, env: VkmoeEnv, first: boolean): ShapeResult {
  const shape = expertShapeOf(model);
  const D = model.hidden;
  const perExpert = expertBytes(model);
  const perLayer = expertsPerLayer(model);
  const E = model.experts;

  // Host weights: one copy of each expert id, shared by every layer (each layer still gets its
  // own device copy). The CPU fallback reads these E experts (hundreds of MB, past host caches).
  if (hostAvailableBytes() < 2 * perLayer * perExpert) throw new Error(`not enough host memory for ${formatBytes(perLayer * perExpert)} of host experts`);
  const gen = new Progress(`${model.name}: generating host experts`, perLayer, "experts", perExpert);
  const host: ExpertWeights[] = [];
  for (let e = 0; e < perLayer; e++) {
    host.push(randomExpert(shape, e));
    gen.tick();
  }
  gen.finish();
  const weights = (_l: number, e: number) => host[e]!;
  const options: MoeOptions = { shape, experts: E, topK: model.topK, layers: layersArg ?? MAX_LAYERS, shared: model.shared, weights };
  using gpu = MoeBackend.open(options, env);
  using cpu = MoeBackend.open({ ...options, log: () => {} }, { ...env, VKMOE_GPU: false });
  const ctx = gpu.context;
  const lines: string[] = [];
  const isCpuDevice = ctx?.device.info.type === 4;

  // Layers: as many as asked (48 by default) within the device budget.
  let layers = layersArg ?? MAX_LAYERS;
  if (ctx) {
    const budget = gpu.pool!.cache.stats().budget;
    const fit = Math.floor((0.95 * budget) / (perLayer * perExpert));
    if (fit < 1) throw new Error(`the device budget (${formatBytes(budget)}) does not hold one layer of experts (${formatBytes(perLayer * perExpert)})`);
    if (layersArg === undefined) {
      layers = Math.min(layers, fit, isCpuDevice ? (quick ? 2 : 3) : MAX_LAYERS);
      if (layers < MAX_LAYERS) lines.push(`${layers} layers instead of ${MAX_LAYERS}: ${isCpuDevice ? "a CPU (software) Vulkan device" : `device budget ${formatBytes(budget)}`}`);
    }
    if (first) {
      console.log(describeDevice(ctx.device.info).slice(0, 2).join("\n"));
      console.log(describeKernelPlan(planKernels(ctx.device, env)).join("\n"));
    }
  } else {
    lines.push(`GPU: none (${gpu.why}); CPU fallback only`);
  }
  const touchedPerPass = layers * (model.topK + (model.shared ? 1 : 0)) * perExpert;
  if (ctx) lines.push(`${layers} layer${layers === 1 ? "" : "s"} rotated, ${formatBytes(layers * perLayer * perExpert)} of experts resident; a pass over the layers at S=1 touches ${formatBytes(touchedPerPass)}`);
  if (ctx && !isCpuDevice && touchedPerPass < 300 * MB) lines.push(`warning: under 300 MB touched per pass: experts may be served from the GPU cache (use more --layers)`);

  let bw: ReadBandwidth | undefined;
  let rtt: RoundTrip = { wait: [], spin: [] };
  /** The empty round trip the efficiency uses: the faster of the two wait styles (medians). */
  let floorUs = NaN;
  let timer: LayerTimer | undefined;
  /** Streaming reads for ~0.5 s: the GPU's clocks up before a measurement (none on a CPU device). */
  const warmUp = () => {
    if (ctx && !isCpuDevice) readBandwidth(ctx.device, 1024 * 2 ** 20, 150);
  };
  if (ctx) {
    const pre = preloadExperts(gpu, layers, perLayer, weights);
    if (pre.notResident > 0) lines.push(`warning: ${pre.notResident} experts did not fit the device budget and run on the CPU`);
    if (!isCpuDevice) {
      // Idle clocks: S=1 calls right after the upload, before anything has raised the clocks.
      const r = new RoutingGenerator(model, 0x1d1e + E);
      const x = randomActivations(1, D, 99);
      const y = new Float32Array(D);
      const us: number[] = [];
      for (let i = 0; i < 2 * layers; i++) {
        const t0 = performance.now();
        gpu.forward(i % layers, x, r.next(1), y);
        if (i >= layers) us.push((performance.now() - t0) * 1e3);
      }
      lines.push(`idle clocks (after the upload, before any warm-up): S=1 host ${fmt(median(us))} µs median over ${us.length} calls`);
    }
    warmUp();
    bw = readBandwidth(ctx.device, isCpuDevice ? 64 * 2 ** 20 : 1024 * 2 ** 20, quick || isCpuDevice ? 3 : 7);
    rtt = emptyRoundTrip(ctx.device, isCpuDevice ? 50 : 500);
    floorUs = Math.min(median(rtt.wait), median(rtt.spin));
    const describe = (xs: number[]) => `${fmt(median(xs))} µs median (min ${fmt(Math.min(...xs))}, p90 ${fmt(percentile(xs, 90))})`;
    lines.push(`read bandwidth ${fmt(bw.gbs)} GB/s (stream_read over ${formatBytes(bw.bytes)} x${bw.passes}, best of runs)`);
    lines.push(`empty submit+wait round trip: vkWaitForFences ${describe(rtt.wait)}; polling vkGetFenceStatus ${describe(rtt.spin)}`);
    timer = new LayerTimer(gpu);
  }

  const rows: Row[] = [];
  const router = new RoutingGenerator(model, 0xbe7c4 + E);
  // Lavapipe runs the grouped kernels on the host's cores: one S=64 call takes tens of seconds.
  const sizes = isCpuDevice && quick ? SIZES.filter((S) => S <= 4) : SIZES;
  if (sizes.length < SIZES.length) lines.push(`S=${SIZES.filter((S) => !sizes.includes(S)).join(", ")} skipped: --quick on a CPU (software) Vulkan device`);
  try {
    for (const S of sizes) {
      // On a CPU device a call at S=64 takes tens of seconds: one call per phase there.
      const passes = tokensArg ?? (quick ? 2 : 8);
      const calls = isCpuDevice ? Math.min(passes * layers, quick ? 1 : 2) : passes * layers;
      const plan: { layer: number; r: Routing }[] = Array.from({ length: calls }, (_, i) => ({ layer: i % layers, r: router.next(S) }));
      const xs = Array.from({ length: 4 }, (_, i) => randomActivations(S, D, 17 * S + i));
      const y = new Float32Array(S * D);
      const bar = ctx ? new Progress(`${model.name}: S=${S}`, calls, "calls") : undefined;
      const bytesOf = (r: Routing) => distinctExperts(r, model.shared) * perExpert;
      const row: Row = {
        S, experts: 0, bytes: 0, hostUs: [], submittedUs: [], gpuUs: [], gbs: [], efficiency: [], hotUs: [], hotBytes: bytesOf(plan[0]!.r), ffi: NaN, polls: NaN, ffiNames: "", cpuUs: [], nmse: NaN,
      };
      row.experts = plan.reduce((s, c) => s + distinctExperts(c.r, model.shared), 0) / calls;
      row.bytes = row.experts * perExpert;
      const keep = Math.min(calls, 16);
      const gpuY: Float32Array[] = [];
      if (ctx && timer && bw) {
        warmUp();
        // Warm-up: one pass (pipelines, first-touch, JIT), untimed.
        const warm = isCpuDevice ? (S === 1 ? 1 : 0) : Math.min(calls, layers);
        for (let i = 0; i < warm; i++) gpu.forward(plan[i]!.layer, xs[i % 4]!, plan[i]!.r, y);
        // Host-observed time, the layer's own submission.
        for (let i = 0; i < calls; i++) {
          const c = plan[i]!;
          const t0 = performance.now();
          gpu.forward(c.layer, xs[i % 4]!, c.r, y);
          const us = (performance.now() - t0) * 1e3;
          row.hostUs.push(us);
          row.efficiency.push((bytesOf(c.r) / bw.gbs / 1e3 + floorUs) / us);
          if (i < keep) gpuY.push(y.slice());
          bar?.tick();
        }
        // The same calls submitted when made (pre-launch off): what pre-launch saves, in this run.
        const layer = (gpu as unknown as { gpu?: { layer?: { prelaunched: boolean; setPrelaunch(on: boolean): void } } }).gpu?.layer;
        if (layer?.prelaunched && S <= gpu.fusedTokens) {
          layer.setPrelaunch(false);
          for (let i = 0; i < calls; i++) {
            const c = plan[i]!;
            const t0 = performance.now();
            gpu.forward(c.layer, xs[i % 4]!, c.r, y);
            row.submittedUs.push((performance.now() - t0) * 1e3);
          }
          layer.setPrelaunch(true);
        }
        // The host's state can change within a run (this H200's shared host sometimes slows every
        // host step 3-4x for a while): an empty round trip right after this S's timed calls, against
        // the one the efficiency uses (nothing is armed here). Flagged when it moved by over half.
        if (!isCpuDevice) {
          const now = median(emptyRoundTrip(ctx.device, 100).spin);
          const start = median(rtt.spin);
          if (Math.abs(now - start) > 0.5 * start) {
            lines.push(`warning: at S=${S} the empty round trip (polled) measured ${fmt(now)} µs against ${fmt(start)} µs at the start: the host changed speed during this run, so its host µs and efficiency are not comparable (rerun)`);
          }
        }
        // GPU time of the same calls: the same command buffer between two timestamps.
        timer.on();
        for (let i = 0; i < calls; i++) {
          const c = plan[i]!;
          gpu.forward(c.layer, xs[i % 4]!, c.r, y);
          const ns = timer.lastNs();
          row.gpuUs.push(ns / 1e3);
          row.gbs.push(bytesOf(c.r) / ns);
        }
        // Hot: one fixed routing at one layer, every call.
        const hotCalls = isCpuDevice ? 1 : Math.min(Math.max(calls, 20), 100);
        if (!isCpuDevice) gpu.forward(plan[0]!.layer, xs[0]!, plan[0]!.r, y);
        for (let i = 0; i < hotCalls; i++) {
          gpu.forward(plan[0]!.layer, xs[0]!, plan[0]!.r, y);
          row.hotUs.push(timer.lastNs() / 1e3);
        }
        timer.off();
        // FFI calls per forward(), counted on the loader's table, then unwrapped.
        const counted = Math.min(calls, isCpuDevice ? 1 : 50);
        withCallCounter(ctx.device.vk, (counter) => {
          counter.reset();
          for (let i = 0; i < counted; i++) gpu.forward(plan[i]!.layer, xs[i % 4]!, plan[i]!.r, y);
          row.ffi = counter.total() / counted;
          row.polls = (counter.counts.get("vkGetFenceStatus") ?? 0) / counted;
          row.ffiNames = [...counter.counts].sort((a, b) => b[1] - a[1]).map(([n, k]) => `${n} ${fmt(k / counted)}`).join(", ");
        });
      }
      // The CPU fallback on the same calls (and inputs), for a bounded time.
      const check = new NmseAccumulator();
      const cpuBudgetMs = quick || isCpuDevice ? 500 : 2000;
      if (S === sizes[0]) cpu.forward(plan[calls - 1]!.layer, xs[3]!, router.next(S), y); // JIT and first touch, untimed
      const t0 = performance.now();
      for (let i = 0; i < (ctx ? keep : calls); i++) {
        const c = plan[i]!;
        const t = performance.now();
        cpu.forward(c.layer, xs[i % 4]!, c.r, y);
        row.cpuUs.push((performance.now() - t) * 1e3);
        if (gpuY[i]) check.add(y, gpuY[i]!);
        if (performance.now() - t0 > cpuBudgetMs) break;
      }
      row.nmse = ctx ? check.value : NaN;
      bar?.finish();
      rows.push(row);
    }
  } finally {
    timer?.[Symbol.dispose]();
  }

  const head = ["S", "experts/call", "MB/call", "host µs", "host p90", "not pre-launched", "GPU µs", "GB/s", "of read BW", "efficiency", "hot GPU µs", "hot set MB", "FFI/call", "of which polls", "CPU µs", "GPU speedup", "NMSE vs CPU"];
  const table = formatTable([head, ...rows.map((r) => {
    const host = median(r.hostUs), g = median(r.gpuUs), cpuUs = median(r.cpuUs);
    return [
      String(r.S), fmt(r.experts), fmt(r.bytes / MB), fmt(host), fmt(percentile(r.hostUs, 90)), r.submittedUs.length ? fmt(median(r.submittedUs)) : "—", fmt(g), fmt(median(r.gbs)),
      bw ? `${fmt((100 * median(r.gbs)) / bw.gbs, 2)}%` : "—", ctx ? `${fmt(100 * median(r.efficiency), 2)}%` : "—",
      fmt(median(r.hotUs)), ctx ? fmt(r.hotBytes / MB) : "—", fmt(r.ffi), fmt(r.polls), fmt(cpuUs), ctx ? `${fmt(cpuUs / host)}x` : "—", Number.isFinite(r.nmse) ? r.nmse.toExponential(1) : "—",
    ];
  })]);
  for (const r of rows) if (r.ffiNames) lines.push(`FFI calls per forward() at S=${r.S}: ${r.ffiNames}`);
  const samples = rows.map((r) => `S=${r.S}: ${r.hostUs.length || r.cpuUs.length} calls${r.cpuUs.length ? ` (CPU ${r.cpuUs.length})` : ""}`).join(", ");
  lines.push(`samples: ${samples}`);
  const d = ctx?.device.info;
  const device = d ? `${d.name}, ${d.driverName} ${d.driverInfo} (driver ${formatDriverVersion(d)})` : `no GPU (${gpu.why})`;
  return { device, lines, table, wait: gpu.options.wait, tickets: gpu.options.tickets, path: gpu.why };
}

function main(): void {
  let env: VkmoeEnv;
  try {
    env = readConfig();
  } catch (e) {
    fail(SCRIPT, oneLine(e));
  }
  const date = new Date().toISOString().slice(0, 10);
  console.log(`bench-moe (${runtimeName}) ${date}${quick ? " --quick" : ""}`);
  let first = true;
  for (const model of [QWEN3_30B_A3B, QWEN36_35B_A3B]) {
    const r = benchShape(model, env, first);
    first = false;
    console.log(`\n### ${model.name}: D=${model.hidden}, I=${model.intermediate}, E=${model.experts}, top-${model.topK}${model.shared ? " + shared expert" : ""}; q4 group 32, f16 scales, ${formatBytes(expertBytes(model))} per expert`);
    console.log(`${date} ${r.device}; ${runtimeName}; forward() per call (synchronous, ${r.tickets} tickets, ${r.wait} wait), layers rotating; ${r.path}`);
    for (const l of r.lines) console.log(l);
    console.log(r.table);
  }
  console.log(`\nmedians over calls. efficiency = (expert bytes ÷ read bandwidth + empty submit+wait, the faster wait style) ÷ host µs: 100% would be a call costing one bare round trip plus reading its experts at streaming speed. polls = vkGetFenceStatus calls of the layer's spin-then-sleep wait. not pre-launched = host µs of the same calls, right after, with pre-launch off (each call submitted when made).`);
}

try {
  main();
} catch (e) {
  fail(SCRIPT, oneLine(e));
}
