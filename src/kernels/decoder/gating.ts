/**
 * Qwen3.5's elementwise gates on the GPU (shaders/dec_gating.comp), as src/model/hybrid-decoder.ts:
 * the gated attention's output gate (x · sigmoid(gate)), the shared expert's SwiGLU (silu(gate) ·
 * up) and its sigmoid-scaled add into the routed experts' sum (y += sigmoid(scale_t) · x).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** x r, g r, y rw; push S, n, mode, xOffset, xStride, gOffset, gStride, yOffset, yStride: 36 B. */
export const DEC_GATING: ShaderInterface = { name: "dec_gating", storageBuffers: 3, pushConstantBytes: 36 };

/** "sigmoid-gate": y = x · sigmoid(g); "swiglu": y = silu(x) · g; "scaled-add": y += sigmoid(g[t]) · x. */
export type GatingMode = "sigmoid-gate" | "swiglu" | "scaled-add";
const MODES: readonly GatingMode[] = ["sigmoid-gate", "swiglu", "scaled-add"];

export interface GatingArgs {
  mode: GatingMode;
  /** S rows of n floats: token t at xOffset + t · xStride. */
  x: Buffer;
  /** Laid out as x; "scaled-add": one float per token at gOffset + t · gStride. */
  g: Buffer;
  /** Laid out as x; may be x. */
  y: Buffer;
  S: number;
  n: number;
  xOffset?: number;
  xStride?: number;
  gOffset?: number;
  gStride?: number;
  yOffset?: number;
  yStride?: number;
}

export class GatingKernel extends DecoderKernel {
  readonly workgroupSize: number;

  constructor(device: Device, options: DecoderKernelOptions & { workgroupSize?: number } = {}) {
    const wg = options.workgroupSize ?? 64;
    if (!Number.isInteger(wg) || wg < 1) throw new InvalidArgumentError(`workgroupSize must be a positive integer, got ${wg}`);
    super(device, DEC_GATING, { 0: wg }, options);
    this.workgroupSize = wg;
  }

  /** Records one dispatch of ceil(n / workgroupSize) x S workgroups. The caller places barriers around it. */
  record(cb: CommandBuffer, a: GatingArgs): CommandBuffer {
    const { S, n } = a;
    const mode = MODES.indexOf(a.mode);
    if (mode < 0) throw new InvalidArgumentError(`mode must be one of ${MODES.join(", ")}, got ${String(a.mode)}`);
    for (const [name, v] of [["S", S], ["n", n]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`${name} must be a positive integer, got ${v}`);
    }
    const groups = Math.ceil(n / this.workgroupSize), limits = this.device.info.limits.maxComputeWorkGroupCount;
    if (groups > limits[0]! || S > limits[1]!) throw new InvalidArgumentError(`${groups} x ${S} workgroups exceed the device's dispatch limits`);
    const xOffset = a.xOffset ?? 0, xStride = a.xStride ?? n, yOffset = a.yOffset ?? 0, yStride = a.yStride ?? n;
    const perToken = a.mode === "scaled-add";
    const gOffset = a.gOffset ?? 0, gStride = a.gStride ?? (perToken ? 1 : n);
    const words = (stride: number, width: number) => (S - 1) * stride + width;
    checkRange("gating x", a.x, xOffset, words(xStride, n));
    checkRange("gating g", a.g, gOffset, words(gStride, perToken ? 1 : n));
    checkRange("gating y", a.y, yOffset, words(yStride, n));
    const set = this.setFor([a.x, a.g, a.y]);
    const pc = pushWords([S, n, mode, xOffset, xStride, gOffset, gStride, yOffset, yStride]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(groups, S);
  }
}
