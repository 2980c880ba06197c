// What a dependent step costs when its workgroups, already launched, spin on the previous step's
// done-counter instead of waiting behind a compute-to-compute barrier: is the barrier (and the
// launch behind it) the floor of a decode graph's step, or is the step's own chain of memory round
// trips? --steps dependent steps of bench_spin_step (each reads the whole 2048-float row the last
// wrote, as a GEMV reads x, and writes its slice of the next), each --groups workgroups a step, one
// command buffer timed by GPU timestamps after the clocks are warmed; the final rows of the two
// forms compared bit for bit (a race would show there). The spinning form relies on dispatches
// starting in order (see the shader); a driver that does not would hang it until the fence times out.
//   bun scripts/bench-spin.ts [--steps 480] [--groups 1,8,32,128]
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { shaderFile } from "../src/kernels/shaders.ts";
import { Buffer, CommandPool, ComputePipeline, DescriptorPool, downloadBytes, Fence, QueryPool, Submission, uploadBytes, VulkanContext } from "../src/vk/index.ts";
import { args, fail } from "./lib/cli.ts";
import { readBandwidth } from "./lib/gpu-time.ts";

const SCRIPT = "bench-spin";
const USAGE = "usage: bun scripts/bench-spin.ts [--steps N] [--groups 1,8,32,128]";
let flags: { steps: number; groups: number[] };
try {
  const { values } = parseArgs({ args: args(), options: { steps: { type: "string" }, groups: { type: "string" } }, strict: true, allowPositionals: false });
  const parsed = z.object({
    steps: z.coerce.number().int().min(2).max(10000).default(480),
    groups: z.string().regex(/^\d+(,\d+)*$/, "a comma-separated list of integers").default("1,8,32,128").transform((s) => s.split(",").map(Number))
      .refine((l) => l.every((g) => g >= 1 && g <= 2048 && 2048 % g === 0), "groups must divide 2048"),
  }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}

const N = 2048, REPS = 7;
using ctx = new VulkanContext({}, readConfig());
const device = ctx.device;
const cpu = device.info.type === 4;
const pipelineOf = (spin: boolean) => new ComputePipeline(device, { spirv: shaderFile("bench_spin_step"), storageBuffers: 3, pushConstantBytes: 16, specialization: { 0: spin ? 1 : 0 } });
using barrierPipeline = pipelineOf(false);
using spinPipeline = pipelineOf(true);
using rowA = new Buffer(device, { size: BigInt(4 * N), memory: "device" });
using rowB = new Buffer(device, { size: BigInt(4 * N), memory: "device" });
using counters = new Buffer(device, { size: BigInt(4 * flags.steps), memory: "device" });
using descriptors = new DescriptorPool(device, 2, 6);
const bindings = [{ buffer: rowA }, { buffer: rowB }, { buffer: counters }];
const barrierSet = descriptors.allocate(barrierPipeline, bindings);
const spinSet = descriptors.allocate(spinPipeline, bindings);
using pool = new CommandPool(device);
using queries = new QueryPool(device, 2);
using fence = new Fence(device);
const start = new Float32Array(N).map((_, i) => Math.sin(i));

/** Median GPU µs of the whole chain and its final row. */
function run(spin: boolean, groups: number): { us: number; row: Uint32Array } {
  const pipeline = spin ? spinPipeline : barrierPipeline;
  const cb = pool.allocate().begin().resetQueries(queries).fillBuffer(counters, 0).barrier("transferToCompute").timestamp(queries, 0);
  cb.bind(pipeline, spin ? spinSet : barrierSet);
  for (let s = 0; s < flags.steps; s++) {
    cb.pushConstants(pipeline, new Uint32Array([s, N, groups, s & 1])).dispatch(groups);
    if (!spin) cb.barrier("computeToCompute");
  }
  if (spin) cb.barrier("computeToCompute");
  cb.timestamp(queries, 1).end();
  using submission = new Submission(device, [cb], { fence });
  const samples: number[] = [];
  let row = new Uint32Array();
  for (let r = 0; r < REPS; r++) {
    uploadBytes(device, rowA, 0n, new Uint8Array(start.buffer));
    if (!cpu) readBandwidth(device, 1 << 28, 20);
    submission.submit();
    if (!fence.wait()) fail(SCRIPT, "the GPU did not finish the chain (a driver that does not start dispatches in order would hang the spinning form)");
    fence.reset();
    const [a, b] = queries.results(0, 2);
    samples.push((Number(b! - a!) * device.info.limits.timestampPeriod) / 1000);
    row = new Uint32Array(downloadBytes(device, flags.steps % 2 === 0 ? rowA : rowB, 0n, 4 * N).slice().buffer);
  }
  return { us: samples.sort((x, y) => x - y)[REPS >> 1]!, row };
}

console.log(`${device.info.name}, ${device.info.driverName} ${device.info.driverInfo}: ${flags.steps} dependent steps (median of ${REPS} command buffers)`);
console.log("| workgroups a step | µs a step, barrier | µs a step, spin | barrier / spin | final rows equal |");
console.log("|---:|---:|---:|---:|---|");
for (const g of flags.groups) {
  const barrier = run(false, g), spin = run(true, g);
  const equal = barrier.row.every((w, i) => w === spin.row[i]);
  console.log(`| ${g} | ${(barrier.us / flags.steps).toFixed(2)} | ${(spin.us / flags.steps).toFixed(2)} | ${(barrier.us / spin.us).toFixed(2)}x | ${equal ? "yes" : "NO"} |`);
}
