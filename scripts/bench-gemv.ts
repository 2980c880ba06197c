// GEMV benchmark: µs per GEMV (GPU timestamps and host-observed), effective GB/s over the weight
// and scale bytes read, and the ratio to this device's own read bandwidth measured in the same run
// by a streaming-read kernel. Matrices rotate through a pool larger than the GPU's last-level cache.
// GGML block types (Q4_1 .. Q6_K: dec_gemv_ggml, float path, and where the integer-dot decision is
// on, dec_gemv_ggml_idp with its x quantization counted) count the file's block bytes; --ggml-shape
// sets their kernels' workgroup size, rows per workgroup and tokens per chunk (default: the
// kernels'). --ggml runs only the GGML cases; --force-idp runs the integer-dot cases where the
// decision is off but the device has the feature (a measurement, e.g. on Lavapipe: not "accelerated").
// --ggml-factored times the float path's factored variant (GgmlGemvKernelOptions.factored).
// --ggml-shape's optional fourth number is the slices a lane takes a step (slicesPerLane, 1 or 2).
// --idp-alone adds "int-dot alone" rows: the GGML integer-dot GEMVs over an x quantized once before
// the batch, no barrier between them (as the float rows, and as a decode graph runs them: its input
// norm writes the quantized x that q, k and v share).
// --only TEXT keeps the cases whose "label fmt" contains TEXT (e.g. "4096->14336 Q4_K").
// --gemm-idp instead times the GGML prompt-chunk GEMMs (S = 64), the float dec_gemm_ggml against the
// integer-dot dec_gemm_ggml_idp (its quantize_act and barrier counted, and alone), on Qwen3-30B-A3B's
// attention shapes (q 2048->4096, k/v 2048->512, o 4096->2048), Q4_K and Q6_K, in one run: GPU
// timestamps over a batch rotating through the pool, clocks warmed by streaming reads before each
// case, the two kernels alternated; prints float µs / idp µs. --gemm-steps 1,2,4 (the default) are
// the idp kernel's slices a step (GgmlGemmIdpKernelOptions.slicesPerStep), one row each. Then o and
// k/v split over the columns (GemmSplitScratch, as DeviceLinear records them where gemmSplits > 1)
// against unsplit, both GEMMs, in the same run; --gemm-splits N asks for N runs (default gemmSplits'
// count for the shape on this device, or 4 where that is 1, e.g. a CPU device). Needs the
// integer-dot decision on (or --force-idp where the device has the feature).
//   bun scripts/bench-gemv.ts [--pool-mib N] [--quick] [--ggml] [--ggml-shape WG,ROWS,TOKENS[,SLICES]] [--idp-alone] [--force-idp] [--ggml-factored] [--only TEXT] [--gemm-idp [--gemm-steps 1,2,4] [--gemm-splits N]]
import { readConfig } from "../src/config.ts";
import { GemvKernels } from "../src/kernels/gemv.ts";
import { GGML_GEMM_ROWS, GGML_GEMM_TOKENS, GgmlGemmIdpKernel, GgmlGemmKernel } from "../src/kernels/decoder/ggml-gemm.ts";
import { GemmSplitScratch, gemmSplits } from "../src/kernels/decoder/quant-gemm.ts";
import { GGML_IDP_GROUP, GgmlGemvIdpKernel, GgmlGemvKernel, GgmlQuantizeKernel, type GgmlGemvKernelOptions } from "../src/kernels/decoder/ggml-gemv.ts";
import { GGML_BLOCK_LAYOUTS, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { GEMV, GEMV_IDP, QUANTIZE_ACT, shaderFile } from "../src/kernels/shaders.ts";
import { describeKernelPlan, planKernels } from "../src/kernels/setup.ts";
import { groupsPerRowFor, rowWordsFor, scaleWordsFor } from "../src/quant/layout.ts";
import type { QuantFormat } from "../src/quant/types.ts";
import { banner } from "../src/vk/banner.ts";
import {
  Buffer, CommandPool, ComputePipeline, DescriptorPool, Fence, QueryPool, Submission, uploadBytes, VulkanContext,
  VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
} from "../src/vk/index.ts";
import { readBandwidth } from "./lib/gpu-time.ts";

const args = (globalThis as any).Deno ? (globalThis as any).Deno.args : process.argv.slice(2);
const quick = args.includes("--quick");
const poolArg = args.indexOf("--pool-mib");
const shapeArg = args.indexOf("--ggml-shape");
const onlyGgml = args.includes("--ggml");
const forceIdp = args.includes("--force-idp");
const onlyArg = args.indexOf("--only");
const only = onlyArg >= 0 ? String(args[onlyArg + 1]) : undefined;
const ggmlShape: GgmlGemvKernelOptions = {};
const factored = args.includes("--ggml-factored");
const gemmIdpMode = args.includes("--gemm-idp");
const idpAlone = args.includes("--idp-alone");
const stepsArg = args.indexOf("--gemm-steps");
const gemmSteps = (stepsArg >= 0 ? String(args[stepsArg + 1]) : "1,2,4").split(",").map(Number);
const splitsArg = args.indexOf("--gemm-splits");
const gemmSplitsAsked = splitsArg >= 0 ? Number(args[splitsArg + 1]) : undefined;
if (shapeArg >= 0) {
  const [wg, rows, tokens, slices] = String(args[shapeArg + 1]).split(",").map(Number);
  Object.assign(ggmlShape, { workgroupSize: wg, rowsPerWorkgroup: rows, tokensPerChunk: tokens, ...(slices ? { slicesPerLane: slices } : {}) });
}

const env = readConfig();
using ctx = new VulkanContext({}, env);
const device = ctx.device;
const info = device.info;
console.log(banner(ctx));
const plan = planKernels(device, env);
const config = plan.config;
console.log(describeKernelPlan(plan).join("\n"));
const MiB = 2 ** 20;
const cpuLike = info.type === 4;
const limit = Number(info.limits.maxMemoryAllocationSize < info.limits.maxBufferSize ? info.limits.maxMemoryAllocationSize : info.limits.maxBufferSize);
// The pool is bound whole to the GEMV descriptors, so it also stays within maxStorageBufferRange.
const rangeLimit = Math.min(limit, info.limits.maxStorageBufferRange);
const poolBytes = Math.min(poolArg >= 0 ? Number(args[poolArg + 1]) * MiB : 2048 * MiB, rangeLimit - (rangeLimit % MiB));
const GROUP = 32;

using pool = new Buffer(device, { size: BigInt(poolBytes), memory: "device" });
{
  // Random weights, f16 scale words of 1/64: every bit pattern is a valid weight.
  const chunk = new Uint32Array(16 * MiB / 4);
  let s = 0x12345678;
  for (let i = 0; i < chunk.length; i++) {
    s ^= s << 13; s ^= s >>> 17; s ^= s << 5;
    chunk[i] = s >>> 0;
  }
  const bytes = new Uint8Array(chunk.buffer);
  for (let at = 0; at < poolBytes; at += bytes.byteLength) uploadBytes(device, pool, BigInt(at), bytes.subarray(0, Math.min(bytes.byteLength, poolBytes - at)));
}
using sink = new Buffer(device, { size: 1n << 20n, memory: "device" });
// x and y in device memory, as the decode graph's activations are: host-visible x (PCIe or
// uncached memory on a discrete GPU) made every 4096->14336 GEMV ~60 µs on an H200, whatever the kernel.
using x = new Buffer(device, { size: BigInt(4 * 64 * 16384), memory: "device" });
uploadBytes(device, x, 0n, new Uint8Array(new Float32Array(64 * 16384).fill(0.01).buffer));
using y = new Buffer(device, { size: BigInt(64 * MiB), memory: "device" });
using xq = new Buffer(device, { size: BigInt(64 * 16384), memory: "device" });
// scales and sums: 64 tokens x 16384 columns in groups of 16 (the GGML integer-dot path's)
using xscale = new Buffer(device, { size: BigInt(4 * 64 * 1024), memory: "device" });
using xsum = new Buffer(device, { size: BigInt(4 * 64 * 1024), memory: "device" });
using queries = new QueryPool(device, 2);
using commands = new CommandPool(device);
using fence = new Fence(device);
using kernels = new GemvKernels(device, config);
// One set per (pipeline, bindings) reused by every case that binds them (setFor): the cases outnumber
// any fixed pool (--ggml ran out of it: VK_ERROR_OUT_OF_POOL_MEMORY); the distinct pipelines are few.
using descriptors = new DescriptorPool(device, 128, 768);
const cachedSets = new Map<ComputePipeline, Map<string, bigint>>();
function setFor(p: ComputePipeline, tag: string, bindings: Parameters<DescriptorPool["allocate"]>[1]): bigint {
  let byTag = cachedSets.get(p);
  if (!byTag) cachedSets.set(p, (byTag = new Map()));
  let set = byTag.get(tag);
  if (set === undefined) byTag.set(tag, (set = descriptors.allocate(p, bindings)));
  return set;
}
const period = info.limits.timestampPeriod;

/** Records `body` between two timestamps, runs it `reps` times; best GPU ns and best host ns. */
function measure(body: (cb: ReturnType<CommandPool["allocate"]>) => void, reps = quick || cpuLike ? 3 : 7): { gpuNs: number; hostNs: number } {
  const cb = commands.allocate().begin();
  cb.resetQueries(queries).timestamp(queries, 0, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT);
  body(cb);
  cb.timestamp(queries, 1, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT).end();
  using submission = new Submission(device, [cb], { fence });
  let gpuNs = Infinity, hostNs = Infinity;
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    submission.submit();
    if (!fence.wait(600_000_000_000n)) throw new Error("benchmark batch did not finish in 10 minutes");
    const t1 = performance.now();
    fence.reset();
    const ts = queries.results();
    gpuNs = Math.min(gpuNs, Number(ts[1]! - ts[0]!) * period);
    hostNs = Math.min(hostNs, (t1 - t0) * 1e6);
  }
  return { gpuNs, hostNs };
}

