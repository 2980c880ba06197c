/**
 * Rotate-half RoPE of q and k in place and the f16 KV-cache write of k and v
 * (shaders/dec_rope_kv.comp), for S tokens at consecutive positions, or (batched) S tokens of
 * different sequences each at its own position and cache row; optionally each q and k head
 * RMS-normalised first (Qwen3's q_norm / k_norm, as ops.ts rmsNorm over headDim), fused in.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/**
 * q rw, k rw, v r, inverse frequencies r, k cache w (uint: two halves), v cache w, positions r,
 * norm weights r (binding 7); push S, heads, kvHeads, headDim, pos0, posIndex, flags, ctx,
 * qOffset, kOffset, vOffset, kCacheOffset, vCacheOffset, invOffset, qNormOffset, kNormOffset
 * (uints, bytes 0..63), eps (f32, byte 64), rotaryDim (byte 68): 72 B. flags: bit 0 positions
 * buffer, bit 1 write the cache, bit 2 head norm, bit 3 batched.
 */
export const DEC_ROPE_KV: ShaderInterface = { name: "dec_rope_kv", storageBuffers: 8, pushConstantBytes: 72 };
/** Angles (position x inverse frequency <= 1) must stay below 2^24 for the exact reduction. */
export const ROPE_MAX_POSITION = 1 << 24;
/** Batched calls: token t's position is positions word posIndex + t, its cache row word posIndex + BATCH_WORDS + t. */
export const BATCH_WORDS = 64;

export interface RopeKvArgs {
  /** [S][heads][headDim] f32 at qOffset, rotated in place. */
  q: Buffer;
  /** [S][kvHeads][headDim] f32 at kOffset, rotated in place (and cached). */
  k: Buffer;
  /** [S][kvHeads][headDim] f32 at vOffset (cached). */
  v: Buffer;
  /** rotaryDim / 2 f32 inverse frequencies at invOffset (ops.ts ropeInverseFrequencies). */
  invFreq: Buffer;
  /** f16 caches [ctx][kvHeads][headDim]; the layer's base at k/vCacheOffset, counted in halves (even). */
  kCache: Buffer;
  vCache: Buffer;
  S: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Cache rows (positions >= ctx are rotated but not cached). */
  ctx: number;
  /** Token t is at pos0 + t (+ positions[posIndex] when `positions` is given). */
  pos0: number;
  positions?: Buffer;
  posIndex?: number;
  /**
   * Tokens of different sequences (one decode step of each, up to BATCH_WORDS): token t's
   * position is positions[posIndex + t] and its cache row positions[posIndex + BATCH_WORDS + t]
   * (rows of all the sequences in one cache of ctx rows). Needs `positions`; pos0 is ignored.
   */
  batched?: boolean;
  /** Write k and v into the caches (default true). */
  writeCache?: boolean;
  qOffset?: number;
  kOffset?: number;
  vOffset?: number;
  invOffset?: number;
  kCacheOffset?: number;
  vCacheOffset?: number;
  /**
   * RMS-normalise each q head and each k head (not v) before rotating: x / sqrt(mean(x^2) + eps) * w,
   * as ops.ts rmsNorm over headDim; w = headDim floats of `weights` at qOffset (q heads) and at
   * kOffset (k heads), element offsets.
   */
  norm?: { weights: Buffer; qOffset: number; kOffset: number; eps: number };
  /**
   * Partial rotary (Qwen3.5): only the first rotaryDim dims of each head rotate (i with
   * i + rotaryDim / 2), the rest pass through; a multiple of 4, default headDim (all).
   */
  rotaryDim?: number;
}

