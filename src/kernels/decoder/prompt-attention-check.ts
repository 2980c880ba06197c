/**
 * dec_attention_cm's self-check, as the matrix-core GEMM's (coopmat-check.ts): one causal call of 70
 * tokens from position 0 (two row blocks at GQA 8, a partial last key tile) for the model's heads and
 * head_dim, against an f64 reference over the same f16 keys and values, before a graph routes any
 * prompt chunk's attention to it. A driver that computes it wrong leaves the chunks on the 64-query
 * calls, with one line saying why. Once per device and attention shape.
 */
import { f16BitsToF32, f32ToF16Bits } from "../../quant/half.ts";
import { nmse } from "../../quant/metrics.ts";
import { randomGaussianF32 } from "../../quant/random.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { downloadBytes, uploadBytes } from "../../vk/transfer.ts";
import { submitAndWait } from "./common.ts";
import { PromptAttentionKernel } from "./prompt-attention.ts";

/** q and the softmax weights rounded to f16 give ~1e-7 on random data. */
export const PROMPT_ATTENTION_CHECK_BOUND = 1e-5;
const TOKENS = 70;

export interface PromptAttentionCheck {
  ok: boolean;
  nmse: number;
  why: string;
}

const verdicts = new WeakMap<Device, Map<string, PromptAttentionCheck>>();

/**
 * Causal attention of S tokens from position 0 in f64: q [S][heads][hd], keys / values [S][kvHeads][hd]
 * (model/ops.ts attendCpu's sums; its own here, as coopmat-check.ts takes quant's reference: the
 * kernels do not import the model layer).
 */
function reference(q: Float32Array, k: Float32Array, v: Float32Array, S: number, heads: number, kvHeads: number, hd: number): Float32Array {
  const out = new Float32Array(S * heads * hd), G = heads / kvHeads, scale = 1 / Math.sqrt(hd);
  const w = new Float64Array(S), acc = new Float64Array(hd);
  for (let t = 0; t < S; t++) {
    for (let h = 0; h < heads; h++) {
      const qo = (t * heads + h) * hd, kh = Math.floor(h / G);
      let most = -Infinity;
      for (let p = 0; p <= t; p++) {
        let dot = 0;
        for (let i = 0; i < hd; i++) dot += q[qo + i]! * k[(p * kvHeads + kh) * hd + i]!;
        w[p] = dot * scale;
        most = Math.max(most, w[p]!);
      }
      let sum = 0;
      for (let p = 0; p <= t; p++) sum += w[p] = Math.exp(w[p]! - most);
      acc.fill(0);
      for (let p = 0; p <= t; p++) for (let i = 0; i < hd; i++) acc[i] = acc[i]! + (w[p]! / sum) * v[(p * kvHeads + kh) * hd + i]!;
      for (let i = 0; i < hd; i++) out[qo + i] = acc[i]!;
    }
  }
  return out;
}

/** f16 keys or values: the bits for the GPU, their exact values for the reference. */
function halves(count: number, seed: number): { bits: Uint16Array; values: Float32Array } {
  const x = randomGaussianF32(count, seed), bits = new Uint16Array(count), values = new Float32Array(count);
  for (let i = 0; i < count; i++) values[i] = f16BitsToF32((bits[i] = f32ToF16Bits(x[i]!)));
  return { bits, values };
}

/**
 * Runs the check (variant: the real kernel, or its emulation for tests) or returns this device's
 * cached verdict for the real kernel at this shape.
 */
export function promptAttentionSelfCheck(
  device: Device, shape: { heads: number; kvHeads: number; headDim: number }, variant: true | "emulated" = true, bound = PROMPT_ATTENTION_CHECK_BOUND,
): PromptAttentionCheck {
  const key = `${shape.heads}/${shape.kvHeads}/${shape.headDim}`;
  const cacheable = variant === true && bound === PROMPT_ATTENTION_CHECK_BOUND;
  const cached = cacheable ? verdicts.get(device)?.get(key) : undefined;
  if (cached) return cached;
  const { heads, kvHeads, headDim: hd } = shape, S = TOKENS;
  using kernel = new PromptAttentionKernel(device, { ...shape, matrixCores: variant, maxBindings: 1 });
  const q = randomGaussianF32(S * heads * hd, 11, 2), k = halves(S * kvHeads * hd, 12), v = halves(S * kvHeads * hd, 13);
  const buffer = (bytes: number) => new Buffer(device, { size: BigInt(bytes), memory: "device" });
  using qb = buffer(q.byteLength), kb = buffer(k.bits.byteLength), vb = buffer(v.bits.byteLength), ob = buffer(q.byteLength);
  uploadBytes(device, qb, 0n, new Uint8Array(q.buffer));
  uploadBytes(device, kb, 0n, new Uint8Array(k.bits.buffer));
  uploadBytes(device, vb, 0n, new Uint8Array(v.bits.buffer));
  const binding = kernel.bind({ q: qb, keys: kb, values: vb, out: ob });
  submitAndWait(device, (cb) => kernel.record(cb, binding, { n: 1, S, maxPositions: S }));
  const got = new Float32Array(downloadBytes(device, ob, 0n, q.byteLength).buffer);
  const e = nmse(reference(q, k.values, v.values, S, heads, kvHeads, hd), got);
  const ok = e <= bound;
  const verdict = {
    ok, nmse: e,
    why: ok ? `self-check NMSE ${e.toExponential(1)}` : `the matrix-core attention failed its self-check on ${device.info.name} at head_dim ${hd} (NMSE ${e.toExponential(1)} > ${bound})`,
  };
  if (cacheable) {
    let m = verdicts.get(device);
    if (!m) verdicts.set(device, (m = new Map()));
    m.set(key, verdict);
  }
  return verdict;
}

const warned = new WeakMap<Device, Set<string>>();

/** The check's verdict for the real kernel at this shape, with one line on stderr the first time it fails on this device. */
export function promptAttentionPasses(device: Device, shape: { heads: number; kvHeads: number; headDim: number }): boolean {
  const check = promptAttentionSelfCheck(device, shape);
  let seen = warned.get(device);
  if (!seen) warned.set(device, (seen = new Set()));
  if (!check.ok && !seen.has(check.why)) {
    seen.add(check.why);
    console.error(`vkmoe: ${check.why}: prompt chunks' attention keeps the 64-query calls`);
  }
  return check.ok;
}