// The device's read bandwidth: stream the whole pool.
using stream = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256 } });
const streamSet = descriptors.allocate(stream, [{ buffer: pool, range: BigInt(Math.min(poolBytes, info.limits.maxStorageBufferRange)) }, { buffer: sink }]);
const streamBytes = Math.min(poolBytes, info.limits.maxStorageBufferRange);
const streamGroups = cpuLike ? 256 : 4096;
const read = measure((cb) => {
  for (let i = 0; i < 4; i++) cb.bind(stream, streamSet).pushConstants(stream, new Uint32Array([0, streamBytes / 16])).dispatch(streamGroups);
});
const readGBs = (4 * streamBytes) / read.gpuNs;
console.log(`\nstreaming read: ${(4 * streamBytes / MiB).toFixed(0)} MiB in ${(read.gpuNs / 1e3).toFixed(0)} µs = ${readGBs.toFixed(1)} GB/s (device read bandwidth baseline)`);

interface Case { label: string; I: number; O: number; format: QuantFormat | GgmlBlockType; S: number; idp?: boolean; alone?: boolean }
const cases: Case[] = [
  { label: "2048->768", I: 2048, O: 768, format: "q4", S: 1 },
  { label: "768->2048", I: 768, O: 2048, format: "q4", S: 1 },
  { label: "4096->14336", I: 4096, O: 14336, format: "q4", S: 1 },
  { label: "8192->16384 (64 MiB)", I: 8192, O: 16384, format: "q4", S: 1 },
  { label: "2048->768", I: 2048, O: 768, format: "q8", S: 1 },
  { label: "4096->14336", I: 4096, O: 14336, format: "q8", S: 1 },
  { label: "2048->768 int-dot", I: 2048, O: 768, format: "q4", S: 1, idp: true },
  { label: "4096->14336 int-dot", I: 4096, O: 14336, format: "q4", S: 1, idp: true },
  { label: "8192->16384 (64 MiB) int-dot", I: 8192, O: 16384, format: "q4", S: 1, idp: true },
  { label: "4096->14336 int-dot", I: 4096, O: 14336, format: "q8", S: 1, idp: true },
  { label: "2048->768 S=8", I: 2048, O: 768, format: "q4", S: 8 },
  { label: "4096->14336 S=8", I: 4096, O: 14336, format: "q4", S: 8 },
  // GGML types: the issue's 4096x14336 both ways, and Qwen3-30B-A3B's attention shapes (hidden 2048:
  // q 2048->4096, k/v 2048->512, o 4096->2048); each float and integer-dot
  ...(["Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"] as const).flatMap((format) => [0, 1, 2].filter((path) => path < 2 || idpAlone).flatMap((path) => [
    { label: "4096->14336", I: 4096, O: 14336, format, S: 1 },
    { label: "14336->4096", I: 14336, O: 4096, format, S: 1 },
    { label: "2048->4096", I: 2048, O: 4096, format, S: 1 },
    { label: "2048->512", I: 2048, O: 512, format, S: 1 },
    { label: "4096->2048", I: 4096, O: 2048, format, S: 1 },
  ].map((c) => ({ ...c, idp: path > 0, alone: path === 2, label: `${c.label}${["", " int-dot", " int-dot alone"][path]}` })))),
  // several tokens a call (a batch's decode step): Q4_K and Q6_K, the float and integer-dot GEMVs
  ...([2, 4, 8] as const).flatMap((S) => (["Q4_K", "Q6_K"] as const).flatMap((format) => [
    { label: `4096->14336 S=${S}`, I: 4096, O: 14336, format, S },
    { label: `4096->14336 S=${S} int-dot`, I: 4096, O: 14336, format, S, idp: true },
    ...(idpAlone ? [{ label: `4096->14336 S=${S} int-dot alone`, I: 4096, O: 14336, format, S, idp: true, alone: true }] : []),
  ])),
];
const ggmlKernels = new Map<GgmlBlockType, GgmlGemvKernel>();
const ggmlKernel = (t: GgmlBlockType) => {
  let k = ggmlKernels.get(t);
  if (!k) ggmlKernels.set(t, (k = new GgmlGemvKernel(device, t, { ...ggmlShape, factored })));
  return k;
};
const ggmlIdpKernels = new Map<GgmlBlockType, GgmlGemvIdpKernel>();
const ggmlIdpKernel = (t: GgmlBlockType) => {
  let k = ggmlIdpKernels.get(t);
  if (!k) ggmlIdpKernels.set(t, (k = new GgmlGemvIdpKernel(device, t, ggmlShape)));
  return k;
};
const idpOn = plan.integerDot.on || (forceIdp && device.enabled.integerDotProduct);
const isGgml = (f: Case["format"]): f is GgmlBlockType => f in GGML_BLOCK_LAYOUTS;
const rows: string[][] = [["shape (I->O), path", "fmt", "S", "matrices", "working set", "GPU µs", "host µs batched", "host µs 1 submit", "GB/s", "of read BW"]];
const chosen = gemmIdpMode ? [] : (onlyGgml ? cases.filter((c) => isGgml(c.format)) : cases).filter((c) => only === undefined || `${c.label} ${c.format}`.includes(only));
for (const c of quick ? [...chosen.filter((c) => !isGgml(c.format)).slice(0, 3), ...chosen.filter((c) => isGgml(c.format) && c.O === 14336).slice(0, 2)] : chosen) {
  const ggml = isGgml(c.format) ? GGML_BLOCK_LAYOUTS[c.format] : undefined;
  const rowWords = ggml ? 0 : rowWordsFor(c.format as QuantFormat, c.I);
  // GGML types: the file's block bytes (scales inside the blocks); 16 bytes more, which the kernel may read
  const weightBytes = ggml ? c.O * (c.I / ggml.blockElements) * ggml.blockBytes : c.O * rowWords * 4;
  const scaleBytes = ggml ? 0 : scaleWordsFor("f16", c.O * groupsPerRowFor(c.I, GROUP)) * 4;
  const stride = Math.ceil((weightBytes + scaleBytes + 16) / 256) * 256;
  const count = Math.floor(poolBytes / stride);
  if (count < 2) continue;
  if (c.idp && !idpOn) continue;
  const gk = isGgml(c.format) ? (c.idp ? ggmlIdpKernel(c.format) : ggmlKernel(c.format)) : undefined;
  const groups = Math.ceil(c.O / (gk ? gk.rowsPerWorkgroup : config.rowsPerWorkgroup));
  const [gx, gy] = kernels.grid(groups);
  const gpr = groupsPerRowFor(c.I, GROUP);
  const xqRowWords = Math.ceil(c.I / 16) * 4;
  let one: (cb: ReturnType<CommandPool["allocate"]>, m: number) => void;
  let before = (_cb: ReturnType<CommandPool["allocate"]>) => {}; // once a batch, not counted a GEMV
  if (gk && c.idp) {
    // Per GEMV: quantize x in groups of 16, a barrier, the integer-dot GEMV (all counted), as GgmlGemvIdpKernel.record.
    const q = kernels.pipeline(QUANTIZE_ACT, false, GGML_IDP_GROUP);
    const p = gk.pipeline;
    const qset = setFor(q, "quantize", [{ buffer: x }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }]);
    const set = setFor(p, "ggml idp", [{ buffer: pool }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }, { buffer: y }]);
    const groups16 = c.I / GGML_IDP_GROUP;
    const [qx, qy] = kernels.grid(Math.ceil((c.S * groups16 * (GGML_IDP_GROUP / 4)) / config.workgroupSize));
    const qpc = new Uint32Array([c.I, c.S, groups16, 0, c.I / 4]);
    const pc = (m: number) => new Uint32Array([c.O, c.I, c.S, m * stride, 0]);
    one = c.alone
      ? (cb, m) => cb.bind(p, set).pushConstants(p, pc(m)).dispatch(gx, gy)
      : (cb, m) => cb.bind(q, qset).pushConstants(q, qpc).dispatch(qx, qy).barrier("computeToCompute").bind(p, set).pushConstants(p, pc(m)).dispatch(gx, gy).barrier("computeToCompute");
    if (c.alone) before = (cb) => cb.bind(q, qset).pushConstants(q, qpc).dispatch(qx, qy).barrier("computeToCompute");
  } else if (gk) {
    const p = gk.pipeline;
    const set = setFor(p, "ggml", [{ buffer: pool }, { buffer: x }, { buffer: y }]);
    const pc = (m: number) => new Uint32Array([c.O, c.I, c.S, m * stride, 0, 0]);
    one = (cb, m) => cb.bind(p, set).pushConstants(p, pc(m)).dispatch(gx, gy);
  } else if (!c.idp) {
    const p = kernels.pipeline(GEMV[c.format as QuantFormat], true, GROUP);
    const set = setFor(p, "gemv", [{ buffer: pool }, { buffer: pool }, { buffer: x }, { buffer: y }]);
    const pc = (m: number) => new Uint32Array([c.O, c.I, c.S, rowWords, gpr, (m * stride) / 16, (m * stride + weightBytes) / 4, 0, 0]);
    one = (cb, m) => cb.bind(p, set).pushConstants(p, pc(m)).dispatch(gx, gy);
  } else {
    // Per GEMV: quantize the activations, a barrier, the integer-dot GEMV (all counted).
    const q = kernels.pipeline(QUANTIZE_ACT, false, GROUP);
    const p = kernels.pipeline(GEMV_IDP[c.format as QuantFormat], true, GROUP);
    const qset = setFor(q, "quantize", [{ buffer: x }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }]);
    const set = setFor(p, "gemv idp", [{ buffer: pool }, { buffer: pool }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }, { buffer: y }]);
    const [qx, qy] = kernels.grid(Math.ceil((c.S * gpr * (GROUP / 4)) / config.workgroupSize));
    const qpc = new Uint32Array([c.I, c.S, gpr, 0, xqRowWords]);
    const pc = (m: number) => new Uint32Array([c.O, c.I, c.S, rowWords, gpr, (m * stride) / 16, (m * stride + weightBytes) / 4, xqRowWords, 0]);
    one = (cb, m) => cb.bind(q, qset).pushConstants(q, qpc).dispatch(qx, qy).barrier("computeToCompute").bind(p, set).pushConstants(p, pc(m)).dispatch(gx, gy).barrier("computeToCompute");
  }
  // Software rasterizers are ~1000x slower: keep their batches short (the ratio, not the size, matters).
  const reps = cpuLike ? Math.min(count, 8) : Math.max(count, Math.min(4 * count, 400));
  const batch = measure((cb) => {
    before(cb);
    for (let r = 0; r < reps; r++) one(cb, r % count);
  });
  const single = measure((cb) => {
    before(cb);
    one(cb, 0);
  }, cpuLike ? 3 : 20);
  const gpuUs = batch.gpuNs / reps / 1e3;
  const gbs = (weightBytes + scaleBytes) / (batch.gpuNs / reps);
  rows.push([c.label, c.format, String(c.S), String(count), `${((count * stride) / MiB).toFixed(0)} MiB`, gpuUs.toFixed(1), (batch.hostNs / reps / 1e3).toFixed(1), (single.hostNs / 1e3).toFixed(1), gbs.toPrecision(3), `${((100 * gbs) / readGBs).toFixed(0)}%`]);
}
const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
if (!gemmIdpMode) console.log(`\n${new Date().toISOString().slice(0, 10)} ${info.name}, ${info.driverName} ${info.driverInfo}; q4/q8 group ${GROUP}, f16 scales; GB/s over weight+scale bytes (GGML types: the file's block bytes); GPU µs from timestamps over a batch`);
if (ggmlKernels.size) {
  const k = [...ggmlKernels.values()][0]!;
  console.log(`GGML types: dec_gemv_ggml float path${k.factored ? " (factored)" : ""}${ggmlIdpKernels.size ? ` and dec_gemv_ggml_idp (int-dot: quantize_act in groups of 16 counted${idpAlone ? "; int-dot alone: x quantized once a batch" : ""})` : ""}, ${k.workgroupSize} threads x ${k.rowsPerWorkgroup} rows per workgroup, ${k.tokensPerChunk} tokens per chunk; slices a lane: float ${k.slicesPerLane}${[...ggmlIdpKernels].map(([t, ik]) => `, ${t} int-dot ${ik.slicesPerLane}`).join("")}`);
}
for (const k of ggmlKernels.values()) k[Symbol.dispose]();
for (const k of ggmlIdpKernels.values()) k[Symbol.dispose]();
if (!gemmIdpMode) for (const r of rows) console.log(`| ${r.map((v, i) => v.padEnd(widths[i]!)).join(" | ")} |`);

