/**
 * A long prompt chunk's gated delta rule in two dispatches, for any number of tokens (the split form
 * of FLA's chunk_gated_delta_rule): shaders/dec_delta_rule_prepare.comp forms every 64-token chunk's
 * state-independent matrices at once (one workgroup per (value head, chunk): the Gram matrices, the
 * triangular solve, u, W, P and the decay factors), then shaders/dec_delta_rule_state.comp walks the
 * chunks in order inside each workgroup with its slice of the state in registers (small products
 * only). DeltaRuleChunkedKernel, by contrast, runs one chunk a dispatch and recomputes the key side
 * in each of its workgroups: a prompt of 512 tokens there is eight dependent dispatches.
 *
 * Same arguments as DeltaRuleChunkedKernel (no runs, conv fold or quantized output), S any positive
 * count up to the scratch's tokens. The scratch (W, P, the factors) is the caller's: one per graph,
 * sized for its longest chunk and all its value heads; calls over groups of value heads (llama.cpp's
 * tiled order) use `headBase` to keep their scratch apart. The prepare pass writes u into `out`, and
 * the state pass overwrites it with the output, so `out` must not alias the inputs. The gated norm
 * (`norm`) is a third dispatch after a barrier, as in the chunked kernel.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { resolveDeltaRuleArgs, type DeltaRuleArgs, type ResolvedDeltaRuleArgs } from "./delta-rule.ts";
import { GatedNormKernel } from "./gated-norm.ts";

/**
 * qkv r, a r, b r, params r, out w, W w, P w, factors w; push S, keyHeads, valueHeads, qOffset, kOffset,
 * vOffset, qkvStride, aOffset, aStride, bOffset, bStride, outOffset, outStride, negAOffset, dtBiasOffset,
 * flags, scratchHeads, headBase: 72 B.
 */
export const DEC_DELTA_RULE_PREPARE: ShaderInterface = { name: "dec_delta_rule_prepare", storageBuffers: 8, pushConstantBytes: 72 };
/**
 * qkv r, state rw, out rw, W r, P r, factors r; push S, keyHeads, valueHeads, qOffset, kOffset, qkvStride,
 * outOffset, outStride, stateOffset, scratchHeads, headBase, flags (bit 0: q and k rows 16-byte aligned): 48 B.
 */
export const DEC_DELTA_RULE_STATE: ShaderInterface = { name: "dec_delta_rule_state", storageBuffers: 6, pushConstantBytes: 48 };

/** Tokens of a chunk (the shaders' CHUNK) and floats of a chunk's factors (F_STRIDE). */
const CHUNK = 64;
const FACTOR_FLOATS = 2 * CHUNK + 4;
const WORKGROUP = 256;
const STATE_SLICE = 8;
/** Right-hand columns the prepare pass solves at a time (its GROUP). */
const SOLVE_GROUP = 32;

/** The prepare pass's outputs for up to `maxTokens` tokens of `valueHeads` value heads of keyDim columns. */
export class DeltaRuleSplitScratch implements Disposable {
  /** W: [maxTokens][valueHeads][keyDim]. */
  readonly w: Buffer;
  /** P: [chunks][valueHeads][64][64]. */
  readonly p: Buffer;
  /** The decay factors: [chunks][valueHeads][FACTOR_FLOATS]. */
  readonly factors: Buffer;

  constructor(device: Device, readonly maxTokens: number, readonly valueHeads: number, readonly keyDim: number) {
    for (const [name, v] of [["maxTokens", maxTokens], ["valueHeads", valueHeads], ["keyDim", keyDim]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`delta rule scratch: ${name} must be a positive integer, got ${v}`);
    }
    const chunks = Math.ceil(maxTokens / CHUNK);
    const made: Buffer[] = [];
    try {
      for (const floats of [maxTokens * valueHeads * keyDim, chunks * valueHeads * CHUNK * CHUNK, chunks * valueHeads * FACTOR_FLOATS]) {
        made.push(new Buffer(device, { size: BigInt(4 * floats), memory: "device" }));
      }
    } catch (e) {
      for (const b of made) b[Symbol.dispose]();
      throw e;
    }
    [this.w, this.p, this.factors] = made as [Buffer, Buffer, Buffer];
  }

  /** Bytes of the three buffers for these sizes (a memory plan's count). */
  static bytes(maxTokens: number, valueHeads: number, keyDim: number): number {
    const chunks = Math.ceil(maxTokens / CHUNK);
    return 4 * (maxTokens * valueHeads * keyDim + chunks * valueHeads * (CHUNK * CHUNK + FACTOR_FLOATS));
  }

  [Symbol.dispose](): void {
    for (const b of [this.w, this.p, this.factors]) b[Symbol.dispose]();
  }
}

