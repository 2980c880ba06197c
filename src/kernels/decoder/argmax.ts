/** Greedy argmax over a row of logits on the GPU (shaders/dec_argmax.comp), in one dispatch. */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { uploadBytes } from "../../vk/transfer.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** logits r, scratch rw (counter + partials), result w; push V, logitsOffset, resultOffset: 12 B. */
export const DEC_ARGMAX: ShaderInterface = { name: "dec_argmax", storageBuffers: 3, pushConstantBytes: 12 };
/** id written when no logit is > -Infinity (select.ts argmax's -1). */
export const ARGMAX_NONE = 0xffffffff;

export interface ArgmaxArgs {
  logits: Buffer;
  V: number;
  /** Two words at resultOffset: the id (u32, 0xFFFFFFFF = none), then the value's f32 bits. */
  result: Buffer;
  logitsOffset?: number;
  resultOffset?: number;
}

export interface ArgmaxKernelOptions extends DecoderKernelOptions {
  /** Largest V recorded with this object (sizes its scratch); default 262144. */
  maxV?: number;
  workgroupSize?: number;
  /** Values per workgroup, default 16 x workgroupSize. */
  perWorkgroup?: number;
}

/**
 * Owns a small device scratch buffer (the arrival counter, zero between dispatches, and one
 * partial per workgroup): two argmax dispatches of one object need a compute barrier between them.
 */
export class ArgmaxKernel extends DecoderKernel {
  readonly maxV: number;
  readonly perWorkgroup: number;
  readonly scratch: Buffer;

  constructor(device: Device, options: ArgmaxKernelOptions = {}) {
    const wg = options.workgroupSize ?? 256;
    if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
    const per = options.perWorkgroup ?? 16 * wg;
    if (!Number.isInteger(per) || per < 1) throw new InvalidArgumentError(`perWorkgroup must be a positive integer, got ${per}`);
    const maxV = options.maxV ?? 262144;
    const groups = Math.ceil(maxV / per);
    if (!Number.isInteger(maxV) || maxV < 1 || groups > device.info.limits.maxComputeWorkGroupCount[0]!) throw new InvalidArgumentError(`maxV ${maxV} needs ${groups} workgroups, too many`);
    super(device, DEC_ARGMAX, { 0: wg, 1: per }, options);
    this.maxV = maxV;
    this.perWorkgroup = per;
    const words = 4 + 2 * groups;
    this.scratch = new Buffer(device, { size: BigInt(4 * words), memory: "device" });
    uploadBytes(device, this.scratch, 0n, new Uint8Array(4 * words));
  }

  /** Records one dispatch of ceil(V / perWorkgroup) workgroups. The caller places barriers around it. */
  record(cb: CommandBuffer, a: ArgmaxArgs): CommandBuffer {
    const { V } = a;
    if (!Number.isInteger(V) || V < 1 || V > this.maxV) throw new InvalidArgumentError(`V must be an integer in 1..${this.maxV}, got ${V}`);
    const logitsOffset = a.logitsOffset ?? 0, resultOffset = a.resultOffset ?? 0;
    checkRange("argmax logits", a.logits, logitsOffset, V);
    checkRange("argmax result", a.result, resultOffset, 2);
    const set = this.setFor([a.logits, this.scratch, a.result]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pushWords([V, logitsOffset, resultOffset])).dispatch(Math.ceil(V / this.perWorkgroup));
  }

  override [Symbol.dispose](): void {
    super[Symbol.dispose]();
    this.scratch[Symbol.dispose]();
  }
}
