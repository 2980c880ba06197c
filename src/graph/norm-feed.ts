/**
 * An RMSNorm and the matrices that read its output (q, k, v; the shared expert's gate and up; lm_head).
 * Where one of them runs the integer-dot path (GGML blocks: the GEMV for few tokens, the GEMM for
 * prompt chunks), the norm writes its rows quantized as well (dec_rmsnorm_quant) into one scratch
 * every reader shares: each reader then runs its GEMV or GEMM alone, with no quantize dispatch and
 * barrier of its own (those had q, k and v each quantize the same x behind a barrier, one after another).
 */
import type { DeviceLinear, LinearKernels } from "./device-linear.ts";
import { GgmlIdpScratch } from "../kernels/decoder/ggml-gemv.ts";
import { RmsNormKernel, RmsNormQuantKernel, type RmsNormArgs } from "../kernels/decoder/rmsnorm.ts";
import type { CommandBuffer } from "../vk/commands.ts";

export class NormFeed implements Disposable {
  readonly rmsnorm: RmsNormKernel;
  private readonly quantKernel: RmsNormQuantKernel | undefined;
  private readonly scratch: GgmlIdpScratch | undefined;

  /** `cols`: the norm's row length (the model's hidden size). */
  constructor(linears: LinearKernels, readonly cols: number) {
    const device = linears.device;
    this.rmsnorm = new RmsNormKernel(device, { maxSets: 64 });
    if (!linears.integerDot || cols % RmsNormQuantKernel.GROUP !== 0) return;
    try {
      this.quantKernel = new RmsNormQuantKernel(device, { maxSets: 64, ...(device.info.type === 4 && { workgroupSize: 8 }) });
      this.scratch = new GgmlIdpScratch(device, cols, linears.quantizedTokens);
    } catch (e) {
      this[Symbol.dispose]();
      throw e;
    }
  }

  /**
   * Records the norm of `a` (a.rows tokens); when a reader takes quantized input at that many tokens,
   * the quantized rows too. Returns what to pass to each reader's recordFrom (undefined: plain x).
   */
  record(cb: CommandBuffer, a: RmsNormArgs, readers: readonly DeviceLinear[]): GgmlIdpScratch | undefined {
    const quantized = this.quantizedFor(a, readers);
    if (quantized) this.quantKernel!.record(cb, a, quantized);
    else this.rmsnorm.record(cb, a);
    return quantized;
  }

  /** Where record() would write the quantized rows of this norm (undefined: it writes plain rows only); another kernel that does the norm writes the same. */
  quantizedFor(a: RmsNormArgs, readers: readonly DeviceLinear[]): GgmlIdpScratch | undefined {
    const fits = this.scratch && a.n === this.cols && a.rows <= this.scratch.maxTokens && RmsNormQuantKernel.aligned(a);
    return fits && readers.some((m) => m.cols === this.cols && m.takesQuantized(a.rows)) ? this.scratch : undefined;
  }

  [Symbol.dispose](): void {
    this.scratch?.[Symbol.dispose]();
    this.quantKernel?.[Symbol.dispose]();
    this.rmsnorm[Symbol.dispose]();
  }
}
