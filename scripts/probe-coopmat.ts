// Diagnoses the matrix-core prompt-chunk GEMM (dec_gemm_quant_cm) on this driver, against its emulated
// variant (the same tiles, plain sums) and the f64 oracle: one q8 matrix of 64 rows x 64 columns (two
// 32-column steps), 64 tokens (one tile). Prints
//   - the NMSE of random x, and which tokens and rows carry the error (relative error > 1e-2);
//   - for one-hot x (every token a 1 in column k, k = 0..63), the columns k whose weight column does
//     not come out (y[s][o] should equal W[o][k]);
//   - whether three calls agree bit for bit.
// Exits 1 when a kernel is past the self-check's bound (COOPMAT_CHECK_BOUND) or differs between calls.
// On a device with cooperative matrices (VKMOE_COOPMAT=khr / nv picks the extension).
//   bun run probe:coopmat
import { readConfig } from "../src/config.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { COOPMAT_CHECK_BOUND } from "../src/kernels/decoder/coopmat-check.ts";
import { QuantGemmKernel } from "../src/kernels/decoder/quant-gemm.ts";
import { DeviceMatrix } from "../src/kernels/gemv.ts";
import { gemvReference } from "../src/quant/gemv-reference.ts";
import { nmse } from "../src/quant/metrics.ts";
import { quantize } from "../src/quant/quantize.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { describeDevice } from "../src/vk/banner.ts";
import { VulkanContext } from "../src/vk/context.ts";
import { Buffer, downloadBytes, uploadBytes } from "../src/vk/index.ts";

const env = readConfig();
using ctx = new VulkanContext({}, env);
const device = ctx.device;
console.log(describeDevice(device.info).slice(0, 2).join("\n"));
console.log(`cooperativeMatrix: ${device.decisions.find((d) => d.name === "cooperativeMatrix")?.reason}`);
const O = 64, I = 64, S = 64;
const m = quantize({ dtype: "f32", data: randomGaussianF32(O * I, 1) }, O, I, { format: "q8", scaleType: "f16", groupSize: 32 });
using matrix = new DeviceMatrix(device, m);
using xb = new Buffer(device, { size: BigInt(4 * S * I), memory: "device" });
using yb = new Buffer(device, { size: BigInt(4 * S * O), memory: "device" });

function run(kernel: QuantGemmKernel, x: Float32Array): Float32Array {
  uploadBytes(device, xb, 0n, new Uint8Array(x.buffer));
  submitAndWait(device, (cb) => kernel.record(cb, { matrix, x: xb, y: yb, S }));
  return new Float32Array(downloadBytes(device, yb, 0n, 4 * S * O).buffer.slice(0));
}

/** Indices (by `of`) whose relative error over their elements exceeds 1e-2. */
function badBy(ref: Float64Array, got: Float32Array, of: (i: number) => number, n: number): number[] {
  const err = new Float64Array(n), energy = new Float64Array(n);
  for (let i = 0; i < ref.length; i++) {
    const j = of(i);
    err[j]! += (ref[i]! - got[i]!) ** 2;
    energy[j]! += ref[i]! ** 2;
  }
  return Array.from({ length: n }, (_, j) => j).filter((j) => err[j]! > 1e-2 * Math.max(energy[j]!, 1e-30));
}

let failed = false;
const variants: (true | "emulated")[] = device.enabled.cooperativeMatrix ? [true, "emulated"] : ["emulated"];
for (const v of variants) {
  using kernel = new QuantGemmKernel(device, "q8", true, 32, { matrixCores: v });
  const x = randomGaussianF32(S * I, 2);
  const ref = gemvReference(m, x, S);
  const ys = [run(kernel, x), run(kernel, x), run(kernel, x)];
  const y = ys[0]!;
  const same = ys.every((z) => z.every((f, i) => Object.is(f, y[i])));
  const e = nmse(ref, y);
  if (!(e <= COOPMAT_CHECK_BOUND) || !same) failed = true;
  console.log(`${v === true ? "matrix cores" : "emulated"}: random x NMSE ${e.toExponential(2)}, 3 calls ${same ? "equal" : "DIFFER"}`);
  console.log(`  bad tokens: [${badBy(ref, y, (i) => Math.floor(i / O), S).join(" ")}]`);
  console.log(`  bad rows: [${badBy(ref, y, (i) => i % O, O).join(" ")}]`);
  const missing: string[] = [];
  for (let k = 0; k < I; k++) {
    const xk = new Float32Array(S * I);
    for (let s = 0; s < S; s++) xk[s * I + k] = 1;
    const refK = gemvReference(m, xk, S), yk = run(kernel, xk);
    const tokens = badBy(refK, yk, (i) => Math.floor(i / O), S);
    if (tokens.length > 0) missing.push(`k ${k}: ${tokens.length === S ? "all tokens" : `tokens ${tokens.join(",")}`}${yk.every((f) => f === 0) ? " (all zero)" : ""}`);
  }
  console.log(`  one-hot columns wrong: ${missing.length === 0 ? "none" : missing.join("; ")}`);
}
if (failed) process.exit(1);
