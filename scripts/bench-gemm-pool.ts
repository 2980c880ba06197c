// Prompt-chunk GEMMs of q4/q8 pool matrices (Q4_0 / Q8_0 files' dense projections), S = 64: the float
// dec_gemm_quant the graphs run by default against the integer-dot dec_gemm_quant_idp of
// VKMOE_QUANT_GEMM_IDP=on (its quantize_act and barrier counted, and alone: the graphs feed it the
// norm's quantized rows where they can). Qwen3.6-35B-A3B-like shapes (hidden 2048), f16 scales per
// 32 columns as GGUF's blocks, in one run: each call a barrier after it, as the graph records a chunk's
// matrix, split over the columns where gemmSplits splits it on this device (one scratch, as
// DeviceLinear); a batch rotating through more matrices than the last-level cache holds, clocks warmed
// by streaming reads before each shape, the kernels alternated over rounds, best batch. Prints
// float µs / idp µs (> 1: the integer-dot GEMM is faster), and where the device has cooperative
// matrices the matrix-core dec_gemm_quant_cm (64-row tiles, split as gemmSplits splits those) and float / cm.
//   bun scripts/bench-gemm-pool.ts [--quick]
import { readConfig } from "../src/config.ts";
import { GgmlIdpScratch } from "../src/kernels/decoder/ggml-gemv.ts";
import { COOPMAT_GEMM_ROWS, GEMM_TOKENS, GemmSplitScratch, gemmSplits, QuantGemmKernel, splitRuns } from "../src/kernels/decoder/quant-gemm.ts";
import { QuantGemmIdpKernel } from "../src/kernels/decoder/quant-gemm-idp.ts";
import { DeviceMatrix } from "../src/kernels/gemv.ts";
import { planKernels } from "../src/kernels/setup.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { createQuantMatrix } from "../src/quant/layout.ts";
import type { QuantFormat } from "../src/quant/types.ts";
import { describeDevice } from "../src/vk/banner.ts";
import { VulkanContext } from "../src/vk/context.ts";
import { Buffer, uploadBytes, type CommandBuffer } from "../src/vk/index.ts";
import { Args, fail } from "./lib/cli.ts";
import { readBandwidth, timeOnGpu } from "./lib/gpu-time.ts";
import { fillRandomWords, randomActivations } from "./lib/synthetic.ts";
import { formatTable } from "./lib/table.ts";

const SCRIPT = "bench-gemm-pool";
const opts = new Args(SCRIPT, { flags: ["--quick"], ints: [] });
const quick = opts.flag("--quick");
const env = readConfig();
using ctx = new VulkanContext({ integerDotProduct: "on" }, env);
const device = ctx.device;
if (!device.enabled.integerDotProduct) fail(SCRIPT, `${device.info.name} has no shaderIntegerDotProduct: there is no integer-dot GEMM to time`);
const plan = planKernels(device, env);
const cpuDevice = device.info.type === 4;
console.log(describeDevice(device.info).slice(0, 2).join("\n"));
if (!plan.integerDot.on) console.log(`note: the integer-dot decision is off here (${plan.integerDot.reason}); timed anyway`);
const MiB = 2 ** 20;
const S = GEMM_TOKENS;

// Qwen3.6-35B-A3B-like (hidden 2048): in_proj_qkv, in_proj_z, out_proj / o_proj, q_proj (query + gate), the shared expert's gate/up and down
const SHAPES = quick ? [{ label: "o 256->64", I: 256, O: 64 }] : [
  { label: "qkv 2048->8192", I: 2048, O: 8192 }, { label: "z 2048->4096", I: 2048, O: 4096 }, { label: "q+gate 2048->8192", I: 2048, O: 8192 },
  { label: "out/o 4096->2048", I: 4096, O: 2048 }, { label: "shared gate 2048->512", I: 2048, O: 512 }, { label: "shared down 512->2048", I: 512, O: 2048 },
];

/** A random q4/q8 matrix with finite f16 scales. */
function randomMatrix(format: QuantFormat, rows: number, cols: number, seed: number) {
  const m = createQuantMatrix(format, rows, cols, 32, "f16");
  fillRandomWords(m.weights, seed);
  const half = f32ToF16Bits(2 ** -6);
  m.scales.fill(half | (half << 16));
  return m;
}

