/**
 * Gated DeltaNet's causal depthwise conv1d + SiLU on the GPU (shaders/dec_conv1d.comp), as
 * src/model/linear-attention.ts causalConv1dSilu, for S = 1..CONV1D_MAX_S tokens: one invocation per channel,
 * the rolling state [channels][kernel − 1] (oldest first) read and replaced in place. With `runs`
 * (a batch of sequences) the tokens are grouped by sequence (src/kernels/decoder/runs.ts): each
 * sequence's in order on its own state, the sequences side by side (a workgroup row each).
 * recordAdvance moves the state on over the inputs without computing outputs (reading only the last
 * kernel − 1): the other half of the delta rule's conv fold (DeltaRuleKernel's `conv`), which reads the
 * state but cannot write it, and of recordOutputs, a long prompt chunk's outputs in blocks of
 * CONV1D_TOKEN_BLOCK tokens side by side (one invocation walking all of them in order waits on
 * every load), which leaves the state as it was.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { checkRuns, RUNS_MAX_TOKENS, type RunsBinding } from "./runs.ts";
import { CHUNK_MAX_TOKENS } from "../../moe/routing.ts";

/** x r, weights r, state rw, out w, runs r; push S, channels, xOffset, xStride, wOffset, stateOffset, outOffset, outStride, stateStride, flags: 40 B. */
export const DEC_CONV1D: ShaderInterface = { name: "dec_conv1d", storageBuffers: 5, pushConstantBytes: 40 };
export const CONV1D_MAX_S = CHUNK_MAX_TOKENS;
export const CONV1D_MAX_KERNEL = 8;
/** recordOutputs' tokens an invocation (the shader's TOKEN_BLOCK). */
export const CONV1D_TOKEN_BLOCK = 16;

export interface Conv1dArgs {
  /** S rows of `channels` inputs (the in_proj_qkv output): token t at xOffset + t · xStride. */
  x: Buffer;
  /** [channels][kernel] taps (conv1d.weight squeezed) at weightOffset. */
  weight: Buffer;
  /** [channels][kernel − 1] previous inputs, oldest first, at stateOffset; updated in place (zeros for a new sequence). */
  state: Buffer;
  /** S rows of `channels` outputs: token t at outOffset + t · outStride. Must not overlap x. */
  out: Buffer;
  S: number;
  channels: number;
  /** Element offsets and token strides (default 0 and `channels`). */
  xOffset?: number;
  xStride?: number;
  weightOffset?: number;
  stateOffset?: number;
  outOffset?: number;
  outStride?: number;
  /**
   * A batch: the S tokens belong to sequences whose states lie `runs.stateStride` floats apart
   * from stateOffset; the runs table says which token is whose (at most RUNS_MAX_TOKENS tokens).
   */
  runs?: RunsBinding;
}

export interface Conv1dKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup (one channel each), default 64. */
  workgroupSize?: number;
}

/** One pipeline per kernel width (a specialization constant: the window lives in registers). */
export class Conv1dKernel extends DecoderKernel {
  readonly kernel: number;
  readonly workgroupSize: number;

  constructor(device: Device, kernel: number, options: Conv1dKernelOptions = {}) {
    if (!Number.isInteger(kernel) || kernel < 1 || kernel > CONV1D_MAX_KERNEL) throw new InvalidArgumentError(`conv kernel must be an integer in 1..${CONV1D_MAX_KERNEL}, got ${kernel}`);
    const wg = options.workgroupSize ?? 64;
    if (!Number.isInteger(wg) || wg < 1) throw new InvalidArgumentError(`workgroupSize must be a positive integer, got ${wg}`);
    super(device, DEC_CONV1D, { 0: wg, 1: kernel }, options);
    this.kernel = kernel;
    this.workgroupSize = wg;
  }

  /** Records one dispatch of ceil(channels / workgroupSize) workgroups (x S rows with runs). The caller places barriers around it. */
  record(cb: CommandBuffer, a: Conv1dArgs): CommandBuffer {
    return this.recordMode(cb, a, false);
  }

  /**
   * The state alone moved on over the S tokens (the last kernel − 1 inputs of [state, x]), as record()
   * leaves it, without the outputs: one dispatch, after the barrier that follows the conv fold's
   * delta rule (which reads the state as it was). The caller places barriers around it.
   */
  recordAdvance(cb: CommandBuffer, a: Omit<Conv1dArgs, "out" | "outOffset" | "outStride">): CommandBuffer {
    return this.recordMode(cb, { ...a, out: a.x, outOffset: a.xOffset, outStride: a.xStride }, true);
  }

  /**
   * The outputs of one sequence's S tokens, CONV1D_TOKEN_BLOCK tokens an invocation side by side, each
   * block's window from the inputs before it (the state before the first): the state is read, not
   * written. recordAdvance after it (after a barrier) moves the state on. The caller places barriers around it.
   */
  recordOutputs(cb: CommandBuffer, a: Omit<Conv1dArgs, "runs">): CommandBuffer {
    if ((a as Conv1dArgs).runs) throw new InvalidArgumentError("conv1d: recordOutputs takes one sequence (no runs)");
    return this.recordMode(cb, a, false, true);
  }

  private recordMode(cb: CommandBuffer, a: Conv1dArgs, advanceOnly: boolean, blocks = false): CommandBuffer {
    const { S, channels: C } = a;
    const K = this.kernel;
    if (!Number.isInteger(S) || S < 1 || S > CONV1D_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${CONV1D_MAX_S}, got ${S}`);
    if (!Number.isInteger(C) || C < 1) throw new InvalidArgumentError(`channels must be a positive integer, got ${C}`);
    const xOffset = a.xOffset ?? 0, xStride = a.xStride ?? C, outOffset = a.outOffset ?? 0, outStride = a.outStride ?? C;
    const weightOffset = a.weightOffset ?? 0, stateOffset = a.stateOffset ?? 0;
    if (xStride < C || outStride < C) throw new InvalidArgumentError(`token strides (x ${xStride}, out ${outStride}) must be at least channels (${C})`);
    const xWords = (S - 1) * xStride + C, outWords = (S - 1) * outStride + C;
    checkRange("conv1d x", a.x, xOffset, xWords);
    checkRange("conv1d weight", a.weight, weightOffset, C * K);
    checkRange("conv1d state", a.state, stateOffset, C * (K - 1));
    if (a.runs) {
      if (S > RUNS_MAX_TOKENS) throw new InvalidArgumentError(`a batched conv1d takes at most ${RUNS_MAX_TOKENS} tokens, got ${S}`);
      checkRuns("conv1d", a.runs, a.state, stateOffset, C * (K - 1));
    }
    checkRange("conv1d out", a.out, outOffset, outWords);
    // advancing: out is not written (x stands in)
    if (!advanceOnly && a.out === a.x && outOffset < xOffset + xWords && xOffset < outOffset + outWords) throw new InvalidArgumentError("conv1d: out must not overlap x");
    // without runs the table binding is unread: x stands in
    const set = this.setFor([a.x, a.weight, a.state, a.out, a.runs?.table ?? a.x]);
    const [gx, gy] = this.grid(Math.ceil(C / this.workgroupSize));
    const pc = pushWords([S, C, xOffset, xStride, weightOffset, stateOffset, outOffset, outStride, a.runs?.stateStride ?? 0, (a.runs ? 1 : 0) | (advanceOnly ? 2 : 0) | (blocks ? 4 : 0)]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy, a.runs ? S : blocks ? Math.ceil(S / CONV1D_TOKEN_BLOCK) : 1);
  }
}
