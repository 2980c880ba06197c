/**
 * The matrix-core GEMM's self-check: one q8 prompt-chunk GEMM (64 x 96, 64 tokens, every row and
 * token tile edge) through dec_gemm_quant_cm against gemvReference before the graphs route any chunk
 * to it. A driver that computes the products wrong (as the kernel's tiles did on NVIDIA 580.159 until
 * they were 16-byte aligned: two columns of each 32-column step summed as zero, NMSE 6e-2) then leaves
 * the prompt chunks on the f32 / integer-dot GEMMs, with one line saying why, instead of answering
 * wrong. Once per device.
 */
import { gemvReference } from "../../quant/gemv-reference.ts";
import { nmse } from "../../quant/metrics.ts";
import { quantize } from "../../quant/quantize.ts";
import { randomGaussianF32 } from "../../quant/random.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { downloadBytes, uploadBytes } from "../../vk/transfer.ts";
import { DeviceMatrix } from "../gemv.ts";
import { submitAndWait } from "./common.ts";
import { QuantGemmKernel } from "./quant-gemm.ts";

/** The self-check's bound: f16 inputs and f32 sums give ~1e-7 on random data. */
export const COOPMAT_CHECK_BOUND = 1e-5;

export interface CoopmatCheck {
  ok: boolean;
  nmse: number;
  why: string;
}

const verdicts = new WeakMap<Device, CoopmatCheck>();

/**
 * Runs the check (variant: the real kernel, or its emulation for tests) or returns this device's
 * cached verdict for the real kernel.
 */
export function coopmatSelfCheck(device: Device, variant: true | "emulated" = true, bound = COOPMAT_CHECK_BOUND): CoopmatCheck {
  const cached = variant === true && bound === COOPMAT_CHECK_BOUND ? verdicts.get(device) : undefined;
  if (cached) return cached;
  const O = 96, I = 64, S = 64;
  const m = quantize({ dtype: "f32", data: randomGaussianF32(O * I, 1) }, O, I, { format: "q8", scaleType: "f16", groupSize: 32 });
  const x = randomGaussianF32(S * I, 2);
  using kernel = new QuantGemmKernel(device, "q8", true, 32, { matrixCores: variant });
  using matrix = new DeviceMatrix(device, m);
  using xb = new Buffer(device, { size: BigInt(4 * S * I), memory: "device" });
  using yb = new Buffer(device, { size: BigInt(4 * S * O), memory: "device" });
  uploadBytes(device, xb, 0n, new Uint8Array(x.buffer));
  submitAndWait(device, (cb) => kernel.record(cb, { matrix, x: xb, y: yb, S }));
  const y = new Float32Array(downloadBytes(device, yb, 0n, 4 * S * O).buffer);
  const e = nmse(gemvReference(m, x, S), y);
  const ok = e <= bound;
  const verdict = { ok, nmse: e, why: ok ? `self-check NMSE ${e.toExponential(1)}` : `the matrix-core GEMM failed its self-check on ${device.info.name} (NMSE ${e.toExponential(1)} > ${bound})` };
  if (variant === true && bound === COOPMAT_CHECK_BOUND) verdicts.set(device, verdict);
  return verdict;
}

const warned = new WeakSet<Device>();

/** The self-check's verdict for the real kernel on this device, with one line on stderr the first time it fails. */
export function matrixCoresPass(device: Device): boolean {
  const check = coopmatSelfCheck(device);
  if (!check.ok && !warned.has(device)) {
    warned.add(device);
    console.error(`vkmoe: ${check.why}: prompt chunks keep the f32 / integer-dot GEMMs`);
  }
  return check.ok;
}
