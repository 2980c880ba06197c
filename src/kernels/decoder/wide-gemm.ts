/**
 * The dense GEMMs of long prompt chunks on the matrix cores (QuantGemmKernel's and GgmlGemmKernel's
 * products, the same arguments): cm_slice_tile.glsl's tiles of 128 rows x wideTileTokens tokens (the
 * experts' tile), where the 64 x 64 tiles of dec_gemm_*_cm serve shorter chunks. At 64 tokens the wide
 * tile gave a 2048-column matrix of 8192 rows 64 workgroups, half of a large GPU, and lost there
 * (docs/measurements.md, 2026-12-07); where VKMOE_WIDE_GEMM asks for it (GGML block matrices by
 * default) and its self-check passes, DeviceLinear takes it for calls of WIDE_GEMM_FROM_TOKENS or more. No split over the columns: such calls have tiles enough.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { DeviceMatrix } from "../gemv.ts";
import { checkOnce, COOPMAT_CHECK_BOUND, passesOrSays, q8GemmCheck, type CoopmatCheck } from "./coopmat-check.ts";
import { GGML_BLOCK_TYPES, type GgmlBlockType } from "../../quant/ggml-blocks.ts";
import type { QuantFormat } from "../../quant/types.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import { GGML_FORMAT_ID, type GgmlGemmArgs } from "./ggml-gemm.ts";
import { checkQuantGemmCall, cmTileSharedBytes, matrixCoreShader } from "./quant-gemm.ts";
import type { QuantGemvArgs } from "./quant-gemv.ts";

/** weights, scales (the same DeviceMatrix buffer), x, y; push O, I, S, rowWords, groupsPerRow, weightOffset (uvec4s), scaleOffset (words), xOffset, yOffset: 36 B. */
export const DEC_GEMM_QUANT_WIDE_CM: ShaderInterface = { name: "dec_gemm_quant_wide_cm", storageBuffers: 4, pushConstantBytes: 36 };
export const DEC_GEMM_QUANT_WIDE_CM_EMU: ShaderInterface = { ...DEC_GEMM_QUANT_WIDE_CM, name: "dec_gemm_quant_wide_cm_emu" };
/** blocks, x, y; push O, I, S, blockOffset (bytes), xOffset, yOffset (floats): 24 B. */
export const DEC_GEMM_GGML_WIDE_CM: ShaderInterface = { name: "dec_gemm_ggml_wide_cm", storageBuffers: 3, pushConstantBytes: 24 };
export const DEC_GEMM_GGML_WIDE_CM_EMU: ShaderInterface = { ...DEC_GEMM_GGML_WIDE_CM, name: "dec_gemm_ggml_wide_cm_emu" };

/** Rows of the wide tile. */
export const WIDE_GEMM_ROWS = 128;
/** DeviceLinear's matrix-core calls of this many tokens or more take the wide tile. */
export const WIDE_GEMM_FROM_TOKENS = 256;

/** The wide tile's tokens: 64 where the shared memory allows (NVIDIA's 48 KiB), else 32. */
export function wideTileTokens(device: Device): number {
  return cmTileSharedBytes(64) <= device.info.limits.maxComputeSharedMemorySize ? 64 : 32;
}

/** The grid of a call: row tiles x token tiles, refused past the device's workgroup counts. */
function wideGrid(device: Device, rows: number, S: number, tokens: number): [number, number] {
  const gx = Math.ceil(rows / WIDE_GEMM_ROWS), gy = Math.ceil(S / tokens);
  const [maxX, maxY] = device.info.limits.maxComputeWorkGroupCount;
  if (gx > maxX!) throw new InvalidArgumentError(`${rows} rows need ${gx} workgroups, past maxComputeWorkGroupCount[0] (${maxX})`);
  if (gy > maxY!) throw new InvalidArgumentError(`${S} tokens need ${gy} workgroups, past maxComputeWorkGroupCount[1] (${maxY})`);
  return [gx, gy];
}

export interface WideGemmOptions extends DecoderKernelOptions {
  /** "emulated" (tests): the same tiles and f16 rounding with plain sums in place of the matrix products. Default: the matrix cores. */
  matrixCores?: true | "emulated";
}

/** q4/q8 pool matrices (Q4_0 / Q8_0 files' dense projections): one pipeline per (format, scale type, group size). */
export class QuantGemmWideKernel extends DecoderKernel {
  readonly tileTokens: number;