const coopmat = device.enabled.cooperativeMatrix;
if (!coopmat) console.log(`note: no matrix-core GEMM here (${device.decisions.find((d) => d.name === "cooperativeMatrix")?.reason})`);
const rows: string[][] = [["matrix (I->O)", "fmt", "runs", "float µs", "idp µs", "idp alone µs", "float / idp", "float / idp alone", ...(coopmat ? ["cm runs", "cm µs", "float / cm"] : [])]];
using x = new Buffer(device, { size: BigInt(4 * S * 4096), memory: "device" });
uploadBytes(device, x, 0n, new Uint8Array(randomActivations(S, 4096, 11).buffer));
using y = new Buffer(device, { size: BigInt(4 * S * 8192), memory: "device" });
for (const format of ["q4", "q8"] as const) {
  using floatGemm = new QuantGemmKernel(device, format, true, 32);
  using idpGemm = new QuantGemmIdpKernel(device, format, true, 32);
  using cmGemm = coopmat ? new QuantGemmKernel(device, format, true, 32, { matrixCores: true }) : undefined;
  for (const c of SHAPES) {
    const one = randomMatrix(format, c.O, c.I, c.O + c.I);
    const bytes = one.weights.byteLength + one.scales.byteLength;
    const count = cpuDevice ? 2 : Math.max(2, Math.min(16, Math.ceil((256 * MiB) / bytes)));
    using stack = new DisposableStack();
    const mats = Array.from({ length: count }, () => stack.use(new DeviceMatrix(device, one)));
    using scratch = new GgmlIdpScratch(device, c.I, S);
    const splits = gemmSplits(device, c.O, c.I);
    const split = splits > 1 && splitRuns(c.I, splits).splits > 1 ? stack.use(new GemmSplitScratch(device, c.O, c.I, S, splits)) : undefined;
    const cmSplits = gemmSplits(device, c.O, c.I, COOPMAT_GEMM_ROWS);
    const cmSplit = cmSplits > 1 && splitRuns(c.I, cmSplits).splits > 1 ? stack.use(new GemmSplitScratch(device, c.O, c.I, S, cmSplits)) : undefined;
    const reps = cpuDevice ? 2 : Math.max(count, 64);
    const batch = (call: (cb: CommandBuffer, m: DeviceMatrix) => void) => (cb: CommandBuffer) => {
      for (let r = 0; r < reps; r++) call(cb, mats[r % count]!);
    };
    const calls = [
      batch((cb, matrix) => floatGemm.record(cb, { matrix, x, y, S }, split).barrier("computeToCompute")),
      batch((cb, matrix) => idpGemm.record(cb, { matrix, x, y, S, scratch }, split).barrier("computeToCompute")),
      batch((cb, matrix) => idpGemm.recordQuantized(cb, { matrix, y, S, scratch }, split).barrier("computeToCompute")),
      ...(cmGemm ? [batch((cb, matrix) => cmGemm.record(cb, { matrix, x, y, S }, cmSplit).barrier("computeToCompute"))] : []),
    ];
    if (!cpuDevice) readBandwidth(device, 1024 * MiB, 100); // clocks up (an idle H200 runs at ~345 MHz)
    const best = calls.map(() => Infinity);
    for (let round = 0; round < (cpuDevice ? 1 : 3); round++) calls.forEach((body, i) => (best[i] = Math.min(best[i]!, timeOnGpu(device, body, cpuDevice ? 1 : 5) / reps)));
    const [f, q, a, cm] = best.map((ns) => ns / 1e3) as [number, number, number, number | undefined];
    rows.push([c.label, format, String(split?.splits ?? 1), f.toFixed(1), q.toFixed(1), a.toFixed(1), `${(f / q).toFixed(2)}x`, `${(f / a).toFixed(2)}x`,
      ...(cm === undefined ? [] : [String(cmSplit?.splits ?? 1), cm.toFixed(1), `${(f / cm).toFixed(2)}x`])]);
    console.error(`${SCRIPT}: ${rows.at(-1)!.join(" | ")}`);
  }
}
console.log(`\n${new Date().toISOString().slice(0, 10)} ${device.info.name}; q4/q8 pool GEMMs, S = ${S}, f16 scales per 32 columns; µs per call (a barrier after each), best batch of the kernels alternated; idp counts quantize_act and its barrier, "alone" reads rows already quantized`);
console.log(formatTable(rows));
