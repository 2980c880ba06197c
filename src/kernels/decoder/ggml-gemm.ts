/**
 * Dense matrix products of a prompt chunk straight from GGML block tensors (Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K) on the GPU (shaders/dec_gemm_ggml.comp): tiles of 32 rows x 64 tokens walking the row
 * one 32-weight slice at a time, each slice dequantized into shared memory (GGML's weights bit for
 * bit, ggml_blocks.glsl) once for all the tile's tokens. What QuantGemmKernel is to the q4/q8 GEMVs,
 * this is to GgmlGemvKernel: that one re-reads and re-forms every weight per few tokens.
 */
import { InvalidArgumentError } from "../../errors.ts";
import { GGML_BLOCK_TYPES, type GgmlBlockType } from "../../quant/ggml-blocks.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import type { GgmlGemvArgs } from "./ggml-gemv.ts";

/** blocks `uint[]` r, x r, y w; push O, I, S, blockOffset (bytes), xOffset, yOffset (floats): 24 B, as dec_gemv_ggml. */
export const DEC_GEMM_GGML: ShaderInterface = { name: "dec_gemm_ggml", storageBuffers: 3, pushConstantBytes: 24 };
/** Rows and tokens of one workgroup's tile. */
export const GGML_GEMM_ROWS = 32;
export const GGML_GEMM_TOKENS = 64;

/** ggml_blocks.glsl's GGML_FMT_* (specialization constant 0), as dec_gemv_ggml's FORMAT. */
const FORMAT_ID: Readonly<Record<GgmlBlockType, number>> = { Q4_1: 0, Q5_0: 1, Q5_1: 2, Q4_K: 3, Q5_K: 4, Q6_K: 5 };

/** The arguments of GgmlGemvKernel.record, for any S >= 1 (one dispatch: ceil(S / 64) token tiles). */
export type GgmlGemmArgs = GgmlGemvArgs;

/** One pipeline per GGML type: make one object per type. */
export class GgmlGemmKernel extends DecoderKernel {
  constructor(device: Device, readonly type: GgmlBlockType, options: DecoderKernelOptions = {}) {
    if (!GGML_BLOCK_TYPES.includes(type)) throw new InvalidArgumentError(`no GPU GEMM for GGML type ${String(type)}; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
    super(device, DEC_GEMM_GGML, { 0: FORMAT_ID[type] }, options);
  }

  /** Records one dispatch: y[S][rows] = x[S][cols] · Wᵀ, grid ceil(rows / 32) x ceil(S / 64). The caller places barriers around it. */
  record(cb: CommandBuffer, a: GgmlGemmArgs): CommandBuffer {
    const m = a.matrix, S = a.S;
    if (m.type !== this.type) throw new InvalidArgumentError(`a ${m.type} matrix on a ${this.type} kernel`);
    if (!Number.isInteger(S) || S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${S}`);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    if (xOffset % 4 !== 0) throw new InvalidArgumentError(`xOffset must be a multiple of 4 floats (vec4 loads), got ${xOffset}`);
    checkRange("ggml gemm x", a.x, xOffset, S * m.cols);
    checkRange("ggml gemm y", a.y, yOffset, S * m.rows);
    const gx = Math.ceil(m.rows / GGML_GEMM_ROWS), gy = Math.ceil(S / GGML_GEMM_TOKENS);
    const [maxX, maxY] = this.device.info.limits.maxComputeWorkGroupCount;
    if (gx > maxX!) throw new InvalidArgumentError(`${m.rows} rows need ${gx} workgroups, past maxComputeWorkGroupCount[0] (${maxX})`);
    if (gy > maxY!) throw new InvalidArgumentError(`${S} tokens need ${gy} workgroups, past maxComputeWorkGroupCount[1] (${maxY})`);
    const set = this.setFor([m.buffer, a.x, a.y]);
    const pc = pushWords([m.rows, m.cols, S, 0, xOffset, yOffset]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}
