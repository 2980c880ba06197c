/** The k best logits (k <= 64), best first, on the GPU (shaders/dec_topk.comp), in one dispatch: candidates for host sampling. */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { uploadBytes } from "../../vk/transfer.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** logits r, scratch rw (counter + K partials per workgroup), result w; push V, logitsOffset, resultOffset, k: 16 B. */
export const DEC_TOPK: ShaderInterface = { name: "dec_topk", storageBuffers: 3, pushConstantBytes: 16 };
export const TOPK_MAX = 64;

export interface TopKArgs {
  logits: Buffer;
  V: number;
  /** 1..maxK candidates. */
  k: number;
  /** 2 * maxK + 1 words at resultOffset: ids [maxK] (u32), value bits [maxK] (f32), then the count found (<= k). */
  result: Buffer;
  logitsOffset?: number;
  resultOffset?: number;
}

export interface TopKKernelOptions extends DecoderKernelOptions {
  /** Largest V recorded with this object (sizes its scratch); default 262144. */
  maxV?: number;
  /** Largest k (the K spec constant: the result's layout), 1..64, default 64. */
  maxK?: number;
  /** Threads per workgroup (a power of two), default 256; each keeps 16 values in registers. */
  workgroupSize?: number;
}

/** Owns a device scratch buffer as ArgmaxKernel does: two dispatches of one object need a compute barrier between them. */
export class TopKKernel extends DecoderKernel {
  readonly maxV: number;
  readonly maxK: number;
  readonly perWorkgroup: number;
  readonly scratch: Buffer;

  constructor(device: Device, options: TopKKernelOptions = {}) {
    const wg = options.workgroupSize ?? 256;
    if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
    const maxK = options.maxK ?? TOPK_MAX;
    if (!Number.isInteger(maxK) || maxK < 1 || maxK > TOPK_MAX) throw new InvalidArgumentError(`maxK must be an integer in 1..${TOPK_MAX}, got ${maxK}`);
    const per = 16 * wg;
    const maxV = options.maxV ?? 262144;
    const groups = Math.ceil(maxV / per);
    if (!Number.isInteger(maxV) || maxV < 1 || groups > device.info.limits.maxComputeWorkGroupCount[0]!) throw new InvalidArgumentError(`maxV ${maxV} needs ${groups} workgroups, too many`);
    super(device, DEC_TOPK, { 0: wg, 1: per, 2: maxK }, options);
    this.maxV = maxV;
    this.maxK = maxK;
    this.perWorkgroup = per;
    const words = 4 + 2 * groups * maxK;
    this.scratch = new Buffer(device, { size: BigInt(4 * words), memory: "device" });
    uploadBytes(device, this.scratch, 0n, new Uint8Array(4 * words));
  }

  /** Words of the result block: 2 * maxK + 1. */
  get resultWords(): number {
    return 2 * this.maxK + 1;
  }

  /** Records one dispatch of ceil(V / perWorkgroup) workgroups. The caller places barriers around it. */
  record(cb: CommandBuffer, a: TopKArgs): CommandBuffer {
    const { V, k } = a;
    if (!Number.isInteger(V) || V < 1 || V > this.maxV) throw new InvalidArgumentError(`V must be an integer in 1..${this.maxV}, got ${V}`);
    if (!Number.isInteger(k) || k < 1 || k > this.maxK) throw new InvalidArgumentError(`k must be an integer in 1..${this.maxK}, got ${k}`);
    const logitsOffset = a.logitsOffset ?? 0, resultOffset = a.resultOffset ?? 0;
    checkRange("topk logits", a.logits, logitsOffset, V);
    checkRange("topk result", a.result, resultOffset, this.resultWords);
    const set = this.setFor([a.logits, this.scratch, a.result]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pushWords([V, logitsOffset, resultOffset, k])).dispatch(Math.ceil(V / this.perWorkgroup));
  }

  override [Symbol.dispose](): void {
    super[Symbol.dispose]();
    this.scratch[Symbol.dispose]();
  }
}
