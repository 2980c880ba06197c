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
 * With `conv` (the conv fold, decode calls) qkv is the raw in_proj_qkv output and each workgroup
 * runs the causal conv1d + SiLU of the channels it reads itself, as Conv1dKernel computes them (the
 * same bits), from the rolling conv state, which it only reads: the caller then moves the state on
 * with Conv1dKernel.recordAdvance over the same inputs (after a barrier), one dependent step fewer
 * than conv1d, barrier, delta rule.
 *
 * A prompt chunk runs its tokens one after another inside each workgroup (S dependent steps of a
 * rank-1 update): right for decode, slow for long prompts. DeltaRuleChunkedKernel below takes the same
 * arguments (no runs) and runs a chunk as small matrix products instead (the chunk-parallel form).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { CONV1D_MAX_KERNEL } from "./conv1d.ts";
import { GatedNormKernel } from "./gated-norm.ts";
import type { GgmlIdpScratch } from "./ggml-gemv.ts";
import { checkRuns, RUNS_MAX_TOKENS, type RunsBinding } from "./runs.ts";

/**
 * qkv r, a r, b r, z r, params r, state rw, out w, runs r, conv state r, quantized out xq w, xscale w,
 * xsum w; push S, keyHeads, valueHeads, qOffset, kOffset, vOffset, qkvStride, aOffset, aStride, bOffset,
 * bStride, zOffset, zStride, outOffset, outStride, stateOffset, negAOffset, dtBiasOffset, normOffset
 * (uints), eps (f32, byte 76), flags, stateStride, rowOffset, convWOffset, convStateOffset,
 * convStateStride, qGroupsPerRow: 108 B.
 */
export const DEC_DELTA_RULE: ShaderInterface = { name: "dec_delta_rule", storageBuffers: 12, pushConstantBytes: 108 };
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
  /**
   * The conv fold (recurrent kernel only): qkv holds the conv's input (in_proj_qkv's output), token t's
   * row at rowOffset + t · qkvStride, channel c at + c (so q, k, v of the offsets above are the channels
   * qOffset − rowOffset, ...); the taps [channels][kernel] at params[weightOffset]; the conv state
   * [channels][kernel − 1] at stateOffset, read only (with runs: sequence i's `stateStride` floats further).
   */
  conv?: DeltaRuleConv;
  /**
   * The output quantized too, as the integer-dot GEMVs read it (recurrent kernel only): token t's
   * row t of the scratch, whose columns are the output's row (outStride), groups of 16 from
   * outOffset (a multiple of 16, as valueDim must be).
   */
  quantized?: GgmlIdpScratch;
}

export interface DeltaRuleConv {
  weightOffset: number;
  state: Buffer;
  stateOffset?: number;
  /** With runs: floats between sequences' conv states. */
  stateStride?: number;
  /** Default 0. */
  rowOffset?: number;
}

export interface DeltaRuleKernelOptions extends DecoderKernelOptions {
  /** Invocations per state column (each keeps keyDim / parts rows in registers); default keyDim / 32, at least 1. */
  parts?: number;
  /** Gated norm: reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
  /** The conv fold's kernel width (taps, 1..CONV1D_MAX_KERNEL; default 4): calls with `conv` take it. */
  convKernel?: number;
}

/** One pipeline per (keyDim, valueDim): both size the workgroup and its registers. */
export class DeltaRuleKernel extends DecoderKernel {
  readonly keyDim: number;
  readonly valueDim: number;
  readonly parts: number;
  readonly workgroupSize: number;
  readonly convKernel: number;

