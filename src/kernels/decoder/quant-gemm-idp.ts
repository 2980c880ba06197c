/**
 * The integer-dot prompt-chunk GEMM of q4/q8 pool matrices (shaders/dec_gemm_quant_idp.comp): the
 * tile of dec_gemm_ggml_idp (gemm_idp_tile.glsl) over the pool format, x quantized in groups of 16
 * (GgmlQuantizeKernel, or a norm's quantized rows) into a GgmlIdpScratch. The graphs run it for the
 * prompt chunks of Q4_0 / Q8_0 files' dense matrices (QuantLinear) where the integer-dot decision
 * is on; splits over the columns as QuantGemmKernel. The device must have shaderIntegerDotProduct
 * enabled and the caller the integer-dot decision on (the probe creates its pipelines first).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { QuantFormat } from "../../quant/types.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { DEC_GEMM_QUANT_IDP } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { GGML_IDP_GROUP, GgmlIdpScratch, GgmlQuantizeKernel, type QuantizedRows } from "./ggml-gemv.ts";
import { checkQuantGemmCall, type GemmSplitScratch } from "./quant-gemm.ts";
import type { QuantGemvArgs } from "./quant-gemv.ts";

/** QuantGemvArgs, and where x is quantized (record quantizes it there first; recordQuantized reads only the scratch). */
export interface QuantGemmIdpArgs extends QuantGemvArgs {
  /** x quantized in groups of 16: rows of the matrix's cols, at least S of them. */
  scratch: QuantizedRows;
}

/** One pipeline per (format, scale type, group size), as QuantGemmKernel. */
export class QuantGemmIdpKernel extends DecoderKernel {
  private readonly quantize: GgmlQuantizeKernel;

  constructor(device: Device, readonly format: QuantFormat, readonly scaleF16: boolean, readonly groupSize: number, options: DecoderKernelOptions = {}) {
    if (![32, 64, 128].includes(groupSize)) throw new InvalidArgumentError(`groupSize must be 32, 64 or 128, got ${groupSize}`);
    if (!device.enabled.integerDotProduct) throw new InvalidArgumentError(`the integer-dot q4/q8 GEMM needs shaderIntegerDotProduct, not enabled on ${device.info.name}`);
    super(device, DEC_GEMM_QUANT_IDP, { 0: format === "q4" ? 4 : 8, 1: scaleF16 ? 1 : 0, 2: groupSize }, options);
    try {
      this.quantize = new GgmlQuantizeKernel(device, options);
    } catch (e) {
      super[Symbol.dispose]();
      throw e;
    }
  }

  /** Records quantize, a compute-to-compute barrier, and the GEMM. The caller places barriers around the whole. */
  record(cb: CommandBuffer, a: QuantGemmIdpArgs, split?: GemmSplitScratch): CommandBuffer {
    const m = a.matrix.matrix, xOffset = a.xOffset ?? 0;
    this.checkArgs(a, split);
    checkRange("quant idp gemm x", a.x, xOffset, a.S * m.cols);
    this.quantize.record(cb, a.x, xOffset, a.scratch, m.cols, a.S).barrier("computeToCompute");
    return this.recordQuantized(cb, a, split);
  }

  /** The GEMM alone, over x as the scratch already holds it quantized; the caller places the barrier after whatever wrote it. */
  recordQuantized(cb: CommandBuffer, a: Omit<QuantGemmIdpArgs, "x" | "xOffset">, split?: GemmSplitScratch): CommandBuffer {
    const d = a.matrix, m = d.matrix, S = a.S, sc = a.scratch;
    const [gx, gy] = this.checkArgs(a, split);
    const yOffset = a.yOffset ?? 0;
    checkRange("quant idp gemm y", a.y, yOffset, S * m.rows);
    const splits = split?.splits ?? 1, splitCols = split?.splitCols ?? m.cols;
    // without a split the partials' bindings are y (never read: splits is 1)
    const set = this.setFor([d.buffer, d.buffer, sc.xq, sc.xscale, sc.xsum, a.y, split?.part ?? a.y, split?.arrived ?? a.y]);
    const pc = pushWords([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, d.weightOffset / 16, d.scaleOffset / 4, yOffset, splits, splitCols]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy, splits);
  }

  /** Returns the grid's x, y. */
  private checkArgs(a: Omit<QuantGemmIdpArgs, "x" | "xOffset">, split: GemmSplitScratch | undefined): [number, number] {
    const m = a.matrix.matrix, S = a.S, sc = a.scratch;
    const grid = checkQuantGemmCall(this, a.matrix, S, split);
    if (m.cols % 32 !== 0) throw new InvalidArgumentError(`the integer-dot q4/q8 GEMM takes rows of a multiple of 32 columns, got ${m.cols}`);
    if (sc instanceof GgmlIdpScratch && (sc.cols !== m.cols || sc.maxTokens < S)) throw new InvalidArgumentError(`a scratch of ${sc.maxTokens} tokens x ${sc.cols} columns for ${S} tokens x ${m.cols}`);
    const groups = (S * m.cols) / GGML_IDP_GROUP;
    checkRange("quant idp gemm xq", sc.xq, 0, 4 * groups);
    checkRange("quant idp gemm xscale", sc.xscale, 0, groups);
    checkRange("quant idp gemm xsum", sc.xsum, 0, groups);
    return grid;
  }

  override [Symbol.dispose](): void {
    this.quantize[Symbol.dispose]();
    super[Symbol.dispose]();
  }
}
