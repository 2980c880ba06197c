// The floor of a dependent GPU step: what one tiny dispatch costs when a compute-to-compute barrier
// follows it (every step of the decode graph), against the same dispatches with no barrier
// between them, in one command buffer timed by GPU timestamps, after the clocks are warmed.
// The decode graph makes ~10 dependent steps a layer; this says how much of a token that floor is.
// Then the same dependent steps as the graph's input norm makes them: the residual added first, and
// with the rows also quantized for the integer-dot GEMVs (dec_rmsnorm_quant): what a norm step costs
// beyond the floor, and what the graph around it might add: another pipeline alternated (the graph
// binds another kernel every step), another descriptor set every step, a dispatch of 2048
// workgroups right before it whose output it reads (as the experts' down dispatch writes the input
// norm's residual add), a streaming read before it that fits in the last-level cache or evicts it
// (plain or with Nontemporal loads), reads scattered over many pages (address translations), both
// (the cache, with any page-table entries it held, and the translations evicted together), and
// the row it adds written a float a workgroup (as the experts' down + sum writes it) or a 32-byte
// sector a workgroup (or 2 floats a workgroup, as the graph's GGML GEMVs write q, k, v and o). Each
// "X then the norm" row is timed against X alone in the same run. And the barrier itself in other
// forms: its writes made visible to reads only, one buffer's barrier, and an execution-only
// dependency (what the barrier's memory part costs).
//   bun scripts/bench-barrier.ts [--steps 480]
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { GgmlIdpScratch } from "../src/kernels/decoder/ggml-gemv.ts";
import { RmsNormKernel, RmsNormQuantKernel } from "../src/kernels/decoder/rmsnorm.ts";
import { shaderFile } from "../src/kernels/shaders.ts";
import { Buffer, CommandPool, ComputePipeline, DescriptorPool, Fence, QueryPool, Submission, uploadBytes, VulkanContext } from "../src/vk/index.ts";
import { readBandwidth } from "./lib/gpu-time.ts";
import { args, fail } from "./lib/cli.ts";

