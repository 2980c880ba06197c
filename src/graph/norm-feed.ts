/**
 * An RMSNorm and the matrices that read its output (q, k, v; the shared expert's gate and up; lm_head).
 * Where one of them runs the integer-dot path (GGML blocks: the GEMV for few tokens, the GEMM for
 * prompt chunks), the norm writes its rows quantized as well (dec_rmsnorm_quant) into one scratch
 * every reader shares: each reader then runs its GEMV or GEMM alone, with no quantize dispatch and
 * barrier of its own (those had q, k and v each quantize the same x behind a barrier, one after another).
 *
 * recordWarm runs a norm's pipeline ahead of time on stand-in rows: in the decode graph the first
 * norm after the experts cost ~6 µs more than the same pipeline run again (its code cold after the
 * other steps' kernels); run once beside the experts' first step (or the router's step where the
 * experts are one step), off the critical path, on rows that take the real rows' code path, the real
 * norm finds it warm (docs/measurements.md, 2026-12-07, late night, and 2026-12-08).
 */
import type { DeviceLinear, LinearKernels } from "./device-linear.ts";
import { GgmlIdpScratch } from "../kernels/decoder/ggml-gemv.ts";
import { RmsNormKernel, RmsNormQuantKernel, type RmsNormArgs } from "../kernels/decoder/rmsnorm.ts";
import type { CommandBuffer } from "../vk/commands.ts";
import type { Device } from "../vk/device.ts";
import type { Buffer } from "../vk/memory.ts";
import { filledBuffer } from "./stand-ins.ts";

/** One row of stand-ins for recordWarm (filled once; read and written by the warm dispatches only). */
interface StandIns {
  x: Buffer;
  add: Buffer;
  y: Buffer;
  gate: Buffer;
  quantized: GgmlIdpScratch | undefined;
}

function makeStandIns(device: Device, cols: number, quantized: boolean): StandIns {
  const made: Disposable[] = [];
  // ones, not zeros (stand-ins.ts)
  const filled = (floats: number, value: number) => {
    const b = filledBuffer(device, floats, value);
    made.push(b);
    return b;
  };
  try {
    const s: StandIns = { x: filled(cols, 1), add: filled(cols, 1), y: filled(cols, 0), gate: filled(1, 0), quantized: undefined };
    if (quantized) made.push((s.quantized = new GgmlIdpScratch(device, cols, 1)));
    return s;
  } catch (e) {
    for (const d of made.reverse()) d[Symbol.dispose]();
    throw e;
  }
}

export class NormFeed implements Disposable {
  readonly rmsnorm: RmsNormKernel;
  private readonly quantKernel: RmsNormQuantKernel | undefined;
  private readonly scratch: GgmlIdpScratch | undefined;
  private readonly standIns: StandIns;

  /** `cols`: the norm's row length (the model's hidden size). */
  constructor(linears: LinearKernels, readonly cols: number) {
    const device = linears.device;
    this.rmsnorm = new RmsNormKernel(device, { maxSets: 64 });
    try {
      if (linears.integerDot && cols % RmsNormQuantKernel.GROUP === 0) {
        this.quantKernel = new RmsNormQuantKernel(device, { maxSets: 64, ...(device.info.type === 4 && { workgroupSize: 8 }) });
        this.scratch = new GgmlIdpScratch(device, cols, linears.quantizedTokens);
      }
      this.standIns = makeStandIns(device, cols, this.quantKernel !== undefined);
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

  /**
   * Records the pipeline that record(a, readers) would run, with a's flags and weights, on one row
   * of stand-ins of its own: nothing else reads or writes them, so the caller records it beside an
   * earlier step with no barrier. Returns the dispatches recorded (1).
   */
  recordWarm(cb: CommandBuffer, a: RmsNormArgs, readers: readonly DeviceLinear[]): number {
    const s = this.standIns;
    const warm: RmsNormArgs = {
      x: s.x, w: a.w, wOffset: a.wOffset ?? 0, y: s.y, rows: 1, n: a.n, eps: a.eps,
      ...(a.add && { add: s.add }), ...(a.scaledAdd && { scaledAdd: { x: s.add, gate: s.gate } }),
    };
    if (this.quantizedFor(a, readers)) this.quantKernel!.record(cb, warm, s.quantized!);
    else this.rmsnorm.record(cb, warm);
    return 1;
  }

  [Symbol.dispose](): void {
    const s = this.standIns as StandIns | undefined;
    if (s) for (const d of [s.quantized, s.gate, s.y, s.add, s.x]) d?.[Symbol.dispose]();
    this.scratch?.[Symbol.dispose]();
    this.quantKernel?.[Symbol.dispose]();
    this.rmsnorm[Symbol.dispose]();
  }
}
