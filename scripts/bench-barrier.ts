// The floor of a dependent GPU step: what one tiny dispatch costs when a compute-to-compute barrier
// follows it (every step of the decode graph), against the same dispatches with no barrier
// between them, in one command buffer timed by GPU timestamps, after the clocks are warmed.
// The decode graph makes ~10 dependent steps a layer; this says how much of a token that floor is.
// Then the same dependent steps as the graph's input norm makes them: the residual added first, and
// with the rows also quantized for the integer-dot GEMVs (dec_rmsnorm_quant): what a norm step costs
// beyond the floor: alone, with a second pipeline alternated (the graph binds another kernel every
// step), and right after a dispatch of 2048 workgroups that writes what it reads (as the experts'
// down dispatch writes the input norm's residual add).
//   bun scripts/bench-barrier.ts [--steps 480]
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { GgmlIdpScratch } from "../src/kernels/decoder/ggml-gemv.ts";
import { RmsNormKernel, RmsNormQuantKernel } from "../src/kernels/decoder/rmsnorm.ts";
import { Buffer, CommandPool, Fence, QueryPool, Submission, uploadBytes, VulkanContext } from "../src/vk/index.ts";
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
// finite values: x grows by add each residual step
for (const [b, v] of [[x, 0.5], [w, 1], [add, 1e-3], [wideX, 1e-3]] as const) uploadBytes(device, b, 0n, new Uint8Array(new Float32Array(Number(b.size) / 4).fill(v).buffer));
using pool = new CommandPool(device);
using queries = new QueryPool(device, 2);
using fence = new Fence(device);

const cpu = device.info.type === 4;
type Step = "plain" | "residual" | "residual+quantize" | "alternating" | "wide" | "wide+norm";
/** GPU µs of `steps` one-row RMSNorms of D (the decode graph's cheapest op), with or without a barrier after each. */
function run(barriers: boolean, step: Step = "plain"): number {
  const cb = pool.allocate().begin().resetQueries(queries).timestamp(queries, 0);
  // a CPU device takes tens of ms a wide dispatch: fewer of those steps there (µs a step stays comparable)
  const n = cpu && step.startsWith("wide") ? Math.min(steps, 8) : steps;
  for (let i = 0; i < n; i++) {
    // in place with a barrier: each step reads what the last wrote, as the graph's steps do
    if (step === "plain") norm.record(cb, { x, w, y: barriers ? x : y, rows: 1, n: D, eps: 1e-6 });
    // x += add (written back), y = RMSNorm(x): each step reads the x the last one wrote
    else if (step === "residual" || (step === "alternating" && i % 2 === 0)) norm.record(cb, { x, add, w, y, rows: 1, n: D, eps: 1e-6 });
    else if (step === "residual+quantize" || step === "alternating") normQuant.record(cb, { x, add, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    else {
      norm.record(cb, { x: wideX, w, y: wideY, rows: WIDE, n: WIDE_N, eps: 1e-6 });
      cb.barrier("computeToCompute");
      if (step === "wide+norm") normQuant.record(cb, { x, add: wideY, w, y, rows: 1, n: D, eps: 1e-6 }, quantized);
    }
    if (barriers) cb.barrier("computeToCompute");
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

if (!cpu) readBandwidth(device, 1 << 30, 150); // clocks up
const dependent = run(true);
if (!cpu) readBandwidth(device, 1 << 30, 150);
const independent = run(false);
if (!cpu) readBandwidth(device, 1 << 30, 150);
const residual = run(true, "residual");
if (!cpu) readBandwidth(device, 1 << 30, 150);
const residualQuant = run(true, "residual+quantize");
if (!cpu) readBandwidth(device, 1 << 30, 150);
const alternating = run(true, "alternating");
if (!cpu) readBandwidth(device, 1 << 30, 150);
const wide = run(true, "wide");
if (!cpu) readBandwidth(device, 1 << 30, 150);
const wideNorm = run(true, "wide+norm");
console.log(`${device.info.name}, ${device.info.driverName} ${device.info.driverInfo}: ${steps} one-row RMSNorms of ${D} (median of 7 command buffers)`);
console.log(`| steps | GPU µs | µs a step |`);
console.log(`|---|---:|---:|`);
console.log(`| dependent (a compute barrier after each) | ${dependent.toFixed(0)} | ${(dependent / steps).toFixed(2)} |`);
console.log(`| independent (no barrier) | ${independent.toFixed(0)} | ${(independent / steps).toFixed(2)} |`);
console.log(`| dependent, the residual added first (the input norm's dec_rmsnorm) | ${residual.toFixed(0)} | ${(residual / steps).toFixed(2)} |`);
console.log(`| dependent, the residual added and the rows quantized (dec_rmsnorm_quant) | ${residualQuant.toFixed(0)} | ${(residualQuant / steps).toFixed(2)} |`);
console.log(`| dependent, the two kernels above alternated (another pipeline bound every step) | ${alternating.toFixed(0)} | ${(alternating / steps).toFixed(2)} |`);
console.log(`| dependent, a dispatch of ${WIDE} workgroups (one-row norms of ${WIDE_N}) | ${wide.toFixed(0)} | ${(wide / steps).toFixed(2)} |`);
console.log(`| dependent, that dispatch then the quantizing norm reading its output | ${wideNorm.toFixed(0)} | ${(wideNorm / steps).toFixed(2)} |`);
console.log(`ratio dependent / independent: ${(dependent / independent).toFixed(2)}x`);
// the alternated run: ceil(steps / 2) plain-residual steps (even i), the rest quantizing
const quantSteps = Math.floor(steps / 2), quantAlternated = (alternating - (steps - quantSteps) * (residual / steps)) / Math.max(1, quantSteps);
console.log(`the quantizing norm step: ${(residualQuant / steps).toFixed(2)} µs alone, ${quantAlternated.toFixed(2)} alternated with another pipeline, ${((wideNorm - wide) / steps).toFixed(2)} right after the wide dispatch`);
