// vkmoe demo: a synthetic MoE stack with Qwen3-30B-A3B expert shapes (D=2048, I=768, 128 experts,
// top-8, q4 group 32, f16 scales), random tokens routed through every layer on the GPU and on the
// CPU path, the two checked against each other, and tokens/s of MoE work for both.
//   bun scripts/demo.ts [--layers N] [--tokens N]
//   deno run --allow-all scripts/demo.ts [--layers N] [--tokens N]
// Exit status 1 with one line on stderr when anything fails, including a GPU/CPU mismatch.
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { describeKernelPlan, planKernels } from "../src/kernels/setup.ts";
import { MoeBackend, type MoeOptions } from "../src/moe/backend.ts";
import type { ExpertWeights } from "../src/moe/reference.ts";
import type { Routing } from "../src/moe/routing.ts";
import { hostAvailableBytes } from "../src/pool/budget.ts";
import { banner } from "../src/vk/banner.ts";
import { Args, exit, fail, oneLine, runtimeName, writeStderr } from "./lib/cli.ts";
import { NmseAccumulator, preloadExperts, rmsNorm } from "./lib/moe-setup.ts";
import { formatBytes, Progress } from "./lib/progress.ts";
import { expertBytes, expertShapeOf, QWEN3_30B_A3B, randomActivations, randomExpert, RoutingGenerator } from "./lib/synthetic.ts";

const SCRIPT = "demo";
/** GPU vs CPU (float) agreement: float path 1e-6; the integer-dot path quantizes x to int8 for gate+up, bound 1e-3 (the kernels' bound). */
const NMSE_LIMIT = { float: 1e-6, "integer-dot": 1e-3 } as const;
const DEFAULT_LAYERS = 4;
const DEFAULT_TOKENS = 64;
/** On a CPU Vulkan device (Lavapipe) the GPU path is emulated on the same cores: keep it short. */
const CPU_DEVICE_TOKENS = 6;
const CPU_DEVICE_LAYERS = 2;
const WARMUP_TOKENS = 1;

interface Call {
  layer: number;
  x: Float32Array;
  r: Routing;
  y: Float32Array;
}