const SCRIPT = "bench-barrier";
let steps: number;
try {
  const { values } = parseArgs({ args: args(), options: { steps: { type: "string" } }, strict: true, allowPositionals: false });
  const parsed = z.object({ steps: z.coerce.number().int().min(1).max(10000).default(480) }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; usage: bun scripts/bench-barrier.ts [--steps N]`);
  steps = parsed.data.steps;
} catch (e) {
  fail(SCRIPT, (e as Error).message.split("\n")[0]!);
}

using ctx = new VulkanContext({}, readConfig());
const device = ctx.device;
const D = 2048;
using norm = new RmsNormKernel(device);
using normQuant = new RmsNormQuantKernel(device);
using quantized = new GgmlIdpScratch(device, D, 1);
using x = new Buffer(device, { size: BigInt(4 * D), memory: "device" });
using w = new Buffer(device, { size: BigInt(4 * D), memory: "device" });
using y = new Buffer(device, { size: BigInt(4 * D), memory: "device" });
using add = new Buffer(device, { size: BigInt(4 * D), memory: "device" });
// the wide dispatch: 2048 one-row norms of 16 (2048 workgroups), its output the norm's residual add
const WIDE = 2048, WIDE_N = 16;
using wideX = new Buffer(device, { size: BigInt(4 * WIDE * WIDE_N), memory: "device" });
using wideY = new Buffer(device, { size: BigInt(4 * WIDE * WIDE_N), memory: "device" });
// the graph binds another descriptor set every step: 16 rows, each step adding the last one's row to its own
const ROTATE = 16;
const rotating = Array.from({ length: ROTATE }, () => new Buffer(device, { size: BigInt(4 * D), memory: "device" }));
using rotatingOwner = { [Symbol.dispose]: () => rotating.forEach((b) => b[Symbol.dispose]()) };
// finite values: x grows by add each residual step
for (const [b, v] of [[x, 0.5], [w, 1], [add, 1e-3], [wideX, 1e-3], ...rotating.map((r) => [r, 1e-3] as const)] as const) uploadBytes(device, b, 0n, new Uint8Array(new Float32Array(Number(b.size) / 4).fill(v).buffer));
// the streaming reads: one that stays in the last-level cache (4 MiB) and one that evicts it
const MiB = 2 ** 20;
const cpu = device.info.type === 4;
const streamLimit = Math.min(Number(device.info.limits.maxMemoryAllocationSize), device.info.limits.maxStorageBufferRange);
const SMALL_STREAM = 4 * MiB, LARGE_STREAM = Math.min(cpu ? 16 * MiB : 192 * MiB, streamLimit - (streamLimit % MiB));
using streamSrc = new Buffer(device, { size: BigInt(LARGE_STREAM), memory: "device" });
using streamSink = new Buffer(device, { size: 1n << 20n, memory: "device" });
using stream = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256 } });
// the same read with its loads marked Nontemporal (a hint to keep the data out of the caches)
using streamNontemporal = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256, 1: 1 } });
using streamDescriptors = new DescriptorPool(device, 2, 4);
const streamSet = streamDescriptors.allocate(stream, [{ buffer: streamSrc, range: BigInt(LARGE_STREAM) }, { buffer: streamSink }]);
// the scattered read: a 16-byte word every 64 KiB or every 2 MiB of a large buffer (many pages, few
// cache lines: does the norm then pay for address translations the decode's weight streams evicted?)
const SCATTER_BYTES = Math.min(cpu ? 64 * MiB : 1024 * MiB, streamLimit - (streamLimit % MiB));
using scatterSrc = new Buffer(device, { size: BigInt(SCATTER_BYTES), memory: "device" });
const scatterStrides = { "64K": (64 * 1024) / 16, "2M": (2 * MiB) / 16 } as const;
using scatter64K = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256, 2: scatterStrides["64K"] } });
using scatter2M = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256, 2: scatterStrides["2M"] } });
using scatterDescriptors = new DescriptorPool(device, 2, 4);
const scatter64KSet = scatterDescriptors.allocate(scatter64K, [{ buffer: scatterSrc, range: BigInt(SCATTER_BYTES) }, { buffer: streamSink }]);
const scatter2MSet = scatterDescriptors.allocate(scatter2M, [{ buffer: scatterSrc, range: BigInt(SCATTER_BYTES) }, { buffer: streamSink }]);
const streamNontemporalSet = streamDescriptors.allocate(streamNontemporal, [{ buffer: streamSrc, range: BigInt(LARGE_STREAM) }, { buffer: streamSink }]);
using pool = new CommandPool(device);
using queries = new QueryPool(device, 2);
using fence = new Fence(device);

type PairedStep = "small" | "large" | "nontemporal" | "scatter64K" | "scatter2M" | "evict" | "single" | "pair" | "sector";
type Step = "plain" | "residual" | "residual+quantize" | "alternating" | "rotating" | "wide" | "wide+norm" | PairedStep | `${PairedStep}+norm`;
/** How the dependent steps' barrier is expressed: global, reads-only, on one buffer, or execution only. */
type Sync = "global" | "read" | "buffer" | "execution";
/** GPU µs of `steps` one-row RMSNorms of D (the decode graph's cheapest op), with or without a barrier after each. */
function run(barriers: boolean, step: Step = "plain", sync: Sync = "global"): number {
  const cb = pool.allocate().begin().resetQueries(queries).timestamp(queries, 0);
  // a CPU device takes tens of ms a wide dispatch: fewer of those steps there (µs a step stays comparable)
  const n = cpu && !["plain", "residual", "residual+quantize", "alternating"].includes(step) ? Math.min(steps, 8) : steps;
  const streaming = step.startsWith("small") || step.startsWith("large") || step.startsWith("nontemporal");
  if (streaming || step.startsWith("evict")) cb.fillBuffer(streamSrc, 0).barrier("transferToCompute");
  if (step.startsWith("scatter") || step.startsWith("evict")) cb.fillBuffer(scatterSrc, 0).barrier("transferToCompute");
  for (let i = 0; i < n; i++) {
    // in place with a barrier: each step reads what the last wrote, as the graph's steps do
    if (step === "plain") norm.record(cb, { x, w, y: barriers ? x : y, rows: 1, n: D, eps: 1e-6 });
    // x += add (written back), y = RMSNorm(x): each step reads the x the last one wrote
    else if (step === "residual" || (step === "alternating" && i % 2 === 0)) norm.record(cb, { x, add, w, y, rows: 1, n: D, eps: 1e-6 });
    else if (step === "rotating") normQuant.record(cb, { x: rotating[i % ROTATE]!, add: rotating[(i + ROTATE - 1) % ROTATE]!, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    else if (step === "residual+quantize" || step === "alternating") normQuant.record(cb, { x, add, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    else if (streaming) {
      const bytes = step.startsWith("small") ? SMALL_STREAM : LARGE_STREAM;
      const reader = step.startsWith("nontemporal") ? streamNontemporal : stream;
      cb.bind(reader, reader === stream ? streamSet : streamNontemporalSet).pushConstants(reader, new Uint32Array([0, bytes / 16])).dispatch(cpu ? 64 : 4096);
      cb.barrier("computeToCompute");
      if (step.endsWith("+norm")) normQuant.record(cb, { x, add, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    } else if (step.startsWith("single") || step.startsWith("pair") || step.startsWith("sector")) {
      // the norm's residual row written by many workgroups, one float each (as moe_ggml's down + sum
      // writes y at one row a workgroup), 2 (the GGML GEMVs' rows a workgroup) or 8 floats (a 32-byte sector) each
      const each = step.startsWith("single") ? 1 : step.startsWith("pair") ? 2 : 8;
      norm.record(cb, { x: wideX, w, y: wideY, rows: D / each, n: each, eps: 1e-6 });
      cb.barrier("computeToCompute");
      if (step.endsWith("+norm")) normQuant.record(cb, { x, add: wideY, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    } else if (step.startsWith("evict")) {
      // both: the streaming read that evicts the last-level cache (and with it any cached page-table
      // entries), then the scattered read that evicts the address translations
      cb.bind(stream, streamSet).pushConstants(stream, new Uint32Array([0, LARGE_STREAM / 16])).dispatch(cpu ? 64 : 4096);
      cb.barrier("computeToCompute");
      cb.bind(scatter64K, scatter64KSet).pushConstants(scatter64K, new Uint32Array([0, SCATTER_BYTES / 16 / scatterStrides["64K"]])).dispatch(cpu ? 16 : 64);
      cb.barrier("computeToCompute");
      if (step.endsWith("+norm")) normQuant.record(cb, { x, add, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    } else if (step.startsWith("scatter")) {
      const wide = step.startsWith("scatter64K");
      cb.bind(wide ? scatter64K : scatter2M, wide ? scatter64KSet : scatter2MSet)
        .pushConstants(wide ? scatter64K : scatter2M, new Uint32Array([0, SCATTER_BYTES / 16 / scatterStrides[wide ? "64K" : "2M"]])).dispatch(cpu ? 16 : 64);
      cb.barrier("computeToCompute");
      if (step.endsWith("+norm")) normQuant.record(cb, { x, add, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    } else {
      norm.record(cb, { x: wideX, w, y: wideY, rows: WIDE, n: WIDE_N, eps: 1e-6 });
      cb.barrier("computeToCompute");
      if (step === "wide+norm") normQuant.record(cb, { x, add: wideY, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    }
    if (barriers) {
      // the plain step writes x only (in place): a barrier on that buffer alone covers it
      if (sync === "buffer") cb.bufferBarrier("computeToCompute", [x]);
      else cb.barrier(sync === "read" ? "computeToComputeRead" : sync === "execution" ? "computeExecution" : "computeToCompute");
    }
  }
  cb.timestamp(queries, 1).end();
  using submission = new Submission(device, [cb], { fence });
  const samples: number[] = [];
  for (let r = 0; r < 7; r++) {
    submission.submit();
    if (!fence.wait()) throw new Error("bench-barrier: the GPU did not finish");
    fence.reset();
    const [a, b] = queries.results(0, 2);
    samples.push(((Number(b! - a!) * device.info.limits.timestampPeriod) / 1000) * (steps / n));
  }
  return samples.sort((p, q) => p - q)[3]!;
}

/** `run` after a streaming read that raises the clocks (an idle GPU's clock drops between runs). */
function warmRun(barriers: boolean, step: Step = "plain", sync: Sync = "global"): number {
  if (!cpu) readBandwidth(device, 1 << 30, 150);
  return run(barriers, step, sync);
}
const dependent = warmRun(true);
const independent = warmRun(false);
// the same dependency expressed otherwise: made visible to reads only, on the one buffer written,
// and with no memory dependency at all (not a valid order for these in-place steps: it says what
// the memory part of the barrier costs)
const readOnly = warmRun(true, "plain", "read");
const bufferOnly = warmRun(true, "plain", "buffer");
const executionOnly = warmRun(true, "plain", "execution");
const residual = warmRun(true, "residual");
const residualQuant = warmRun(true, "residual+quantize");
const alternating = warmRun(true, "alternating");
const rotatingSets = warmRun(true, "rotating");
const wide = warmRun(true, "wide");
const wideNorm = warmRun(true, "wide+norm");
// each a dispatch alone and then followed by the quantizing norm: its row label, the norm's, and the summary's words
const paired: { step: PairedStep; label: string; normLabel: string; summary: string }[] = [
  { step: "small", label: `a streaming read of ${SMALL_STREAM / MiB} MiB (stays in the last-level cache)`, normLabel: "that read then the quantizing norm", summary: "after a cached streaming read" },
  { step: "large", label: `a streaming read of ${LARGE_STREAM / MiB} MiB (evicts the last-level cache)`, normLabel: "that read then the quantizing norm", summary: "after one that evicts the cache" },
  { step: "nontemporal", label: "the same read with Nontemporal loads", normLabel: "that read then the quantizing norm", summary: "after that one with Nontemporal loads" },
  { step: "scatter64K", label: `a 16-byte word read every 64 KiB of ${SCATTER_BYTES / MiB} MiB`, normLabel: "that read then the quantizing norm", summary: `after a word read every 64 KiB of ${SCATTER_BYTES / MiB} MiB` },
  { step: "scatter2M", label: `a 16-byte word read every 2 MiB of ${SCATTER_BYTES / MiB} MiB`, normLabel: "that read then the quantizing norm", summary: "every 2 MiB" },
  { step: "evict", label: `the ${LARGE_STREAM / MiB} MiB streaming read, then the word read every 64 KiB (the cache and the address translations both evicted)`, normLabel: "those then the quantizing norm", summary: "after both" },
  ...([["single", "one float", 1], ["pair", "2 floats", 2], ["sector", "8 floats (32 bytes)", 8]] as const).map(([step, what, each]) => ({
    step, label: `${what} of a ${D}-float row written by each of ${D / each} workgroups`, normLabel: "that then the quantizing norm adding the row",
    summary: each === 1 ? "adding a row written a float a workgroup" : each === 2 ? "2 floats" : "8 floats a workgroup",
  })),
];
const pairTimes = paired.map((p) => ({ ...p, alone: warmRun(true, p.step), withNorm: warmRun(true, `${p.step}+norm`) }));
console.log(`${device.info.name}, ${device.info.driverName} ${device.info.driverInfo}: ${steps} one-row RMSNorms of ${D} (median of 7 command buffers)`);
console.log(`| steps | GPU µs | µs a step |`);
console.log(`|---|---:|---:|`);
console.log(`| dependent (a compute barrier after each) | ${dependent.toFixed(0)} | ${(dependent / steps).toFixed(2)} |`);
console.log(`| independent (no barrier) | ${independent.toFixed(0)} | ${(independent / steps).toFixed(2)} |`);
console.log(`| dependent, the barrier's writes made visible to reads only | ${readOnly.toFixed(0)} | ${(readOnly / steps).toFixed(2)} |`);
console.log(`| dependent, a buffer barrier on the one buffer written | ${bufferOnly.toFixed(0)} | ${(bufferOnly / steps).toFixed(2)} |`);
console.log(`| ordered by an execution-only barrier (no memory dependency; not valid here, the barrier's memory part's cost) | ${executionOnly.toFixed(0)} | ${(executionOnly / steps).toFixed(2)} |`);
console.log(`| dependent, the residual added first (the input norm's dec_rmsnorm) | ${residual.toFixed(0)} | ${(residual / steps).toFixed(2)} |`);
console.log(`| dependent, the residual added and the rows quantized (dec_rmsnorm_quant) | ${residualQuant.toFixed(0)} | ${(residualQuant / steps).toFixed(2)} |`);
console.log(`| dependent, the two kernels above alternated (another pipeline bound every step) | ${alternating.toFixed(0)} | ${(alternating / steps).toFixed(2)} |`);
console.log(`| dependent, the quantizing norm with another descriptor set every step (${ROTATE} rotating) | ${rotatingSets.toFixed(0)} | ${(rotatingSets / steps).toFixed(2)} |`);
console.log(`| dependent, a dispatch of ${WIDE} workgroups (one-row norms of ${WIDE_N}) | ${wide.toFixed(0)} | ${(wide / steps).toFixed(2)} |`);
console.log(`| dependent, that dispatch then the quantizing norm reading its output | ${wideNorm.toFixed(0)} | ${(wideNorm / steps).toFixed(2)} |`);
for (const p of pairTimes) {
  console.log(`| dependent, ${p.label} | ${p.alone.toFixed(0)} | ${(p.alone / steps).toFixed(2)} |`);
  console.log(`| dependent, ${p.normLabel} | ${p.withNorm.toFixed(0)} | ${(p.withNorm / steps).toFixed(2)} |`);
}
console.log(`ratio dependent / independent: ${(dependent / independent).toFixed(2)}x`);
// the alternated run: ceil(steps / 2) plain-residual steps (even i), the rest quantizing
const quantSteps = Math.floor(steps / 2), quantAlternated = (alternating - (steps - quantSteps) * (residual / steps)) / Math.max(1, quantSteps);
const afterPairs = pairTimes.map((p) => `${((p.withNorm - p.alone) / steps).toFixed(2)} ${p.summary}`).join(", ");
console.log(`the quantizing norm step: ${(residualQuant / steps).toFixed(2)} µs alone, ${quantAlternated.toFixed(2)} alternated with another pipeline, ${((wideNorm - wide) / steps).toFixed(2)} right after the wide dispatch, ${afterPairs}`);