  constructor(device: Device, dims: { keyDim: number; valueDim: number }, options: DeltaRuleKernelOptions = {}) {
    const { keyDim, valueDim } = dims;
    for (const [name, v] of [["keyDim", keyDim], ["valueDim", valueDim]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    const convKernel = options.convKernel ?? 4;
    if (!Number.isInteger(convKernel) || convKernel < 1 || convKernel > CONV1D_MAX_KERNEL) throw new InvalidArgumentError(`convKernel must be an integer in 1..${CONV1D_MAX_KERNEL}, got ${convKernel}`);
    const parts = options.parts ?? Math.max(1, Math.floor(keyDim / DEFAULT_ROWS));
    if (!Number.isInteger(parts) || parts < 1 || keyDim % parts !== 0) throw new InvalidArgumentError(`parts must divide keyDim (${keyDim}), got ${parts}`);
    const wg = valueDim * parts, maxWg = device.info.limits.maxComputeWorkGroupInvocations;
    if (wg > maxWg) throw new InvalidArgumentError(`valueDim ${valueDim} x ${parts} parts = ${wg} invocations, over the device's ${maxWg}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_DELTA_RULE, { 0: wg, 1: keyDim, 2: parts, 3: sub ? 1 : 0, 4: convKernel }, options);
    this.keyDim = keyDim;
    this.valueDim = valueDim;
    this.parts = parts;
    this.workgroupSize = wg;
    this.convKernel = convKernel;
  }

  /** Floats of one layer's state: valueHeads · keyDim · valueDim. */
  stateFloats(valueHeads: number): number {
    return valueHeads * this.keyDim * this.valueDim;
  }

  /** Records one dispatch of valueHeads workgroups (x S rows with runs). The caller places barriers around it. */
  record(cb: CommandBuffer, a: DeltaRuleArgs): CommandBuffer {
    const r = resolveDeltaRuleArgs(this.device, a, this.keyDim, this.valueDim);
    const { S, Hk, Hv, norm, given } = r;
    if (a.runs) {
      if (S > RUNS_MAX_TOKENS) throw new InvalidArgumentError(`a batched delta rule takes at most ${RUNS_MAX_TOKENS} tokens, got ${S}`);
      checkRuns("delta rule", a.runs, a.state, r.stateOffset, this.stateFloats(Hv));
    }
    const conv = a.conv ? this.resolveConv(a, r) : undefined;
    const q = a.quantized;
    if (q) {
      if (q.cols !== r.outStride || q.maxTokens < S) throw new InvalidArgumentError(`delta rule quantized output: a scratch of ${q.maxTokens} tokens x ${q.cols} columns for ${S} tokens x ${r.outStride}`);
      if (r.outOffset % 16 !== 0 || this.valueDim % 16 !== 0 || r.outOffset + Hv * this.valueDim > r.outStride) throw new InvalidArgumentError(`delta rule quantized output: heads at column ${r.outOffset} of ${this.valueDim} each must be whole groups of 16 inside a row of ${r.outStride}`);
    }
    const flags = (norm ? 1 : 0) | (given ? 2 : 0) | (a.runs ? 4 : 0) | (conv ? 8 : 0) | (q ? 16 : 0);
    // without runs the table binding is unread, without conv the conv state: qkv stands in; without
    // the quantized output its bindings are unwritten: out stands in
    const set = this.setFor([a.qkv, a.a, a.b, norm?.z ?? a.qkv, a.params ?? a.qkv, a.state, a.out, a.runs?.table ?? a.qkv, a.conv?.state ?? a.qkv, q?.xq ?? a.out, q?.xscale ?? a.out, q?.xsum ?? a.out]);
    const pc = pushWords(
      [
        S, Hk, Hv, r.qOffset, r.kOffset, r.vOffset, r.qkvStride, r.aOffset, r.aStride, r.bOffset, r.bStride, r.zOffset, r.zStride, r.outOffset, r.outStride, r.stateOffset, r.negAOffset, r.dtBiasOffset, norm?.weightOffset ?? 0, norm?.eps ?? 0, flags, a.runs?.stateStride ?? 0,
        conv?.rowOffset ?? 0, conv?.weightOffset ?? 0, conv?.stateOffset ?? 0, conv?.stateStride ?? 0, q ? r.outStride / 16 : 0,
      ],
      [19],
    );
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(Hv, a.runs ? S : 1);
  }

  /** The conv fold's arguments checked: the channels the call reads lie past rowOffset, their taps in params, their states in conv.state. */
  private resolveConv(a: DeltaRuleArgs, r: ResolvedDeltaRuleArgs): Required<DeltaRuleConv> {
    const c = a.conv!, K = this.convKernel;
    const rowOffset = c.rowOffset ?? 0, stateOffset = c.stateOffset ?? 0, stateStride = c.stateStride ?? 0;
    if (!a.params) throw new InvalidArgumentError("delta rule conv fold: the taps are read from params");
    if (!Number.isInteger(rowOffset) || rowOffset < 0 || rowOffset > Math.min(r.qOffset, r.kOffset, r.vOffset)) throw new InvalidArgumentError(`delta rule conv fold: rowOffset ${rowOffset} must be a non-negative integer at or before q, k and v`);
    // channels 0 .. the last one read (q, k of keyHeads · keyDim, v of valueHeads · valueDim from their offsets)
    const Kd = r.Hk * this.keyDim, Vd = r.Hv * this.valueDim;
    const channels = Math.max(r.qOffset + Kd, r.kOffset + Kd, r.vOffset + Vd) - rowOffset;
    if (channels > r.qkvStride) throw new InvalidArgumentError(`delta rule conv fold: ${channels} channels from rowOffset do not fit a row of ${r.qkvStride}`);
    checkRange("delta rule conv taps", a.params, c.weightOffset, channels * K);
    const stateFloats = channels * (K - 1);
    if (a.runs) checkRuns("delta rule conv", { ...a.runs, stateStride }, c.state, stateOffset, stateFloats);
    else checkRange("delta rule conv state", c.state, stateOffset, stateFloats);
    return { weightOffset: c.weightOffset, state: c.state, stateOffset, stateStride, rowOffset };
  }
}

/** A call's arguments checked against the buffers (the checks the delta-rule kernels share), with the defaults filled in. */
export interface ResolvedDeltaRuleArgs {
  S: number;
  Hk: number;
  Hv: number;
  given: boolean;
  norm: DeltaRuleArgs["norm"];
  qOffset: number;
  kOffset: number;
  vOffset: number;
  qkvStride: number;
  aOffset: number;
  aStride: number;
  bOffset: number;
  bStride: number;
  zOffset: number;
  zStride: number;
  outOffset: number;
  outStride: number;
  stateOffset: number;
  negAOffset: number;
  dtBiasOffset: number;
}

/** `maxS`: the most tokens the calling kernel takes in one call. */
export function resolveDeltaRuleArgs(device: Device, a: DeltaRuleArgs, Dk: number, Dv: number, maxS = DELTA_RULE_MAX_S): ResolvedDeltaRuleArgs {
  const { S, keyHeads: Hk, valueHeads: Hv } = a;
  if (!Number.isInteger(S) || S < 1 || S > maxS) throw new InvalidArgumentError(`S must be an integer in 1..${maxS}, got ${S}`);
  for (const [name, v] of [["keyHeads", Hk], ["valueHeads", Hv]] as const) {
    if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
  }
  if (Hv % Hk !== 0) throw new InvalidArgumentError(`valueHeads (${Hv}) must be a multiple of keyHeads (${Hk})`);
  if (Hv > device.info.limits.maxComputeWorkGroupCount[0]!) throw new InvalidArgumentError(`valueHeads ${Hv} is more workgroups than the device dispatches in x`);
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
  checkRange("delta rule state", a.state, stateOffset, Hv * Dk * Dv);
  checkRange("delta rule out", a.out, outOffset, rows(outStride, Vd));
  // token t's output is written before token t + 1's inputs are read (recurrent), or before other workgroups read theirs (chunked)
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
  return { S, Hk, Hv, given, norm, qOffset, kOffset, vOffset, qkvStride, aOffset, aStride, bOffset, bStride, zOffset, zStride, outOffset, outStride, stateOffset, negAOffset, dtBiasOffset };
}

/**
 * qkv r, a r, b r, params r, state rw, out w; push S, keyHeads, valueHeads, qOffset, kOffset, vOffset, qkvStride,
 * aOffset, aStride, bOffset, bStride, outOffset, outStride, stateOffset, negAOffset, dtBiasOffset, flags: 68 B.
 */
export const DEC_DELTA_RULE_CHUNKED: ShaderInterface = { name: "dec_delta_rule_chunked", storageBuffers: 6, pushConstantBytes: 68 };
/**
 * Chunks of this many tokens or more take the chunked kernel in the graph (fewer: the recurrent one,
 * whose cost grows with S from a small start; the chunked kernel's is nearly flat in S). Not yet
 * timed on a GPU: a first guess.
 */
export const DELTA_RULE_CHUNKED_MIN_S = 16;
/** The chunked shader's fixed sizes: 256 invocations, chunks of up to 64 tokens (its shared-memory layout). */
const CHUNKED_WORKGROUP = 256;
const CHUNKED_CHUNK = 64;

export interface DeltaRuleChunkedKernelOptions extends DecoderKernelOptions {
  /** Value columns per workgroup (16 or 32; default 16): a call runs valueHeads x ceil(valueDim / valueSlice) workgroups. */
  valueSlice?: 16 | 32;
  /** The gated norm's reduction (dec_gated_norm): subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

/**
 * The chunk-parallel gated delta rule (shaders/dec_delta_rule_chunked.comp, as gatedDeltaRuleChunked
 * with the call one chunk): the same arguments as DeltaRuleKernel without `runs`, for prompt chunks.
 * Workgroup (h, y) owns value head h's columns y·valueSlice.. of the state and output and recomputes
 * the head's 64x64 key-side matrices itself (one dispatch; the state read once and written once). A head's
 * output row spans ceil(valueDim / valueSlice) workgroups, so the gated norm (`norm`) is a second
 * dispatch, dec_gated_norm in place on `out`, after a barrier (record() records both; recordCore()
 * and recordNorm() each, for callers that batch several calls between one barrier).
 */
export class DeltaRuleChunkedKernel extends DecoderKernel {
  readonly keyDim: number;
  readonly valueDim: number;
  readonly valueSlice: number;
  private readonly gatedNorm: GatedNormKernel;

  constructor(device: Device, dims: { keyDim: number; valueDim: number }, options: DeltaRuleChunkedKernelOptions = {}) {
    const { keyDim, valueDim } = dims;
    for (const [name, v] of [["keyDim", keyDim], ["valueDim", valueDim]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    const slice = options.valueSlice ?? 16;
    if (slice !== 16 && slice !== 32) throw new InvalidArgumentError(`valueSlice must be 16 or 32, got ${slice}`);
    const limits = device.info.limits;
    if (CHUNKED_WORKGROUP > limits.maxComputeWorkGroupInvocations) throw new InvalidArgumentError(`the chunked delta rule needs ${CHUNKED_WORKGROUP} invocations a workgroup, over the device's ${limits.maxComputeWorkGroupInvocations}`);
    const shared = DeltaRuleChunkedKernel.sharedBytes(slice);
    if (shared > limits.maxComputeSharedMemorySize) throw new InvalidArgumentError(`the chunked delta rule needs ${shared} B of shared memory (valueSlice ${slice}), over the device's ${limits.maxComputeSharedMemorySize}`);
    super(device, DEC_DELTA_RULE_CHUNKED, { 0: keyDim, 1: valueDim, 2: slice }, options);
    this.keyDim = keyDim;
    this.valueDim = valueDim;
    this.valueSlice = slice;
    this.gatedNorm = new GatedNormKernel(device, { useSubgroup: options.useSubgroup, maxSets: options.maxSets });
  }

  /** The shader's shared memory: the 64x65 matrix, R/U and a block of it, seven per-token arrays, and dec_linear_attention.glsl's unused reduction array (counted in case the driver keeps it). */
  static sharedBytes(valueSlice: number): number {
    const C = CHUNKED_CHUNK;
    return 4 * (C * (C + 1) + C * valueSlice + 16 * valueSlice + 7 * C + CHUNKED_WORKGROUP);
  }

  /** Floats of one layer's state: valueHeads · keyDim · valueDim. */
  stateFloats(valueHeads: number): number {
    return valueHeads * this.keyDim * this.valueDim;
  }

  /**
   * Records valueHeads x ceil(valueDim / valueSlice) workgroups, then with `norm` a barrier and the
   * gated norm over `out` (recordCore, then recordNorm). The caller places barriers around it.
   */
  record(cb: CommandBuffer, a: DeltaRuleArgs): CommandBuffer {
    this.recordCore(cb, a);
    if (!a.norm) return cb;
    return this.recordNorm(cb.barrier("computeToCompute"), a);
  }

  /**
   * The delta rule alone (one dispatch), writing the un-normalised output even where `a.norm` is set:
   * several calls' cores, one barrier, then the norm (one recordNorm() over all their heads where their
   * outputs tile one row; norms of one buffer need barriers between them), so that the calls overlap.
   */
  recordCore(cb: CommandBuffer, a: DeltaRuleArgs): CommandBuffer {
    if (a.conv) throw new InvalidArgumentError("the chunked delta rule takes the conv's output: the conv fold is the recurrent kernel's");
    if (a.runs) throw new InvalidArgumentError("the chunked delta rule runs one sequence: a batch (runs) takes the recurrent kernel");
    if (a.quantized) throw new InvalidArgumentError("the chunked delta rule writes float rows only: the quantized output is the recurrent kernel's");
    const r = resolveDeltaRuleArgs(this.device, a, this.keyDim, this.valueDim);
    const slices = Math.ceil(this.valueDim / this.valueSlice);
    if (slices > this.device.info.limits.maxComputeWorkGroupCount[1]!) throw new InvalidArgumentError(`${slices} value slices are more workgroups than the device dispatches in y`);
    // with the gates given and no norm, params is unread: qkv stands in
    const set = this.setFor([a.qkv, a.a, a.b, a.params ?? a.qkv, a.state, a.out]);
    const pc = pushWords([r.S, r.Hk, r.Hv, r.qOffset, r.kOffset, r.vOffset, r.qkvStride, r.aOffset, r.aStride, r.bOffset, r.bStride, r.outOffset, r.outStride, r.stateOffset, r.negAOffset, r.dtBiasOffset, r.given ? 2 : 0]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(r.Hv, slices);
  }

  /**
   * The gated norm of `a.norm` in place over the output recordCore(a) wrote (after a barrier the caller
   * places); a.S may pass DELTA_RULE_MAX_S: a long chunk's sub-chunks' outputs normed at once.
   */
  recordNorm(cb: CommandBuffer, a: DeltaRuleArgs): CommandBuffer {
    if (!Number.isInteger(a.S) || a.S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${a.S}`);
    const r = resolveDeltaRuleArgs(this.device, { ...a, S: Math.min(a.S, DELTA_RULE_MAX_S) }, this.keyDim, this.valueDim);
    const norm = r.norm;
    if (!norm) throw new InvalidArgumentError("delta rule recordNorm: the arguments have no norm");
    return this.gatedNorm.record(cb, {
      x: a.out, xOffset: r.outOffset, xStride: r.outStride, y: a.out, yOffset: r.outOffset, yStride: r.outStride,
      z: norm.z, zOffset: r.zOffset, zStride: r.zStride, w: a.params!, wOffset: norm.weightOffset, S: a.S, heads: r.Hv, n: this.valueDim, eps: norm.eps,
    });
  }

  override releaseSets(): void {
    super.releaseSets();
    this.gatedNorm.releaseSets();
  }

  override [Symbol.dispose](): void {
    super[Symbol.dispose]();
    this.gatedNorm[Symbol.dispose]();
  }
}
