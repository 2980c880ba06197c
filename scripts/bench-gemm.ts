// GPU µs of one prompt-chunk GEMM (S = 64 tokens) as the graphs record it (DeviceLinear, a barrier
// after each call), on the same matrices in the same run: the f32 tiled GEMM (dec_gemm_quant /
// dec_gemm_ggml; for q4/q8 with 1 and 2 slices a step), and the integer-dot GEMM of the GGML types
// (dec_gemm_ggml_idp over x quantized once beforehand, as the norm feeds it; where the integer-dot
// decision is on), for q4/q8 (the q4_0/q8_0 files' layout) and Q4_K / Q6_K at Qwen3-30B-A3B's
// attention shapes and Qwen3.6's in_proj_qkv. Each call rotates over enough copies of the matrix to
// leave the L2; clocks warmed by a streaming read; best of 3 alternated rounds. Prints µs, TFLOP/s
// and the f32 GEMM's time over each other kernel's.
// --splits N,M,...: each matrix's GEMM split over its columns into that many runs (LinearKernelsOptions
// .gemmSplits; 0: gemmSplits' choice, the default), every kernel, one table row per count.
//   bun scripts/bench-gemm.ts [--only TEXT] [--reps N] [--splits 0,4,8]
import { parseArgs } from "node:util";
import { z } from "zod";
import { DeviceLinear, LinearKernels } from "../src/graph/device-linear.ts";
import { GgmlIdpScratch, GgmlQuantizeKernel } from "../src/kernels/decoder/ggml-gemv.ts";
import { GgmlBlockLinear, QuantLinear, type Linear } from "../src/model/linear.ts";
import { GGML_BLOCK_LAYOUTS, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { mulberry32 } from "../src/quant/random.ts";
import { Buffer, VulkanContext, type CommandBuffer } from "../src/vk/index.ts";
import { args, fail } from "./lib/cli.ts";
import { readBandwidth, timeOnGpu } from "./lib/gpu-time.ts";
import { randomQuantMatrix } from "./lib/synthetic.ts";

const SCRIPT = "bench-gemm";
const USAGE = "usage: bun scripts/bench-gemm.ts [--only TEXT] [--reps N] [--splits 0,4,8]";
let flags: { only?: string; reps: number; splits: number[] };
try {
  const { values } = parseArgs({ args: args(), options: { only: { type: "string" }, reps: { type: "string" }, splits: { type: "string" } }, strict: true, allowPositionals: false });
  const parsed = z.object({ only: z.string().min(1).optional(), reps: z.coerce.number().int().min(1).default(64),
    splits: z.string().default("0").transform((v) => v.split(",").map(Number)).pipe(z.array(z.number().int().min(0).max(64)).min(1)) }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}

const S = 64;
const SHAPES = [
  { label: "q 2048->4096", I: 2048, O: 4096 },
  { label: "k/v 2048->512", I: 2048, O: 512 },
  { label: "o 4096->2048", I: 4096, O: 2048 },
  { label: "qkv 2048->8192 (Qwen3.6)", I: 2048, O: 8192 },
];
const FORMATS = ["q4", "q8", "Q4_K", "Q6_K"] as const;
/** Copies of a matrix a timing rotates over (past the H200's 50 MB L2). */
const L2_BYTES = 96 << 20;

using ctx = new VulkanContext();
const device = ctx.device;
const info = device.info;


function randomBlocks(type: GgmlBlockType, rows: number, cols: number, seed: number): Uint8Array {
  const { blockElements, blockBytes, halfOffsets } = GGML_BLOCK_LAYOUTS[type];
  const rand = mulberry32(seed);
  const bytes = new Uint8Array(rows * (cols / blockElements) * blockBytes);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(rand() * 256);
  for (let p = 0; p < bytes.length; p += blockBytes) {
    for (const h of halfOffsets) {
      const bits = f32ToF16Bits((rand() < 0.5 ? -1 : 1) * 2 ** (-10 + 4 * rand()));
      bytes[p + h] = bits & 0xff;
      bytes[p + h + 1] = bits >> 8;
    }
  }
  return bytes;
}

function linearOf(format: (typeof FORMATS)[number], O: number, I: number, seed: number): Linear {
  if (format === "q4" || format === "q8") return new QuantLinear(randomQuantMatrix({ format, groupSize: 32, scaleType: "f16", hidden: I, intermediate: O }, O, I, seed));
  return new GgmlBlockLinear(format, randomBlocks(format, O, I, seed), O, I, "blk.0.attn_q.weight");
}

using x = new Buffer(device, { size: BigInt(4 * S * 8192), memory: "device" });
using y = new Buffer(device, { size: BigInt(4 * S * 8192), memory: "device" });
using quantizeKernel = new GgmlQuantizeKernel(device);
const table: string[][] = [["matrix (I->O)", "fmt", "splits", "copies", "f32 µs", "f32 2 slices µs", "idp µs", "f32 TFLOP/s", "f32 / 2 slices", "f32 / idp"]];
for (const splitsAsked of flags.splits) {
  const gemmSplits = splitsAsked > 0 ? { gemmSplits: () => splitsAsked } : {};
  using f32Kernels = new LinearKernels(device, { ggmlGemmIdp: false, ...gemmSplits });
  using twoSliceKernels = new LinearKernels(device, { ggmlGemmIdp: false, quantGemmSlices: 2, ...gemmSplits });
  using idpKernels = new LinearKernels(device, gemmSplits);
for (const shape of SHAPES) {
  for (const format of FORMATS) {
    const label = `${shape.label} ${format}`;
    if (flags.only && !label.includes(flags.only)) continue;
    const one = linearOf(format, shape.O, shape.I, 1);
    const copies = Math.max(2, Math.min(16, Math.ceil(L2_BYTES / one.bytes)));
    const linears = [one, ...Array.from({ length: copies - 1 }, (_, i) => linearOf(format, shape.O, shape.I, 2 + i))];
    const make = (k: LinearKernels | undefined) => (k ? linears.map((l, i) => new DeviceLinear(k, `m${i}`, l)) : []);
    const quant = format === "q4" || format === "q8";
    const f32s = make(f32Kernels), twos = quant ? make(twoSliceKernels) : [], idps = quant || !idpKernels.ggmlGemmIdp ? [] : make(idpKernels);
    using _ = { [Symbol.dispose]: () => [...f32s, ...twos, ...idps].forEach((d) => d[Symbol.dispose]()) };
    using scratch = idps.length ? new GgmlIdpScratch(device, shape.I, S) : undefined;
    const calls = (ms: DeviceLinear[], quantized?: GgmlIdpScratch) => (cb: CommandBuffer) => {
      for (let r = 0; r < flags.reps; r++) {
        ms[r % ms.length]!.recordFrom(cb, x, quantized, y, S);
        cb.barrier("computeToCompute");
      }
    };
    const kinds = [calls(f32s), ...(twos.length ? [calls(twos)] : []), ...(idps.length ? [calls(idps, scratch)] : [])];
    if (scratch) timeOnGpu(device, (cb) => quantizeKernel.record(cb, x, 0, scratch, shape.I, S), 1);
    for (const k of kinds) timeOnGpu(device, k, 1); // pipelines, descriptor sets, first touch
    readBandwidth(device, 1 << 30, 50); // clocks up
    const best = kinds.map(() => Infinity);
    for (let round = 0; round < 3; round++) kinds.forEach((k, i) => (best[i] = Math.min(best[i]!, timeOnGpu(device, k, 3) / flags.reps)));
    const f32Ns = best[0]!, twoNs = twos.length ? best[1] : undefined, idpNs = idps.length ? best[best.length - 1] : undefined;
    const flop = 2 * shape.O * shape.I * S;
    const us = (ns: number | undefined) => (ns === undefined ? "-" : (ns / 1e3).toFixed(1));
    const row = [shape.label, format, splitsAsked ? String(splitsAsked) : "default", String(copies), us(f32Ns), us(twoNs), us(idpNs), (flop / f32Ns / 1e3).toFixed(1),
      twoNs ? `${(f32Ns / twoNs).toFixed(2)}x` : "-", idpNs ? `${(f32Ns / idpNs).toFixed(2)}x` : "-"];
    table.push(row);
    console.log(`  ${row.join(" | ")}`);
  }
}
}
const w = table[0]!.map((_, i) => Math.max(...table.map((r) => r[i]!.length)));
console.log(`\n${new Date().toISOString().slice(0, 10)} ${info.name}, ${info.driverName} ${info.driverInfo}; prompt-chunk GEMMs, S = ${S}, µs per call with a barrier after each (GPU timestamps over ${flags.reps} calls), split over the columns where DeviceLinear splits; idp reads x quantized once beforehand; f32 / X > 1: X is faster`);
for (const r of table) console.log(`| ${r.map((v, i) => v.padEnd(w[i]!)).join(" | ")} |`);
