/**
 * The gated RMSNorm of Gated DeltaNet's output on the GPU (shaders/dec_gated_norm.comp), as
 * src/model/linear-attention.ts gatedRmsNorm: per (token, value head) row of n,
 * y = w · (x / sqrt(mean(x²) + eps)) · silu(z). DeltaRuleKernel fuses the same norm in (its `norm`);
 * this one is for outputs whose rows are not one workgroup's (a chunked prefill).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** x r, z r, w r, y w; push S, heads, n, xOffset, xStride, zOffset, zStride, wOffset, yOffset, yStride, eps (f32): 44 B. */
export const DEC_GATED_NORM: ShaderInterface = { name: "dec_gated_norm", storageBuffers: 4, pushConstantBytes: 44 };

export interface GatedNormArgs {
  /** Row (t, h) at xOffset + t · xStride + h · n. */
  x: Buffer;
  /** The gate (in_proj_z's output), laid out as x. */
  z: Buffer;
  /** n weights at wOffset, used as they are. */
  w: Buffer;
  /** Laid out as x; may be x (in place). */
  y: Buffer;
  S: number;
  /** Rows per token (value heads). */
  heads: number;
  n: number;
  eps: number;
  /** Element offsets and token strides (default 0 and heads · n). */
  xOffset?: number;
  xStride?: number;
  zOffset?: number;
  zStride?: number;
  wOffset?: number;
  yOffset?: number;
  yStride?: number;
}

export interface GatedNormKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup (one row each): default 128. */
  workgroupSize?: number;
  /** Reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

export class GatedNormKernel extends DecoderKernel {
  readonly workgroupSize: number;

  constructor(device: Device, options: GatedNormKernelOptions = {}) {
    const wg = options.workgroupSize ?? 128;
    if (!Number.isInteger(wg) || wg < 1) throw new InvalidArgumentError(`workgroupSize must be a positive integer, got ${wg}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_GATED_NORM, { 0: wg, 2: sub ? 1 : 0 }, options);
    this.workgroupSize = wg;
  }

  /** Records one dispatch: x heads, y S workgroups. The caller places barriers around it. */
  record(cb: CommandBuffer, a: GatedNormArgs): CommandBuffer {
    const { S, heads, n } = a;
    for (const [name, v] of [["S", S], ["heads", heads], ["n", n]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    const limits = this.device.info.limits.maxComputeWorkGroupCount;
    if (heads > limits[0]! || S > limits[1]!) throw new InvalidArgumentError(`${heads} x ${S} workgroups exceed the device's dispatch limits`);
    if (!(a.eps >= 0 && Number.isFinite(a.eps))) throw new InvalidArgumentError(`eps must be finite and >= 0, got ${a.eps}`);
    const row = heads * n;
    const xOffset = a.xOffset ?? 0, xStride = a.xStride ?? row, zOffset = a.zOffset ?? 0, zStride = a.zStride ?? row;
    const wOffset = a.wOffset ?? 0, yOffset = a.yOffset ?? 0, yStride = a.yStride ?? row;
    const words = (stride: number) => (S - 1) * stride + row;
    checkRange("gated norm x", a.x, xOffset, words(xStride));
    checkRange("gated norm z", a.z, zOffset, words(zStride));
    checkRange("gated norm w", a.w, wOffset, n);
    checkRange("gated norm y", a.y, yOffset, words(yStride));
    const set = this.setFor([a.x, a.z, a.w, a.y]);
    const pc = pushWords([S, heads, n, xOffset, xStride, zOffset, zStride, wOffset, yOffset, yStride, a.eps], [10]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(heads, S);
  }
}
