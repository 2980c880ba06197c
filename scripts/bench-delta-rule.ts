// GPU µs of a long prompt chunk's gated delta rule at the Qwen3.6-35B-A3B shape (16 key / 32 value
// heads of 128), as the Qwen3.5 graph records it: the chunked kernel 64 tokens a dispatch (one after
// another, a barrier between, DeltaRuleChunkedKernel) against the two passes (prepare, state:
// DeltaRuleSplitKernel), each followed by the gated norm, for each --tokens, in the same run; the
// ratio, and the two outputs' and states' NMSE against each other (the same sums in another order).
// Each timed replay starts from the state the last one left (as a prompt's chunks do). Clocks warmed
// with a streaming read before each measurement.
//   bun scripts/bench-delta-rule.ts [--tokens 512,2048] [--reps 7]
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { DELTA_RULE_MAX_S, DeltaRuleChunkedKernel, type DeltaRuleArgs } from "../src/kernels/decoder/delta-rule.ts";
import { DeltaRuleSplitKernel } from "../src/kernels/decoder/delta-rule-split.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { nmse } from "../src/quant/metrics.ts";
import { Buffer, CommandPool, downloadBytes, Fence, QueryPool, Submission, uploadBytes, VulkanContext, type CommandBuffer } from "../src/vk/index.ts";
import { args, fail } from "./lib/cli.ts";
import { readBandwidth } from "./lib/gpu-time.ts";

const SCRIPT = "bench-delta-rule";
const USAGE = "usage: bun scripts/bench-delta-rule.ts [--tokens 512,2048] [--reps N]";
const KH = 16, VH = 32, KD = 128, VD = 128, C = 2 * KH * KD + VH * VD;