export interface DeltaRuleSplitKernelOptions extends DecoderKernelOptions {
  /** The gated norm's reduction (dec_gated_norm): subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

class PrepareKernel extends DecoderKernel {
  constructor(device: Device, keyDim: number, valueDim: number, options: DecoderKernelOptions) {
    super(device, DEC_DELTA_RULE_PREPARE, { 0: keyDim, 1: valueDim }, options);
  }

  record(cb: CommandBuffer, a: DeltaRuleArgs, r: ResolvedDeltaRuleArgs, scratch: DeltaRuleSplitScratch, headBase: number): void {
    const set = this.setFor([a.qkv, a.a, a.b, a.params ?? a.qkv, a.out, scratch.w, scratch.p, scratch.factors]);
    const pc = pushWords([
      r.S, r.Hk, r.Hv, r.qOffset, r.kOffset, r.vOffset, r.qkvStride, r.aOffset, r.aStride, r.bOffset, r.bStride,
      r.outOffset, r.outStride, r.negAOffset, r.dtBiasOffset, r.given ? 2 : 0, scratch.valueHeads, headBase,
    ]);
    cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(r.Hv, Math.ceil(r.S / CHUNK));
  }
}

class StateKernel extends DecoderKernel {
  constructor(device: Device, keyDim: number, valueDim: number, options: DecoderKernelOptions) {
    super(device, DEC_DELTA_RULE_STATE, { 0: keyDim, 1: valueDim, 2: STATE_SLICE }, options);
  }

  record(cb: CommandBuffer, a: DeltaRuleArgs, r: ResolvedDeltaRuleArgs, scratch: DeltaRuleSplitScratch, headBase: number, slices: number): void {
    const set = this.setFor([a.qkv, a.state, a.out, scratch.w, scratch.p, scratch.factors]);
    // q and k rows as vec4s where every row starts on a 16-byte boundary
    const aligned = [r.qOffset, r.kOffset, r.qkvStride, scratch.keyDim].every((x) => x % 4 === 0);
    const pc = pushWords([r.S, r.Hk, r.Hv, r.qOffset, r.kOffset, r.qkvStride, r.outOffset, r.outStride, r.stateOffset, scratch.valueHeads, headBase, aligned ? 1 : 0]);
    cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(r.Hv, slices);
  }
}

/**
 * The two-pass delta rule (see the module comment): recordPrepare, a barrier, recordState, then with
 * `norm` a barrier and recordNorm; record() records all of them. Calls over groups of value heads
 * record every group's prepare, one barrier, every group's state pass, as the graph does.
 */
export class DeltaRuleSplitKernel implements Disposable {
  readonly keyDim: number;
  readonly valueDim: number;
  private readonly prepare: PrepareKernel;
  private readonly statePass: StateKernel;
  private readonly gatedNorm: GatedNormKernel;