function main(): number {
  const opts = new Args(SCRIPT, { flags: [], ints: ["--layers", "--tokens"] });
  const model = QWEN3_30B_A3B;
  const shape = expertShapeOf(model);
  const D = model.hidden;
  const perExpert = expertBytes(model);
  const perLayer = model.experts * perExpert;
  const notes: string[] = [];

  let env: VkmoeEnv;
  try {
    env = readConfig();
  } catch (e) {
    fail(SCRIPT, oneLine(e));
  }

  // Layers: host memory holds every expert once (plus the device copy on shared-memory GPUs).
  const requestedLayers = opts.int("--layers", 1, 1024);
  const hostLayers = Math.floor((0.4 * hostAvailableBytes()) / perLayer);
  let layers = requestedLayers ?? Math.min(DEFAULT_LAYERS, hostLayers);
  if (layers < 1) fail(SCRIPT, `not enough host memory for one layer of experts (${formatBytes(perLayer)}; ${formatBytes(hostAvailableBytes())} available)`);
  if (requestedLayers === undefined && layers < DEFAULT_LAYERS) notes.push(`${layers} layers instead of ${DEFAULT_LAYERS}: host memory (${formatBytes(hostAvailableBytes())} available, ${formatBytes(perLayer)} per layer)`);

  const store: ExpertWeights[][] = [];
  const weights = (l: number, e: number): ExpertWeights => {
    const w = store[l]?.[e];
    if (!w) throw new Error(`demo: weights of layer ${l}, expert ${e} were not generated`);
    return w;
  };
  const options: MoeOptions = { shape, experts: model.experts, topK: model.topK, layers, shared: false, weights };

  console.log(`vkmoe demo (${runtimeName}) — synthetic ${model.name} MoE: D=${D}, I=${model.intermediate}, ${model.experts} experts, top-${model.topK}, q4 group 32 f16 scales; ${formatBytes(perExpert)} per expert`);
  using gpu = MoeBackend.open(options, env); // in CPU mode it has printed one line saying why
  const ctx = gpu.context;
  let tokens = opts.int("--tokens", 1, 100_000) ?? DEFAULT_TOKENS;
  if (ctx) {
    console.log(banner(ctx));
    console.log(describeKernelPlan(planKernels(ctx.device, env)).join("\n"));
    const budget = gpu.pool!.cache.stats().budget;
    const fit = Math.floor(budget / perLayer);
    if (requestedLayers === undefined && fit < layers) {
      if (fit < 1) fail(SCRIPT, `the device budget (${formatBytes(budget)}) does not hold one layer of experts (${formatBytes(perLayer)}); set VKMOE_BUDGET_MB or --layers 1 to run hybrid`);
      notes.push(`${fit} layers instead of ${layers}: device budget ${formatBytes(budget)}`);
      layers = fit;
    }
    if (ctx.device.info.type === 4) {
      const cpuDevice = `${ctx.device.info.name} is a CPU (software) Vulkan device`;
      if (opts.int("--tokens", 1) === undefined) {
        tokens = CPU_DEVICE_TOKENS;
        notes.push(`${tokens} tokens instead of ${DEFAULT_TOKENS}: ${cpuDevice} (--tokens N to change)`);
      }
      if (requestedLayers === undefined && layers > CPU_DEVICE_LAYERS) {
        notes.push(`${CPU_DEVICE_LAYERS} layers instead of ${layers}: ${cpuDevice} (--layers N to change)`);
        layers = CPU_DEVICE_LAYERS;
      }
    }
  } else {
    console.log(`GPU: none (${gpu.why}); the CPU path only`);
  }
  for (const n of notes) console.log(`note: ${n}`);
  console.log(`stack: ${layers} layer${layers === 1 ? "" : "s"}, ${formatBytes(layers * perLayer)} of experts; ${tokens} tokens (S=1 decode, each through all ${layers} layer${layers === 1 ? "" : "s"}) after ${WARMUP_TOKENS} warm-up token`);

  // Weights, generated directly as quantized words (see scripts/lib/synthetic.ts).
  const gen = new Progress("generating weights", layers * model.experts, "experts", perExpert);
  for (let l = 0; l < layers; l++) {
    const row: ExpertWeights[] = [];
    for (let e = 0; e < model.experts; e++) {
      row.push(randomExpert(shape, l * model.experts + e));
      gen.tick();
    }
    store.push(row);
  }
  gen.finish();
  const before = gpu.pool?.cache.stats();
  const preload = preloadExperts(gpu, layers, model.experts, weights);
  const afterPreload = gpu.pool?.cache.stats();
  if (ctx && preload.notResident > 0) console.log(`note: ${preload.notResident} experts did not fit the device budget; they run on the CPU (hybrid)`);

  // GPU pass (or the CPU path when there is no GPU): a residual stream through every layer.
  const router = new RoutingGenerator(model, 7);
  const calls: Call[] = [];
  const total = WARMUP_TOKENS + tokens;
  const runBar = new Progress(ctx ? "GPU run" : "CPU run", total, "tokens");
  let gpuMs = 0;
  const h = new Float32Array(D);
  for (let t = 0; t < total; t++) {
    h.set(randomActivations(1, D, 1000 + t));
    for (let l = 0; l < layers; l++) {
      const x = new Float32Array(D);
      rmsNorm(h, x);
      const r = router.next(1);
      const y = new Float32Array(D);
      const t0 = performance.now();
      gpu.forward(l, x, r, y);
      if (t >= WARMUP_TOKENS) gpuMs += performance.now() - t0;
      for (let i = 0; i < D; i++) h[i]! += y[i]!;
      calls.push({ layer: l, x, r, y });
    }
    runBar.tick();
  }
  runBar.finish();
  const gpuStats = gpu.stats();
  const tokPerS = (ms: number) => (tokens / (ms / 1000));

  // The CPU path on the same inputs.
  let cpuMs = NaN;
  const check = new NmseAccumulator();
  if (ctx) {
    using cpu = MoeBackend.open({ ...options, log: () => {} }, { ...env, VKMOE_GPU: false });
    const cpuBar = new Progress("CPU run", total, "tokens");
    const y = new Float32Array(D);
    cpuMs = 0;
    for (let i = 0; i < calls.length; i++) {
      const c = calls[i]!;
      const t0 = performance.now();
      cpu.forward(c.layer, c.x, c.r, y);
      if (i >= WARMUP_TOKENS * layers) cpuMs += performance.now() - t0;
      check.add(y, c.y);
      if (c.layer === layers - 1) cpuBar.tick();
    }
    cpuBar.finish();
  }

  const c = gpuStats.cache;
  const pairs = gpuStats.gpuPairs + gpuStats.cpuPairs;
  console.log("");
  if (ctx) {
    console.log(`GPU path (${ctx.device.info.name}, ${gpu.pool!.addressing} addressing): ${tokPerS(gpuMs).toFixed(1)} tokens/s, ${(gpuMs / tokens).toFixed(2)} ms/token, ${((1000 * gpuMs) / (tokens * layers)).toFixed(0)} µs per layer call`);
    console.log(`CPU path (the f32 fallback, on the same inputs): ${tokPerS(cpuMs).toFixed(1)} tokens/s, ${(cpuMs / tokens).toFixed(2)} ms/token, ${((1000 * cpuMs) / (tokens * layers)).toFixed(0)} µs per layer call`);
    console.log(`speedup over the CPU path: ${(cpuMs / gpuMs).toFixed(2)}x`);
    console.log(`GPU share: ${((100 * gpuStats.gpuPairs) / Math.max(1, pairs)).toFixed(1)}% of (token, expert) pairs (${gpuStats.gpuPairs} on the GPU, ${gpuStats.cpuPairs} on the CPU)`);
  } else {
    console.log(`CPU path (${gpu.why}): ${tokPerS(gpuMs).toFixed(1)} tokens/s, ${(gpuMs / tokens).toFixed(2)} ms/token, ${((1000 * gpuMs) / (tokens * layers)).toFixed(0)} µs per layer call`);
    console.log(`GPU share: 0% (no GPU)`);
  }
  if (c && before && afterPreload) {
    console.log(`cache: preload ${afterPreload.uploads - before.uploads} uploads (${formatBytes(afterPreload.bytesUploaded - before.bytesUploaded)} in ${preload.seconds.toFixed(1)} s, ${formatBytes((afterPreload.bytesUploaded - before.bytesUploaded) / Math.max(preload.seconds, 1e-9))}/s); ` +
      `run ${c.hits - afterPreload.hits} hits, ${c.misses - afterPreload.misses} misses; total ${c.evictions} evictions, ${formatBytes(c.bytesUploaded)} uploaded, ${formatBytes(c.residentBytes)} resident (${c.residentCount} experts) of a ${formatBytes(c.budget)} budget`);
  }
  if (ctx) {
    const v = check.value;
    const limit = NMSE_LIMIT[gpu.gemvPath ?? "float"];
    const line = `check: GPU (${gpu.gemvPath} path) vs CPU path NMSE ${v.toExponential(2)} over ${calls.length} layer calls (worst call ${check.worstCall.toExponential(2)}; limit ${limit.toExponential(0)})`;
    if (!(v <= limit) || !(check.worstCall <= limit)) {
      console.log(`${line}: FAILED`);
      writeStderr(`${SCRIPT}: the GPU and CPU paths disagree: NMSE ${v.toExponential(2)}, worst call ${check.worstCall.toExponential(2)} (limit ${limit.toExponential(0)})\n`);
      return 1;
    }
    console.log(`${line}: ok`);
  }
  return 0;
}

let code: number;
try {
  code = main();
} catch (e) {
  fail(SCRIPT, oneLine(e));
}
exit(code);
