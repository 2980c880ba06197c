/**
 * GEMV straight from GGML block tensors (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) on the GPU
 * (shaders/dec_gemv_ggml.comp, shaders/ggml_blocks.glsl): y[s, o] = Σ_i W[o, i] x[s, i] for S = 1..64
 * tokens, each weight formed exactly as GGML's dequantize_row_* forms it (float path, f32
 * accumulation). The matrix lives in a DeviceGgmlMatrix: the file's block bytes uploaded once, as
 * they are (no repack: the kernel reads 4.5..6.6 bits a weight, the file's own size).
 */
import { InvalidArgumentError } from "../../errors.ts";
import { GGML_BLOCK_TYPES, type GgmlBlockTensor, type GgmlBlockType } from "../../quant/ggml-blocks.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { uploadBytes } from "../../vk/transfer.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** blocks `uint[]` r, x r, y w; push O, I, S, blockOffset (bytes), xOffset, yOffset (floats): 24 B. */
export const DEC_GEMV_GGML: ShaderInterface = { name: "dec_gemv_ggml", storageBuffers: 3, pushConstantBytes: 24 };
export const GGML_GEMV_MAX_S = 64;

/** ggml_blocks.glsl's GGML_FMT_* (specialization constant 3). */
const FORMAT_ID: Readonly<Record<GgmlBlockType, number>> = { Q4_1: 0, Q5_0: 1, Q5_1: 2, Q4_K: 3, Q5_K: 4, Q6_K: 5 };

/** The block tensor's bytes in device memory, uploaded once (the mapped file bytes go through uploadBytes' staging only). */
export class DeviceGgmlMatrix implements Disposable {
  readonly type: GgmlBlockType;
  readonly rows: number;
  readonly cols: number;
  readonly buffer: Buffer;
  /** Bytes of the blocks (the file's), from byte 0 of `buffer`. */
  readonly bytes: number;

  constructor(device: Device, t: GgmlBlockTensor) {
    this.type = t.type;
    this.rows = t.rows;
    this.cols = t.cols;
    this.bytes = t.bytes.byteLength;
    // 16 more bytes: the shader reads the word after a 2-mod-4 field (ggml_blocks.glsl)
    this.buffer = new Buffer(device, { size: BigInt(Math.ceil((this.bytes + 16) / 16) * 16), memory: "device" });
    try {
      uploadBytes(device, this.buffer, 0n, t.bytes);
    } catch (e) {
      this.buffer[Symbol.dispose]();
      throw e;
    }
  }

  [Symbol.dispose](): void {
    this.buffer[Symbol.dispose]();
  }
}

export interface GgmlGemvArgs {
  matrix: DeviceGgmlMatrix;
  /** S rows of cols floats from xOffset, a multiple of 4 (the kernel loads x as vec4). */
  x: Buffer;
  /** S rows of `rows` floats from yOffset. */
  y: Buffer;
  S: number;
  xOffset?: number;
  yOffset?: number;
}

export interface GgmlGemvKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup, a power of two (default 64). */
  workgroupSize?: number;
  /** Rows per workgroup (default 4). */
  rowsPerWorkgroup?: number;
  /** Tokens per register chunk, 1..8 (default 1, decode): each unit of weights is dequantized once per chunk. */
  tokensPerChunk?: number;
  /** Reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

/** One pipeline per GGML type: make one object per type. */
export class GgmlGemvKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly rowsPerWorkgroup: number;
  readonly tokensPerChunk: number;

  constructor(device: Device, readonly type: GgmlBlockType, options: GgmlGemvKernelOptions = {}) {
    if (!GGML_BLOCK_TYPES.includes(type)) throw new InvalidArgumentError(`no GPU GEMV for GGML type ${String(type)}; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
    const wg = options.workgroupSize ?? 64;
    if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
    const rpw = options.rowsPerWorkgroup ?? 4;
    if (!Number.isInteger(rpw) || rpw < 1 || rpw > 16) throw new InvalidArgumentError(`rowsPerWorkgroup must be an integer in 1..16, got ${rpw}`);
    const tokens = options.tokensPerChunk ?? 1;
    if (!Number.isInteger(tokens) || tokens < 1 || tokens > 8) throw new InvalidArgumentError(`tokensPerChunk must be an integer in 1..8, got ${tokens}`);
    const shared = tokens * wg * 144 + wg * rpw * tokens * 4; // staged x (36 floats a unit) + the reduction
    if (shared > device.info.limits.maxComputeSharedMemorySize) {
      throw new InvalidArgumentError(`${wg} threads x ${tokens} tokens a chunk need ${shared} B of shared memory (limit ${device.info.limits.maxComputeSharedMemorySize})`);
    }
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_GEMV_GGML, { 0: wg, 1: rpw, 2: sub ? 1 : 0, 3: FORMAT_ID[type], 4: tokens }, options);
    this.workgroupSize = wg;
    this.rowsPerWorkgroup = rpw;
    this.tokensPerChunk = tokens;
  }

  /** Records one dispatch of ceil(rows / rowsPerWorkgroup) workgroups (split over y past the x limit). The caller places barriers around it. */
  record(cb: CommandBuffer, a: GgmlGemvArgs): CommandBuffer {
    const m = a.matrix, S = a.S;
    if (m.type !== this.type) throw new InvalidArgumentError(`a ${m.type} matrix on a ${this.type} kernel`);
    if (!Number.isInteger(S) || S < 1 || S > GGML_GEMV_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${GGML_GEMV_MAX_S}, got ${S}`);
    const xOffset = a.xOffset ?? 0, yOffset = a.yOffset ?? 0;
    if (xOffset % 4 !== 0) throw new InvalidArgumentError(`xOffset must be a multiple of 4 floats (vec4 loads), got ${xOffset}`);
    checkRange("ggml gemv x", a.x, xOffset, S * m.cols);
    checkRange("ggml gemv y", a.y, yOffset, S * m.rows);
    const set = this.setFor([m.buffer, a.x, a.y]);
    const [gx, gy] = this.grid(Math.ceil(m.rows / this.rowsPerWorkgroup));
    const pc = pushWords([m.rows, m.cols, S, 0, xOffset, yOffset]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}
