/**
 * The matrix-core GEMM's self-check: one q8 prompt-chunk GEMM (64 x 96, 64 tokens, every row and
 * token tile edge) through dec_gemm_quant_cm against gemvReference before the graphs route any chunk
 * to it. A driver that computes the products wrong (as the kernel's tiles did on NVIDIA 580.159 until
 * they were 16-byte aligned: two columns of each 32-column step summed as zero, NMSE 6e-2) then leaves
 * the prompt chunks on the f32 / integer-dot GEMMs, with one line saying why, instead of answering
 * wrong. Once per device. The wide tile's check (wide-gemm.ts) runs through the same q8GemmCheck.
 */
import { gemvReference } from "../../quant/gemv-reference.ts";
import { nmse } from "../../quant/metrics.ts";
import { quantize } from "../../quant/quantize.ts";
import { randomGaussianF32 } from "../../quant/random.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { downloadBytes, uploadBytes } from "../../vk/transfer.ts";
import { DeviceMatrix } from "../gemv.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import { submitAndWait } from "./common.ts";
import { QuantGemmKernel } from "./quant-gemm.ts";
import type { QuantGemvArgs } from "./quant-gemv.ts";

/** The self-check's bound: f16 inputs and f32 sums give ~1e-7 on random data. */
export const COOPMAT_CHECK_BOUND = 1e-5;

export interface CoopmatCheck {
  ok: boolean;
  nmse: number;
  why: string;
}

/** A q8 prompt-chunk GEMM under check (QuantGemmKernel on the matrix cores, QuantGemmWideKernel). */
export interface Q8GemmUnderCheck {
  record(cb: CommandBuffer, a: QuantGemvArgs): CommandBuffer;
}

/**
 * A self-check of the matrix-core GEMM `kernel`: one GEMM of a random q8 matrix (O x I, f16 scales per
 * 32 columns, from `seed`) over S random tokens (seed + 1) against gemvReference (64 tokens a call);
 * `what` names the kernel in the reason of a failure.
 */
export function q8GemmCheck(device: Device, kernel: Q8GemmUnderCheck, shape: { O: number; I: number; S: number }, seed: number, what: string, bound: number): CoopmatCheck {
  const { O, I, S } = shape;
  const m = quantize({ dtype: "f32", data: randomGaussianF32(O * I, seed) }, O, I, { format: "q8", scaleType: "f16", groupSize: 32 });
  const x = randomGaussianF32(S * I, seed + 1);
  using matrix = new DeviceMatrix(device, m);
  using xb = new Buffer(device, { size: BigInt(4 * S * I), memory: "device" });
  using yb = new Buffer(device, { size: BigInt(4 * S * O), memory: "device" });
  uploadBytes(device, xb, 0n, new Uint8Array(x.buffer));
  submitAndWait(device, (cb) => kernel.record(cb, { matrix, x: xb, y: yb, S }));
  const y = new Float32Array(downloadBytes(device, yb, 0n, 4 * S * O).buffer);
  const ref = new Float64Array(S * O);
  for (let s0 = 0; s0 < S; s0 += 64) {
    const n = Math.min(64, S - s0);
    ref.set(gemvReference(m, x.subarray(s0 * I, (s0 + n) * I), n), s0 * O);
  }
  const e = nmse(ref, y);
  const ok = e <= bound;
  return { ok, nmse: e, why: ok ? `self-check NMSE ${e.toExponential(1)}` : `${what} failed its self-check on ${device.info.name} (NMSE ${e.toExponential(1)} > ${bound})` };
}

/**
 * A self-check's verdict, run once per device for the real kernel at the default bound (kept in
 * `verdicts`); the emulated variant (tests) or another bound runs every time.
 */
export function checkOnce(verdicts: WeakMap<Device, CoopmatCheck>, device: Device, variant: true | "emulated", bound: number, run: () => CoopmatCheck): CoopmatCheck {
  const kept = variant === true && bound === COOPMAT_CHECK_BOUND;
  const cached = kept ? verdicts.get(device) : undefined;
  if (cached) return cached;
  const verdict = run();
  if (kept) verdicts.set(device, verdict);
  return verdict;
}

/** Whether a check passed, with one line on stderr (`consequence` after its reason) the first time it fails on this device. */
export function passesOrSays(check: CoopmatCheck, device: Device, warned: WeakSet<Device>, consequence: string): boolean {
  if (!check.ok && !warned.has(device)) {
    warned.add(device);
    console.error(`vkmoe: ${check.why}: ${consequence}`);
  }
  return check.ok;
}

const verdicts = new WeakMap<Device, CoopmatCheck>();

/**
 * Runs the check (variant: the real kernel, or its emulation for tests) or returns this device's
 * cached verdict for the real kernel.
 */
export function coopmatSelfCheck(device: Device, variant: true | "emulated" = true, bound = COOPMAT_CHECK_BOUND): CoopmatCheck {
  return checkOnce(verdicts, device, variant, bound, () => {
    using kernel = new QuantGemmKernel(device, "q8", true, 32, { matrixCores: variant });
    return q8GemmCheck(device, kernel, { O: 96, I: 64, S: 64 }, 1, "the matrix-core GEMM", bound);
  });
}

const warned = new WeakSet<Device>();

/** The self-check's verdict for the real kernel on this device, with one line on stderr the first time it fails. */
export function matrixCoresPass(device: Device): boolean {
  return passesOrSays(coopmatSelfCheck(device), device, warned, "prompt chunks keep the f32 / integer-dot GEMMs");
}