export interface RopeKvKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup (one head of one token each; headDim / 4 of them work), default 64. */
  workgroupSize?: number;
  /** Head norm: reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

export class RopeKvKernel extends DecoderKernel {
  constructor(device: Device, options: RopeKvKernelOptions = {}) {
    const wg = options.workgroupSize ?? 64;
    if (!Number.isInteger(wg) || wg < 1) throw new InvalidArgumentError(`workgroupSize must be a positive integer, got ${wg}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_ROPE_KV, { 0: wg, 2: sub ? 1 : 0 }, options);
  }

  /** Records one dispatch: (heads + kvHeads) x S workgroups. The caller places barriers around it. */
  record(cb: CommandBuffer, a: RopeKvArgs): CommandBuffer {
    const { S, heads, kvHeads, headDim: hd, ctx, pos0 } = a;
    for (const [name, v] of [["S", S], ["heads", heads], ["kvHeads", kvHeads], ["ctx", ctx]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    if (!Number.isInteger(hd) || hd < 4 || hd % 4 !== 0) throw new InvalidArgumentError(`headDim must be a multiple of 4, got ${hd}`);
    if (heads % kvHeads !== 0) throw new InvalidArgumentError(`heads (${heads}) must be a multiple of kvHeads (${kvHeads})`);
    if (!Number.isInteger(pos0) || pos0 < 0 || (!a.positions && pos0 + S > ROPE_MAX_POSITION)) throw new InvalidArgumentError(`positions must lie in 0..2^24, got ${pos0}+${S}`);
    const rd = a.rotaryDim ?? hd;
    if (!Number.isInteger(rd) || rd < 4 || rd % 4 !== 0 || rd > hd) throw new InvalidArgumentError(`rotaryDim must be a multiple of 4 in 4..headDim (${hd}), got ${rd}`);
    const qOffset = a.qOffset ?? 0, kOffset = a.kOffset ?? 0, vOffset = a.vOffset ?? 0, invOffset = a.invOffset ?? 0;
    const kc = a.kCacheOffset ?? 0, vc = a.vCacheOffset ?? 0;
    if (kc % 2 !== 0 || vc % 2 !== 0) throw new InvalidArgumentError("cache offsets are counted in halves and must be even");
    const posIndex = a.posIndex ?? 0;
    checkRange("rope q", a.q, qOffset, S * heads * hd);
    checkRange("rope k", a.k, kOffset, S * kvHeads * hd);
    checkRange("rope v", a.v, vOffset, S * kvHeads * hd);
    checkRange("rope invFreq", a.invFreq, invOffset, rd / 2);
    checkRange("rope k cache", a.kCache, kc / 2, (ctx * kvHeads * hd) / 2);
    checkRange("rope v cache", a.vCache, vc / 2, (ctx * kvHeads * hd) / 2);
    if (a.batched) {
      if (!a.positions) throw new InvalidArgumentError("a batched call reads each token's position and cache row from `positions`");
      if (S > BATCH_WORDS) throw new InvalidArgumentError(`a batched call takes at most ${BATCH_WORDS} tokens, got ${S}`);
      checkRange("rope positions", a.positions, posIndex, BATCH_WORDS + S);
    } else if (a.positions) checkRange("rope positions", a.positions, posIndex, 1);
    const norm = a.norm;
    if (norm) {
      checkRange("rope q norm", norm.weights, norm.qOffset, hd);
      checkRange("rope k norm", norm.weights, norm.kOffset, hd);
      if (!(norm.eps >= 0 && Number.isFinite(norm.eps))) throw new InvalidArgumentError(`norm eps must be finite and >= 0, got ${norm.eps}`);
    }
    const writeCache = a.writeCache ?? true;
    const flags = (a.positions && !a.batched ? 1 : 0) | (writeCache ? 2 : 0) | (norm ? 4 : 0) | (a.batched ? 8 : 0);
    const set = this.setFor([a.q, a.k, a.v, a.invFreq, a.kCache, a.vCache, a.positions ?? a.invFreq, norm?.weights ?? a.invFreq]);
    const pc = pushWords(
      [S, heads, kvHeads, hd, pos0, posIndex, flags, ctx, qOffset, kOffset, vOffset, kc / 2, vc / 2, invOffset, norm?.qOffset ?? 0, norm?.kOffset ?? 0, norm?.eps ?? 0, rd],
      [16],
    );
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(heads + kvHeads, S);
  }
}