  constructor(readonly device: Device, dims: { keyDim: number; valueDim: number }, options: DeltaRuleSplitKernelOptions = {}) {
    const { keyDim, valueDim } = dims;
    for (const [name, v] of [["keyDim", keyDim], ["valueDim", valueDim]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    const limits = device.info.limits;
    if (WORKGROUP > limits.maxComputeWorkGroupInvocations) throw new InvalidArgumentError(`the split delta rule needs ${WORKGROUP} invocations a workgroup, over the device's ${limits.maxComputeWorkGroupInvocations}`);
    const shared = DeltaRuleSplitKernel.sharedBytes(keyDim);
    if (shared > limits.maxComputeSharedMemorySize) throw new InvalidArgumentError(`the split delta rule needs ${shared} B of shared memory, over the device's ${limits.maxComputeSharedMemorySize}`);
    this.keyDim = keyDim;
    this.valueDim = valueDim;
    this.prepare = new PrepareKernel(device, keyDim, valueDim, options);
    try {
      this.statePass = new StateKernel(device, keyDim, valueDim, options);
      try {
        this.gatedNorm = new GatedNormKernel(device, { useSubgroup: options.useSubgroup, maxSets: options.maxSets });
      } catch (e) {
        this.statePass[Symbol.dispose]();
        throw e;
      }
    } catch (e) {
      this.prepare[Symbol.dispose]();
      throw e;
    }
  }

  /**
   * The larger of the two shaders' shared memory: the prepare pass's 64 x 65 matrix, a group of right-hand
   * columns and a block of them, six per-token arrays and
   * dec_linear_attention.glsl's unused reduction array (counted in case the driver keeps it); the state pass's
   * state slice, U and two chunks' factors.
   */
  static sharedBytes(keyDim: number): number {
    const parts = WORKGROUP / STATE_SLICE;
    const prepare = 4 * (CHUNK * (CHUNK + 1) + CHUNK * SOLVE_GROUP + 16 * SOLVE_GROUP + 6 * CHUNK + WORKGROUP);
    const state = 4 * (parts * Math.ceil(keyDim / parts) * STATE_SLICE + CHUNK * STATE_SLICE + 2 * FACTOR_FLOATS);
    return Math.max(prepare, state);
  }

  /** A scratch for calls of up to maxTokens tokens over valueHeads value heads in all. */
  scratch(maxTokens: number, valueHeads: number): DeltaRuleSplitScratch {
    return new DeltaRuleSplitScratch(this.device, maxTokens, valueHeads, this.keyDim);
  }

  private resolve(a: DeltaRuleArgs, scratch: DeltaRuleSplitScratch, headBase: number): ResolvedDeltaRuleArgs {
    if (a.conv) throw new InvalidArgumentError("the split delta rule takes the conv's output: the conv fold is the recurrent kernel's");
    if (a.runs) throw new InvalidArgumentError("the split delta rule runs one sequence: a batch (runs) takes the recurrent kernel");
    if (a.quantized) throw new InvalidArgumentError("the split delta rule writes float rows only: the quantized output is the recurrent kernel's");
    if (scratch.keyDim !== this.keyDim) throw new InvalidArgumentError(`a delta rule scratch of keyDim ${scratch.keyDim} for a kernel of ${this.keyDim}`);
    const r = resolveDeltaRuleArgs(this.device, a, this.keyDim, this.valueDim, scratch.maxTokens);
    if (!Number.isInteger(headBase) || headBase < 0 || headBase + r.Hv > scratch.valueHeads) throw new InvalidArgumentError(`value heads ${headBase}..${headBase + r.Hv - 1} are past the scratch's ${scratch.valueHeads}`);
    if (Math.ceil(r.S / CHUNK) > this.device.info.limits.maxComputeWorkGroupCount[1]!) throw new InvalidArgumentError(`${r.S} tokens are more chunks than the device dispatches in y`);
    // u is written into out before the state pass reads q and k: out must not alias them (q, k, v are checked by resolve)
    if (a.out === a.a || a.out === a.b || a.out === a.params) throw new InvalidArgumentError("the split delta rule: out must not be the gates' or params' buffer");
    checkRange("delta rule scratch W", scratch.w, 0, r.S * scratch.valueHeads * this.keyDim);
    return r;
  }

  /** The prepare pass (one dispatch of valueHeads x chunks workgroups); u goes into `out`. */
  recordPrepare(cb: CommandBuffer, a: DeltaRuleArgs, scratch: DeltaRuleSplitScratch, headBase = 0): CommandBuffer {
    this.prepare.record(cb, a, this.resolve(a, scratch, headBase), scratch, headBase);
    return cb;
  }

  /** The state pass (valueHeads x valueDim / 16 workgroups), after a barrier behind recordPrepare of the same arguments: the un-normalised output in `out`, the state moved on. */
  recordState(cb: CommandBuffer, a: DeltaRuleArgs, scratch: DeltaRuleSplitScratch, headBase = 0): CommandBuffer {
    const r = this.resolve(a, scratch, headBase);
    const slices = Math.ceil(this.valueDim / STATE_SLICE);
    if (slices > this.device.info.limits.maxComputeWorkGroupCount[1]!) throw new InvalidArgumentError(`${slices} value slices are more workgroups than the device dispatches in y`);
    this.statePass.record(cb, a, r, scratch, headBase, slices);
    return cb;
  }

  /** The gated norm of `a.norm` in place over `out` (after a barrier behind recordState). */
  recordNorm(cb: CommandBuffer, a: DeltaRuleArgs): CommandBuffer {
    const r = resolveDeltaRuleArgs(this.device, a, this.keyDim, this.valueDim, Number.MAX_SAFE_INTEGER);
    const norm = r.norm;
    if (!norm) throw new InvalidArgumentError("delta rule recordNorm: the arguments have no norm");
    return this.gatedNorm.record(cb, {
      x: a.out, xOffset: r.outOffset, xStride: r.outStride, y: a.out, yOffset: r.outOffset, yStride: r.outStride,
      z: norm.z, zOffset: r.zOffset, zStride: r.zStride, w: a.params!, wOffset: norm.weightOffset, S: a.S, heads: r.Hv, n: this.valueDim, eps: norm.eps,
    });
  }

  /** prepare, barrier, state pass, and with `norm` a barrier and the norm. The caller places barriers around it. */
  record(cb: CommandBuffer, a: DeltaRuleArgs, scratch: DeltaRuleSplitScratch, headBase = 0): CommandBuffer {
    this.recordPrepare(cb, a, scratch, headBase);
    this.recordState(cb.barrier("computeToCompute"), a, scratch, headBase);
    if (!a.norm) return cb;
    return this.recordNorm(cb.barrier("computeToCompute"), a);
  }

  /** Floats of one layer's state: valueHeads · keyDim · valueDim. */
  stateFloats(valueHeads: number): number {
    return valueHeads * this.keyDim * this.valueDim;
  }

  releaseSets(): void {
    this.prepare.releaseSets();
    this.statePass.releaseSets();
    this.gatedNorm.releaseSets();
  }

  [Symbol.dispose](): void {
    this.prepare[Symbol.dispose]();
    this.statePass[Symbol.dispose]();
    this.gatedNorm[Symbol.dispose]();
  }
}