if (gemmIdpMode) {
  if (!idpOn) throw new Error(`--gemm-idp: the integer-dot decision is off on ${info.name} (${plan.integerDot.reason}); --force-idp runs it where the device has the feature`);
  const S = GGML_GEMM_TOKENS;
  type Call = (cb: ReturnType<CommandPool["allocate"]>, m: number) => void;
  /** Best GPU ns a call of each of `calls` (a batch rotating m over `count` matrices), alternated over rounds after first touch and warm clocks. */
  const timeAlternated = (calls: Call[], count: number): number[] => {
    const reps = cpuLike ? Math.min(count, 4) : Math.max(count, Math.min(4 * count, 400));
    const batch = (one: Call) => (cb: ReturnType<CommandPool["allocate"]>) => {
      for (let r = 0; r < reps; r++) one(cb, r % count);
    };
    // pipelines and first touch, then clocks up (an H200 idles at ~345 MHz; as bench-moe-ggml.ts): ~0.1 s of streaming reads (400 GiB)
    for (const one of calls) measure(batch(one), 1);
    if (!cpuLike) readBandwidth(device, 1024 * MiB, 100);
    const best = calls.map(() => Infinity);
    for (let round = 0; round < (cpuLike ? 1 : 3); round++) calls.forEach((one, i) => (best[i] = Math.min(best[i]!, measure(batch(one)).gpuNs / reps)));
    return best;
  };
  const strideOf = (format: GgmlBlockType, O: number, I: number) => {
    const { blockElements, blockBytes } = GGML_BLOCK_LAYOUTS[format];
    return Math.ceil((O * (I / blockElements) * blockBytes + 16) / 256) * 256;
  };
  const us = (ns: number) => (ns / 1e3).toFixed(1);
  // Qwen3-30B-A3B's attention (hidden 2048, 32 q heads and 4 kv heads of 128): q, k/v, o
  const shapes = [{ label: "q 2048->4096", I: 2048, O: 4096 }, { label: "k/v 2048->512", I: 2048, O: 512 }, { label: "o 4096->2048", I: 4096, O: 2048 }];
  const table: string[][] = [["matrix (I->O)", "fmt", "slices a step", "matrices", "float µs", "idp µs", "idp GEMM alone µs", "float TFLOP/s", "idp TFLOP/s", "float / idp"]];
  const qkvTable: string[][] = [["q+k+v 2048->4096, 512, 512", "fmt", "slices a step", "float µs", "idp µs (each its own quantize)", "idp µs (one quantize)", "float / idp", "float / idp, one quantize"]];
  const splitTable: string[][] = [["matrix (I->O)", "fmt", "slices a step", "runs x columns", "float µs", "float split µs", "idp µs", "idp split µs", "float: unsplit / split", "idp: unsplit / split"]];
  using quantize = new GgmlQuantizeKernel(device);
  const scratch = { xq, xscale, xsum };
  for (const format of ["Q4_K", "Q6_K"] as const) {
    using floatGemm = new GgmlGemmKernel(device, format);
    const idpGemms = gemmSteps.map((slicesPerStep) => new GgmlGemmIdpKernel(device, format, { slicesPerStep }));
    using _ = { [Symbol.dispose]: () => idpGemms.forEach((k) => k[Symbol.dispose]()) };
    // unsplit: the partial tiles' and arrival words' bindings are y (never read: splits 1)
    const fset = setFor(floatGemm.pipeline, "gemm float", [{ buffer: pool }, { buffer: x }, { buffer: y }, { buffer: y }, { buffer: y }]);
    const isets = idpGemms.map((k) => setFor(k.pipeline, "gemm idp", [{ buffer: pool }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }, { buffer: y }, { buffer: y }, { buffer: y }]));
    const grid = (O: number, splits: number): [number, number, number] => [Math.ceil(O / GGML_GEMM_ROWS), Math.ceil(S / GGML_GEMM_TOKENS), splits];
    /** A split call's descriptor sets (the scratch's buffers bound) and push words; undefined: unsplit. */
    interface SplitBinding { float: bigint; idp: bigint[]; splits: number; splitCols: number }
    // one matrix's GEMM at byte offset `at` of the pool, no barrier
    const floatGemmAt = (cb: ReturnType<CommandPool["allocate"]>, O: number, I: number, at: number, sp?: SplitBinding) =>
      cb.bind(floatGemm.pipeline, sp?.float ?? fset).pushConstants(floatGemm.pipeline, new Uint32Array([O, I, S, at, 0, 0, sp?.splits ?? 1, sp?.splitCols ?? I])).dispatch(...grid(O, sp?.splits ?? 1));
    const idpGemmAt = (i: number) => (cb: ReturnType<CommandPool["allocate"]>, O: number, I: number, at: number, sp?: SplitBinding) =>
      cb.bind(idpGemms[i]!.pipeline, sp?.idp[i] ?? isets[i]!).pushConstants(idpGemms[i]!.pipeline, new Uint32Array([O, I, S, at, 0, sp?.splits ?? 1, sp?.splitCols ?? I])).dispatch(...grid(O, sp?.splits ?? 1));
    const quantizeX = (cb: ReturnType<CommandPool["allocate"]>, I: number) => quantize.record(cb, x, 0, scratch, I, S).barrier("computeToCompute");
    for (const c of quick ? shapes.slice(0, 1) : shapes) {
      const stride = strideOf(format, c.O, c.I);
      const count = Math.floor(poolBytes / stride);
      if (count < 2) continue;
      // each call as the graph records a prompt chunk's matrix, a barrier after it (its consumer waits)
      const floatCall: Call = (cb, m) => floatGemmAt(cb, c.O, c.I, m * stride).barrier("computeToCompute");
      const alone = idpGemms.map((_, i): Call => (cb, m) => idpGemmAt(i)(cb, c.O, c.I, m * stride).barrier("computeToCompute"));
      const idpCall = alone.map((a): Call => (cb, m) => a(quantizeX(cb, c.I), m));
      const [floatNs, ...rest] = timeAlternated([floatCall, ...idpCall, ...alone], count);
      const idpNs = rest.slice(0, idpCall.length), aloneNs = rest.slice(idpCall.length);
      const flops = 2 * c.O * c.I * S;
      idpGemms.forEach((k, i) => {
        const row = [c.label, format, String(k.slicesPerStep), String(count), us(floatNs!), us(idpNs[i]!), us(aloneNs[i]!), (flops / floatNs! / 1e3).toFixed(2), (flops / idpNs[i]! / 1e3).toFixed(2), `${(floatNs! / idpNs[i]!).toFixed(2)}x`];
        table.push(row);
        console.log(`  ${row.join(" | ")}`);
      });
    }
    // o and k/v (few rows: what gemmSplits splits on a GPU) split over the columns against unsplit,
    // each call a barrier after it as the graph records it (calls on one scratch must not overlap)
    for (const c of quick || (gemmSplitsAsked ?? 2) < 2 ? [] : shapes.filter((sh) => sh.O <= 2048)) {
      const stride = strideOf(format, c.O, c.I);
      const count = Math.floor(poolBytes / stride);
      if (count < 2) continue;
      const chosen = gemmSplits(device, c.O, c.I);
      using scratch = new GemmSplitScratch(device, c.O, c.I, S, gemmSplitsAsked ?? (chosen > 1 ? chosen : 4), GGML_BLOCK_LAYOUTS[format].blockElements);
      const bound = [{ buffer: scratch.part }, { buffer: scratch.arrived }];
      const sp: SplitBinding = {
        float: setFor(floatGemm.pipeline, `gemm float split ${c.label}`, [{ buffer: pool }, { buffer: x }, { buffer: y }, ...bound]),
        idp: idpGemms.map((k) => setFor(k.pipeline, `gemm idp split ${c.label}`, [{ buffer: pool }, { buffer: xq }, { buffer: xscale }, { buffer: xsum }, { buffer: y }, ...bound])),
        splits: scratch.splits, splitCols: scratch.splitCols,
      };
      const floatCall = (split?: SplitBinding): Call => (cb, m) => floatGemmAt(cb, c.O, c.I, m * stride, split).barrier("computeToCompute");
      const idpCall = (i: number, split?: SplitBinding): Call => (cb, m) => idpGemmAt(i)(quantizeX(cb, c.I), c.O, c.I, m * stride, split).barrier("computeToCompute");
      const [floatNs, floatSplitNs, ...rest] = timeAlternated([floatCall(), floatCall(sp), ...idpGemms.flatMap((_, i) => [idpCall(i), idpCall(i, sp)])], count);
      idpGemms.forEach((k, i) => {
        const idpNs = rest[2 * i]!, idpSplitNs = rest[2 * i + 1]!;
        const row = [c.label, format, String(k.slicesPerStep), `${scratch.splits} x ${scratch.splitCols}`, us(floatNs!), us(floatSplitNs!), us(idpNs), us(idpSplitNs), `${(floatNs! / floatSplitNs!).toFixed(2)}x`, `${(idpNs / idpSplitNs).toFixed(2)}x`];
        splitTable.push(row);
        console.log(`  ${row.join(" | ")}`);
      });
    }
    if (quick) continue;
    // q, k and v of one chunk as the graph records them (DeviceLinear.record back to back, then one
    // barrier): the float GEMMs overlap; each idp GEMM waits behind its own quantize's barrier, which
    // also waits for the GEMM before it. "One quantize": x quantized once for all three (recordQuantized,
    // as the graphs now record a chunk: the input norm's quantized rows feed them, NormFeed). Unsplit.
    const qkv = [4096, 512, 512], I = 2048, stride = strideOf(format, 4096, I);
    const count = Math.floor(poolBytes / stride) - 2;
    if (count < 2) continue;
    const floatQkv: Call = (cb, m) => {
      qkv.forEach((O, k) => floatGemmAt(cb, O, I, (m + k) * stride));
      cb.barrier("computeToCompute");
    };
    const ownQuantize = idpGemms.map((_, i): Call => (cb, m) => {
      qkv.forEach((O, k) => idpGemmAt(i)(quantizeX(cb, I), O, I, (m + k) * stride));
      cb.barrier("computeToCompute");
    });
    const oneQuantize = idpGemms.map((_, i): Call => (cb, m) => {
      quantizeX(cb, I);
      qkv.forEach((O, k) => idpGemmAt(i)(cb, O, I, (m + k) * stride));
      cb.barrier("computeToCompute");
    });
    const [floatNs, ...rest] = timeAlternated([floatQkv, ...ownQuantize, ...oneQuantize], count);
    idpGemms.forEach((k, i) => {
      const own = rest[i]!, one = rest[idpGemms.length + i]!;
      const row = ["q+k+v as recorded", format, String(k.slicesPerStep), us(floatNs!), us(own), us(one), `${(floatNs! / own).toFixed(2)}x`, `${(floatNs! / one).toFixed(2)}x`];
      qkvTable.push(row);
      console.log(`  ${row.join(" | ")}`);
    });
  }
  const print = (t: string[][]) => {
    const w = t[0]!.map((_, i) => Math.max(...t.map((r) => r[i]!.length)));
    for (const r of t) console.log(`| ${r.map((v, i) => v.padEnd(w[i]!)).join(" | ")} |`);
  };
  console.log(`\n${new Date().toISOString().slice(0, 10)} ${info.name}, ${info.driverName} ${info.driverInfo}; GGML prompt-chunk GEMMs, S = ${S}, tiles of ${GGML_GEMM_ROWS} rows x ${GGML_GEMM_TOKENS} tokens; µs per call (a barrier after each) from GPU timestamps over a batch rotating through ${(poolBytes / MiB).toFixed(0)} MiB of matrices, best of ${cpuLike ? 3 : 21} batches, the kernels alternated; idp µs counts quantize_act and its barrier; float / idp > 1: the integer-dot GEMM is faster`);
  print(table);
  if (qkvTable.length > 1) print(qkvTable);
  if (splitTable.length > 1) {
    console.log(`split over the columns (GemmSplitScratch, runs of whole blocks; gemmSplits on this device: k/v ${gemmSplits(device, 512, 2048)}, o ${gemmSplits(device, 2048, 4096)}); idp µs counts quantize_act; unsplit / split > 1: the split is faster`);
    print(splitTable);
  }
}