let flags: { tokens: number[]; reps: number };
try {
  const { values } = parseArgs({ args: args(), strict: true, allowPositionals: false, options: { tokens: { type: "string" }, reps: { type: "string" } } });
  const parsed = z.object({
    tokens: z.string().regex(/^\d+(,\d+)*$/, "a comma-separated list of integers").transform((t) => t.split(",").map(Number))
      .refine((l) => l.every((x) => x >= 1 && x <= 8192), "tokens must be in 1..8192").default([512]),
    reps: z.coerce.number().int().min(1).max(100).default(7),
  }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]!}; ${USAGE}`);
}

using ctx = new VulkanContext({}, readConfig());
const device = ctx.device;
const cpu = device.info.type === 4;
using pool = new CommandPool(device);
using queries = new QueryPool(device, 2);
using fence = new Fence(device);
const bw = cpu ? undefined : readBandwidth(device, 1 << 30, 20);
using chunked = new DeltaRuleChunkedKernel(device, { keyDim: KD, valueDim: VD });
using split = new DeltaRuleSplitKernel(device, { keyDim: KD, valueDim: VD });

function deviceBuffer(data: Float32Array): Buffer {
  const b = new Buffer(device, { size: BigInt(4 * data.length), memory: "device" });
  uploadBytes(device, b, 0n, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  return b;
}
const read = (b: Buffer, floats: number) => new Float32Array(downloadBytes(device, b, 0n, 4 * floats).slice().buffer);

/** GPU µs of one replay of `record` (median of flags.reps, after one untimed replay). */
function time(record: (cb: CommandBuffer) => void): number {
  const cb = pool.allocate().begin().resetQueries(queries).timestamp(queries, 0);
  record(cb);
  cb.timestamp(queries, 1).end();
  using submission = new Submission(device, [cb], { fence });
  const samples: number[] = [];
  for (let r = 0; r <= flags.reps; r++) {
    if (!cpu) readBandwidth(device, 1 << 28, 10); // clocks up
    submission.submit();
    if (!fence.wait()) throw new Error(`${SCRIPT}: the GPU did not finish`);
    fence.reset();
    const [a, b] = queries.results(0, 2);
    if (r > 0) samples.push((Number(b! - a!) * device.info.limits.timestampPeriod) / 1000);
  }
  return samples.sort((p, q) => p - q)[samples.length >> 1]!;
}

console.log(`${device.info.name}, ${device.info.driverName} ${device.info.driverInfo}`);
console.log(`Qwen3.6 delta rule (${KH} key / ${VH} value heads of ${KD}), a prompt chunk + the gated norm, GPU µs a chunk, median of ${flags.reps}`);
console.log("| tokens | 64 a dispatch (chunked) | two passes (split) | chunked / split | out NMSE | state NMSE |");
console.log("|---:|---:|---:|---:|---:|---:|");
for (const S of flags.tokens) {
  // decays from slow to fast across heads (−exp(A_log) 0.02..4), dt_bias about −1, norm weights about 1
  const params = randomGaussianF32(3 * VH + VD, 4, 0.3);
  for (let h = 0; h < VH; h++) {
    params[h] = -(0.02 * 200 ** (h / (VH - 1)));
    params[VH + h] = params[VH + h]! - 1;
  }
  for (let i = 0; i < VD; i++) params[2 * VH + i] = params[2 * VH + i]! + 1;
  const state0 = randomGaussianF32(VH * KD * VD, 6, 0.3);
  using qkv = deviceBuffer(randomGaussianF32(S * C, 1, 1));
  using a = deviceBuffer(randomGaussianF32(S * VH, 2, 1));
  using b = deviceBuffer(randomGaussianF32(S * VH, 3, 1));
  using z = deviceBuffer(randomGaussianF32(S * VH * VD, 5, 1));
  using p = deviceBuffer(params);
  using scratch = split.scratch(S, VH);
  const args = (state: Buffer, out: Buffer, t0: number, n: number): DeltaRuleArgs => ({
    S: n, keyHeads: KH, valueHeads: VH, qkv, qOffset: t0 * C, kOffset: KH * KD + t0 * C, vOffset: 2 * KH * KD + t0 * C, qkvStride: C,
    a, b, aOffset: t0 * VH, aStride: VH, bOffset: t0 * VH, bStride: VH, params: p, negAOffset: 0, dtBiasOffset: VH,
    state, out, outOffset: t0 * VH * VD, outStride: VH * VD,
    norm: { z, zOffset: t0 * VH * VD, zStride: VH * VD, weightOffset: 2 * VH, eps: 1e-6 },
  });
  const recordChunked = (cb: CommandBuffer, state: Buffer, out: Buffer) => {
    for (let t0 = 0; t0 < S; t0 += DELTA_RULE_MAX_S) {
      if (t0 > 0) cb.barrier("computeToCompute");
      chunked.recordCore(cb, args(state, out, t0, Math.min(DELTA_RULE_MAX_S, S - t0)));
    }
    chunked.recordNorm(cb.barrier("computeToCompute"), args(state, out, 0, S));
  };
  const recordSplit = (cb: CommandBuffer, state: Buffer, out: Buffer) => split.record(cb, args(state, out, 0, S), scratch);
  // one replay each from state0, compared; then the timings
  const results = [recordChunked, recordSplit].map((record) => {
    using state = deviceBuffer(state0);
    using out = new Buffer(device, { size: BigInt(4 * S * VH * VD), memory: "device" });
    const cb = pool.allocate().begin();
    record(cb, state, out);
    cb.end();
    using submission = new Submission(device, [cb], { fence });
    submission.submit();
    if (!fence.wait()) throw new Error(`${SCRIPT}: the GPU did not finish`);
    fence.reset();
    return { out: read(out, S * VH * VD), state: read(state, VH * KD * VD) };
  });
  using state = deviceBuffer(state0);
  using out = new Buffer(device, { size: BigInt(4 * S * VH * VD), memory: "device" });
  const us = [time((cb) => recordChunked(cb, state, out)), time((cb) => recordSplit(cb, state, out))];
  console.log(`| ${S} | ${us[0]!.toFixed(1)} | ${us[1]!.toFixed(1)} | ${(us[0]! / us[1]!).toFixed(2)}x | ${nmse(results[0]!.out, results[1]!.out).toExponential(1)} | ${nmse(results[0]!.state, results[1]!.state).toExponential(1)} |`);
}
if (bw) console.log(`(read bandwidth ${bw.gbs.toFixed(0)} GB/s)`);