  constructor(device: Device, readonly format: QuantFormat, readonly scaleF16: boolean, readonly groupSize: number, options: WideGemmOptions = {}) {
    if (![32, 64, 128].includes(groupSize)) throw new InvalidArgumentError(`groupSize must be 32, 64 or 128, got ${groupSize}`);
    const shader = matrixCoreShader(device, { cm: DEC_GEMM_QUANT_WIDE_CM, emulated: DEC_GEMM_QUANT_WIDE_CM_EMU }, options.matrixCores ?? true);
    const tokens = wideTileTokens(device);
    super(device, shader, { 0: format === "q4" ? 4 : 8, 1: scaleF16 ? 1 : 0, 2: groupSize, 3: tokens }, options);
    this.tileTokens = tokens;
  }

  /** Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ. The caller places barriers around it. */
  record(cb: CommandBuffer, a: QuantGemvArgs): CommandBuffer {
    const m = a.matrix.matrix, S = a.S;
    checkQuantGemmCall(this, a.matrix, S, undefined);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    checkRange("quant gemm x", a.x, xOffset, S * m.cols);
    checkRange("quant gemm y", a.y, yOffset, S * m.rows);
    const d: DeviceMatrix = a.matrix;
    const grid = wideGrid(this.device, m.rows, S, this.tileTokens);
    const set = this.setFor([d.buffer, d.buffer, a.x, a.y]);
    const pc = pushWords([m.rows, m.cols, S, m.rowWords, m.groupsPerRow, d.weightOffset / 16, d.scaleOffset / 4, xOffset, yOffset]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(...grid);
  }
}

/** GGML block matrices (K-quant files' dense projections): one pipeline per type. */
export class GgmlGemmWideKernel extends DecoderKernel {
  readonly tileTokens: number;

  constructor(device: Device, readonly type: GgmlBlockType, options: WideGemmOptions = {}) {
    if (!GGML_BLOCK_TYPES.includes(type)) throw new InvalidArgumentError(`no GPU GEMM for GGML type ${String(type)}; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
    const shader = matrixCoreShader(device, { cm: DEC_GEMM_GGML_WIDE_CM, emulated: DEC_GEMM_GGML_WIDE_CM_EMU }, options.matrixCores ?? true);
    const tokens = wideTileTokens(device);
    super(device, shader, { 0: GGML_FORMAT_ID[type], 1: tokens }, options);
    this.tileTokens = tokens;
  }

  /** Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ (cols a multiple of the block, xOffset of 4 floats). The caller places barriers around it. */
  record(cb: CommandBuffer, a: GgmlGemmArgs): CommandBuffer {
    const m = a.matrix, S = a.S;
    if (m.type !== this.type) throw new InvalidArgumentError(`a ${m.type} matrix on a ${this.type} kernel`);
    if (!Number.isInteger(S) || S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${S}`);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    if (xOffset % 4 !== 0) throw new InvalidArgumentError(`xOffset must be a multiple of 4 floats (vec4 loads), got ${xOffset}`);
    checkRange("ggml gemm x", a.x, xOffset, S * m.cols);
    checkRange("ggml gemm y", a.y, yOffset, S * m.rows);
    const grid = wideGrid(this.device, m.rows, S, this.tileTokens);
    const set = this.setFor([m.buffer, a.x, a.y]);
    const pc = pushWords([m.rows, m.cols, S, 0, xOffset, yOffset]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(...grid);
  }
}

const verdicts = new WeakMap<Device, CoopmatCheck>();

/**
 * The wide tile's self-check, as coopmat-check.ts's for the 64 x 64 tiles: one q8 GEMM of 130 x 64
 * at 70 tokens (two row tiles and two token tiles, both partial) through dec_gemm_quant_wide_cm (or
 * its emulation, variant "emulated") against gemvReference. The real kernel's verdict is kept per
 * device.
 */
export function wideGemmSelfCheck(device: Device, variant: true | "emulated" = true, bound = COOPMAT_CHECK_BOUND): CoopmatCheck {
  return checkOnce(verdicts, device, variant, bound, () => {
    using kernel = new QuantGemmWideKernel(device, "q8", true, 32, { matrixCores: variant });
    return q8GemmCheck(device, kernel, { O: 130, I: 64, S: 70 }, 3, "the wide matrix-core GEMM", bound);
  });
}

const warned = new WeakSet<Device>();

/** The wide tile's self-check verdict on this device, with one line on stderr the first time it fails. */
export function wideGemmPasses(device: Device): boolean {
  return passesOrSays(wideGemmSelfCheck(device), device, warned, "long prompt chunks keep the 64 x 64 tiles (VKMOE_WIDE_GEMM)");
}
