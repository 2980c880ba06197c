/**
 * Gated DeltaNet's core on the GPU (shaders/dec_delta_rule.comp): S = 1..64 tokens through the gated
 * delta rule in order (the recurrent form, src/model/linear-attention.ts gatedDeltaRuleRecurrent),
 * one dispatch per layer with the ops around it fused in: the q/k L2 norms, the gates from the
 * a/b projections (beta = sigmoid(b), g = −exp(A_log) · softplus(a + dt_bias), as
 * src/model/hybrid-decoder.ts), and optionally the gated RMSNorm of the output
 * (linear-attention.ts gatedRmsNorm). One workgroup per value head; the f32 state
 * [valueHeads][keyDim][valueDim] (transformers' recurrent_state, batch dropped) lives in a device
 * buffer, read once and written once per call (zeros for a new sequence).
 *
 * Layouts (element offsets, token strides, all f32): q, k and v of token t in one buffer, as the
 * conv output row gives them (defaults: q at 0, k at keyHeads · keyDim, v at 2 · keyHeads · keyDim,
 * stride 2 · keyHeads · keyDim + valueHeads · valueDim); a, b (or g, beta) [S][valueHeads]; z and
 * out [S][valueHeads · valueDim]; negA (−exp(A_log)), dtBias [valueHeads] and the norm weight
 * [valueDim] at offsets of one parameter buffer.
 *
 * With `runs` (a batch of sequences, src/kernels/decoder/runs.ts) each sequence's tokens run in
 * order on its own state, a workgroup per (sequence, value head): a decode round of S sequences is
 * S x valueHeads independent workgroups, not S dependent steps of valueHeads.
 *
 * A prompt chunk runs its tokens one after another inside each workgroup (S dependent steps of a
 * rank-1 update): right for decode, slow for long prompts, where a chunk-parallel kernel belongs.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { checkRuns, RUNS_MAX_TOKENS, type RunsBinding } from "./runs.ts";

/**
 * qkv r, a r, b r, z r, params r, state rw, out w, runs r; push S, keyHeads, valueHeads, qOffset, kOffset,
 * vOffset, qkvStride, aOffset, aStride, bOffset, bStride, zOffset, zStride, outOffset, outStride,
 * stateOffset, negAOffset, dtBiasOffset, normOffset (uints), eps (f32, byte 76), flags, stateStride: 88 B.
 */
export const DEC_DELTA_RULE: ShaderInterface = { name: "dec_delta_rule", storageBuffers: 8, pushConstantBytes: 88 };
export const DELTA_RULE_MAX_S = 64;
/** State rows each invocation keeps in registers by default (keyDim / parts). */
const DEFAULT_ROWS = 32;

export interface DeltaRuleArgs {
  S: number;
  keyHeads: number;
  /** A multiple of keyHeads: value head h reads key head floor(h / (valueHeads / keyHeads)). */
  valueHeads: number;
  /** q, k, v (not yet L2-normalised): see the module comment for the default layout. */
  qkv: Buffer;
  qOffset?: number;
  kOffset?: number;
  vOffset?: number;
  qkvStride?: number;
  /**
   * The in_proj_a and in_proj_b outputs [S][valueHeads] (token t at offset + t · stride), or with
   * `gatesGiven` the log decay g and beta themselves.
   */
  a: Buffer;
  b: Buffer;
  aOffset?: number;
  aStride?: number;
  bOffset?: number;
  bStride?: number;
  gatesGiven?: boolean;
  /** negA, dtBias (unless gatesGiven) and the gated norm's weight, at element offsets (needed unless gatesGiven without norm). */
  params?: Buffer;
  negAOffset?: number;
  dtBiasOffset?: number;
  /** [valueHeads][keyDim][valueDim] f32 at stateOffset, updated in place. */
  state: Buffer;
  stateOffset?: number;
  /** [S][valueHeads · valueDim] at outOffset + t · outStride: the core output, or its gated norm with `norm`. */
  out: Buffer;
  outOffset?: number;
  outStride?: number;
  /** The gated RMSNorm fused in: out = w · (o / sqrt(mean(o²) + eps)) · silu(z) per head, w at params[weightOffset]. */
  norm?: { z: Buffer; zOffset?: number; zStride?: number; weightOffset: number; eps: number };
  /** A batch: the tokens' sequences and their states, `runs.stateStride` floats apart from stateOffset (see the module comment). */
  runs?: RunsBinding;
}

export interface DeltaRuleKernelOptions extends DecoderKernelOptions {
  /** Invocations per state column (each keeps keyDim / parts rows in registers); default keyDim / 32, at least 1. */
  parts?: number;
  /** Gated norm: reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

/** One pipeline per (keyDim, valueDim): both size the workgroup and its registers. */
export class DeltaRuleKernel extends DecoderKernel {
  readonly keyDim: number;
  readonly valueDim: number;
  readonly parts: number;
  readonly workgroupSize: number;

