/**
 * Dense GEMV on q4/q8 weights for the decode graph: the GEMV kernels of src/kernels/gemv.ts
 * (shaders/gemv_q{4,8}.comp, float path) recorded against any buffers, with descriptor sets
 * cached per tuple of buffers as the other decoder kernels do. The matrix lives in a
 * DeviceMatrix (weights, then scales).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { QuantFormat } from "../../quant/types.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { DeviceMatrix } from "../gemv.ts";
import { GATEUP, GEMV } from "../shaders.ts";
import { chooseKernelConfig, specialization, type KernelConfig } from "../tuning.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

export const QUANT_GEMV_MAX_S = 64;

export interface QuantGemvArgs {
  matrix: DeviceMatrix;
  /** S rows of cols floats from xOffset. */
  x: Buffer;
  /** S rows of `rows` floats from yOffset. */
  y: Buffer;
  S: number;
  xOffset?: number;
  yOffset?: number;
}

export interface QuantGemvKernelOptions extends DecoderKernelOptions {
  /** Override of the tuning table's kernel shape. */
  shape?: Partial<Pick<KernelConfig, "workgroupSize" | "rowsPerWorkgroup">>;
}

/** The tuning table's kernel config with the options' shape over it, checked. */
function gemvShape(device: Device, options: QuantGemvKernelOptions): KernelConfig {
  const config = { ...chooseKernelConfig(device.info), ...options.shape };
  // each row of a workgroup needs its own share of threads (8 threads x 16 rows computed garbage)
  if (!(config.rowsPerWorkgroup >= 1 && config.workgroupSize % config.rowsPerWorkgroup === 0)) {
    throw new InvalidArgumentError(`rowsPerWorkgroup ${config.rowsPerWorkgroup} must divide workgroupSize ${config.workgroupSize}`);
  }
  return config;
}

/** A q4/q8 float-path kernel of one matrix kind (format, scale type, group size) and shape. */
abstract class QuantRowsKernel extends DecoderKernel {
  readonly rowsPerWorkgroup: number;

  protected constructor(device: Device, shaders: typeof GEMV, readonly format: QuantFormat, readonly scaleF16: boolean, readonly groupSize: number, options: QuantGemvKernelOptions) {
    const config = gemvShape(device, options);
    super(device, shaders[format], specialization(config, scaleF16, groupSize), options);
    this.rowsPerWorkgroup = config.rowsPerWorkgroup;
  }

  protected checkKind(m: DeviceMatrix["matrix"]): void {
    if (m.format !== this.format || (m.scaleType === "f16") !== this.scaleF16 || m.groupSize !== this.groupSize) {
      throw new InvalidArgumentError(`a ${m.format}/${m.scaleType}/${m.groupSize} matrix on a ${this.format}/${this.scaleF16 ? "f16" : "f32"}/${this.groupSize} kernel`);
    }
  }
}

/** One pipeline per (format, scale type, group size): make one object per matrix kind. */
export class QuantGemvKernel extends QuantRowsKernel {
  constructor(device: Device, format: QuantFormat, scaleF16: boolean, groupSize: number, options: QuantGemvKernelOptions = {}) {
    super(device, GEMV, format, scaleF16, groupSize, options);
  }

  /** Records one dispatch. The caller places barriers around it. */
  record(cb: CommandBuffer, a: QuantGemvArgs): CommandBuffer {
    const m = a.matrix.matrix, S = a.S;
    this.checkKind(m);
    if (!Number.isInteger(S) || S < 1 || S > QUANT_GEMV_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${QUANT_GEMV_MAX_S}, got ${S}`);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    checkRange("quant gemv x", a.x, xOffset, S * m.cols);
    checkRange("quant gemv y", a.y, yOffset, S * m.rows);
    const d = a.matrix;
    const set = this.setFor([d.buffer, d.buffer, a.x, a.y]);
    const [gx, gy] = this.grid(Math.ceil(m.rows / this.rowsPerWorkgroup));
    const pc = pushWords([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, d.weightOffset / 16, d.scaleOffset / 4, xOffset, yOffset]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}

export interface QuantGateUpArgs {
  /** The gate and up matrices: one shape and one format. */
  gate: DeviceMatrix;
  up: DeviceMatrix;
  /** S rows of cols floats from xOffset. */
  x: Buffer;
  /** S rows of `rows` floats from yOffset: silu(gate · x) * (up · x). */
  y: Buffer;
  S: number;
  xOffset?: number;
  yOffset?: number;
}

/**
 * The fused gate+up GEMV on q4/q8 weights (shaders/gateup_q{4,8}.comp, float path: each matrix's
 * row sums as QuantGemvKernel's of the same shape, then SwiGLU in the epilogue) against any
 * buffers: a dense SwiGLU block's first half in one dispatch, with no SwiGLU step after it.
 */
export class QuantGateUpKernel extends QuantRowsKernel {
  constructor(device: Device, format: QuantFormat, scaleF16: boolean, groupSize: number, options: QuantGemvKernelOptions = {}) {
    super(device, GATEUP, format, scaleF16, groupSize, options);
  }

  /** Whether gate and up can run as one call: one kind (format, scale type, group size) and one shape. */
  static pairs(g: DeviceMatrix["matrix"], u: DeviceMatrix["matrix"]): boolean {
    return g.format === u.format && g.scaleType === u.scaleType && g.groupSize === u.groupSize && g.rows === u.rows && g.cols === u.cols && g.rowWords === u.rowWords;
  }

  /** Records one dispatch. The caller places barriers around it. */
  record(cb: CommandBuffer, a: QuantGateUpArgs): CommandBuffer {
    const g = a.gate.matrix, u = a.up.matrix, S = a.S;
    this.checkKind(g);
    if (!QuantGateUpKernel.pairs(g, u)) throw new InvalidArgumentError(`gate ${g.rows}x${g.cols} ${g.format}/${g.scaleType}/${g.groupSize} and up ${u.rows}x${u.cols} ${u.format}/${u.scaleType}/${u.groupSize} differ`);
    if (!Number.isInteger(S) || S < 1 || S > QUANT_GEMV_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${QUANT_GEMV_MAX_S}, got ${S}`);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    checkRange("quant gate/up x", a.x, xOffset, S * g.cols);
    checkRange("quant gate/up y", a.y, yOffset, S * g.rows);
    const set = this.setFor([a.gate.buffer, a.gate.buffer, a.up.buffer, a.up.buffer, a.x, a.y]);
    const [gx, gy] = this.grid(Math.ceil(g.rows / this.rowsPerWorkgroup));
    const pc = pushWords([g.rows, g.cols, S, g.rowWords, g.groupsPerRow, a.gate.weightOffset / 16, a.gate.scaleOffset / 4, a.up.weightOffset / 16, a.up.scaleOffset / 4, xOffset, yOffset, 0], [11]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}
