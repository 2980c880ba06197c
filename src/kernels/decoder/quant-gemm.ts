/**
 * Dense matrix products of a prompt chunk on q4/q8 weights (shaders/dec_gemm_quant.comp): tiles of
 * 32 rows x 64 tokens, the weights dequantized into shared memory once for all the chunk's tokens.
 * The decode graph uses it for calls of more than a few tokens, where the GEMV kernels (one weight
 * load per few tokens) spend most of a prompt chunk's time; decode keeps the GEMVs.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { QuantFormat } from "../../quant/types.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { DeviceMatrix } from "../gemv.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import type { QuantGemvArgs } from "./quant-gemv.ts";

/** weights `uint[]`, scales `uint[]` (the same DeviceMatrix buffer), x, y; push as the GEMV's: 36 B. */
export const DEC_GEMM_QUANT: ShaderInterface = { name: "dec_gemm_quant", storageBuffers: 4, pushConstantBytes: 36 };
/** Rows and tokens of one workgroup's tile. */
export const GEMM_ROWS = 32;
export const GEMM_TOKENS = 64;

/** One pipeline per (format, scale type, group size), as QuantGemvKernel. */
export class QuantGemmKernel extends DecoderKernel {
  constructor(device: Device, readonly format: QuantFormat, readonly scaleF16: boolean, readonly groupSize: number, options: DecoderKernelOptions = {}) {
    if (![32, 64, 128].includes(groupSize)) throw new InvalidArgumentError(`groupSize must be 32, 64 or 128, got ${groupSize}`);
    super(device, DEC_GEMM_QUANT, { 0: format === "q4" ? 4 : 8, 1: scaleF16 ? 1 : 0, 2: groupSize }, options);
  }

  /** Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ. The caller places barriers around it. */
  record(cb: CommandBuffer, a: QuantGemvArgs): CommandBuffer {
    const m = a.matrix.matrix, S = a.S;
    if (m.format !== this.format || (m.scaleType === "f16") !== this.scaleF16 || m.groupSize !== this.groupSize) {
      throw new InvalidArgumentError(`a ${m.format}/${m.scaleType}/${m.groupSize} matrix on a ${this.format}/${this.scaleF16 ? "f16" : "f32"}/${this.groupSize} kernel`);
    }
    if (!Number.isInteger(S) || S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${S}`);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    checkRange("quant gemm x", a.x, xOffset, S * m.cols);
    checkRange("quant gemm y", a.y, yOffset, S * m.rows);
    const d: DeviceMatrix = a.matrix;
    const set = this.setFor([d.buffer, d.buffer, a.x, a.y]);
    const gx = Math.ceil(m.rows / GEMM_ROWS), gy = Math.ceil(S / GEMM_TOKENS);
    const maxX = this.device.info.limits.maxComputeWorkGroupCount[0]!;
    if (gx > maxX) throw new InvalidArgumentError(`${m.rows} rows need ${gx} workgroups, past maxComputeWorkGroupCount[0] (${maxX})`);
    const pc = pushWords([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, d.weightOffset / 16, d.scaleOffset / 4, xOffset, yOffset]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}