  constructor(device: Device, dims: { keyDim: number; valueDim: number }, options: DeltaRuleKernelOptions = {}) {
    const { keyDim, valueDim } = dims;
    for (const [name, v] of [["keyDim", keyDim], ["valueDim", valueDim]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    const parts = options.parts ?? Math.max(1, Math.floor(keyDim / DEFAULT_ROWS));
    if (!Number.isInteger(parts) || parts < 1 || keyDim % parts !== 0) throw new InvalidArgumentError(`parts must divide keyDim (${keyDim}), got ${parts}`);
    const wg = valueDim * parts, maxWg = device.info.limits.maxComputeWorkGroupInvocations;
    if (wg > maxWg) throw new InvalidArgumentError(`valueDim ${valueDim} x ${parts} parts = ${wg} invocations, over the device's ${maxWg}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_DELTA_RULE, { 0: wg, 1: keyDim, 2: parts, 3: sub ? 1 : 0 }, options);
    this.keyDim = keyDim;
    this.valueDim = valueDim;
    this.parts = parts;
    this.workgroupSize = wg;
  }

  /** Floats of one layer's state: valueHeads · keyDim · valueDim. */
  stateFloats(valueHeads: number): number {
    return valueHeads * this.keyDim * this.valueDim;
  }

  /** Records one dispatch of valueHeads workgroups (x S rows with runs). The caller places barriers around it. */
  record(cb: CommandBuffer, a: DeltaRuleArgs): CommandBuffer {
    const { S, keyHeads: Hk, valueHeads: Hv } = a;
    const Dk = this.keyDim, Dv = this.valueDim;
    if (!Number.isInteger(S) || S < 1 || S > DELTA_RULE_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${DELTA_RULE_MAX_S}, got ${S}`);
    for (const [name, v] of [["keyHeads", Hk], ["valueHeads", Hv]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    if (Hv % Hk !== 0) throw new InvalidArgumentError(`valueHeads (${Hv}) must be a multiple of keyHeads (${Hk})`);
    if (Hv > this.device.info.limits.maxComputeWorkGroupCount[0]!) throw new InvalidArgumentError(`valueHeads ${Hv} is more workgroups than the device dispatches in x`);
    const Kd = Hk * Dk, Vd = Hv * Dv;
    const qOffset = a.qOffset ?? 0, kOffset = a.kOffset ?? Kd, vOffset = a.vOffset ?? 2 * Kd, qkvStride = a.qkvStride ?? 2 * Kd + Vd;
    const aOffset = a.aOffset ?? 0, aStride = a.aStride ?? Hv, bOffset = a.bOffset ?? 0, bStride = a.bStride ?? Hv;
    const outOffset = a.outOffset ?? 0, outStride = a.outStride ?? Vd, stateOffset = a.stateOffset ?? 0;
    const given = a.gatesGiven ?? false;
    const negAOffset = a.negAOffset ?? 0, dtBiasOffset = a.dtBiasOffset ?? 0;
    const rows = (stride: number, width: number) => (S - 1) * stride + width;
    checkRange("delta rule q", a.qkv, qOffset, rows(qkvStride, Kd));
    checkRange("delta rule k", a.qkv, kOffset, rows(qkvStride, Kd));
    checkRange("delta rule v", a.qkv, vOffset, rows(qkvStride, Vd));
    checkRange("delta rule a", a.a, aOffset, rows(aStride, Hv));
    checkRange("delta rule b", a.b, bOffset, rows(bStride, Hv));
    const params = a.params;
    if (!params && (!given || a.norm)) throw new InvalidArgumentError("delta rule: the params buffer (negA, dtBias, norm weight) is needed unless the gates are given and there is no norm");
    if (!given) {
      checkRange("delta rule negA", params!, negAOffset, Hv);
      checkRange("delta rule dtBias", params!, dtBiasOffset, Hv);
    }
    checkRange("delta rule state", a.state, stateOffset, this.stateFloats(Hv));
    if (a.runs) {
      if (S > RUNS_MAX_TOKENS) throw new InvalidArgumentError(`a batched delta rule takes at most ${RUNS_MAX_TOKENS} tokens, got ${S}`);
      checkRuns("delta rule", a.runs, a.state, stateOffset, this.stateFloats(Hv));
    }
    checkRange("delta rule out", a.out, outOffset, rows(outStride, Vd));
    // token t's output is written before token t + 1's inputs are read
    const qkvStart = Math.min(qOffset, kOffset, vOffset);
    const qkvEnd = Math.max(qOffset + rows(qkvStride, Kd), kOffset + rows(qkvStride, Kd), vOffset + rows(qkvStride, Vd));
    if (a.out === a.qkv && outOffset < qkvEnd && qkvStart < outOffset + rows(outStride, Vd)) throw new InvalidArgumentError("delta rule: out must not overlap q, k, v");
    const norm = a.norm;
    let zOffset = 0, zStride = Vd;
    if (norm) {
      zOffset = norm.zOffset ?? 0;
      zStride = norm.zStride ?? Vd;
      checkRange("delta rule z", norm.z, zOffset, rows(zStride, Vd));
      checkRange("delta rule norm weight", params!, norm.weightOffset, Dv);
      if (!(norm.eps >= 0 && Number.isFinite(norm.eps))) throw new InvalidArgumentError(`norm eps must be finite and >= 0, got ${norm.eps}`);
    }
    const flags = (norm ? 1 : 0) | (given ? 2 : 0) | (a.runs ? 4 : 0);
    // without runs the table binding is unread: qkv stands in
    const set = this.setFor([a.qkv, a.a, a.b, norm?.z ?? a.qkv, params ?? a.qkv, a.state, a.out, a.runs?.table ?? a.qkv]);
    const pc = pushWords(
      [S, Hk, Hv, qOffset, kOffset, vOffset, qkvStride, aOffset, aStride, bOffset, bStride, zOffset, zStride, outOffset, outStride, stateOffset, negAOffset, dtBiasOffset, norm?.weightOffset ?? 0, norm?.eps ?? 0, flags, a.runs?.stateStride ?? 0],
      [19],
    );
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(Hv, a.runs ? S : 1);
  }
}
