/**
 * GEMV straight from GGML block tensors (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) on the GPU
 * (shaders/dec_gemv_ggml.comp, shaders/ggml_blocks.glsl): y[s, o] = Σ_i W[o, i] x[s, i] for S = 1..64
 * tokens, each weight formed exactly as GGML's dequantize_row_* forms it (float path, f32
 * accumulation). The matrix lives in a DeviceGgmlMatrix: the file's block bytes uploaded once, as
 * they are (no repack: the kernel reads 4.5..6.6 bits a weight, the file's own size).
 *
 * The integer-dot path (GgmlGemvIdpKernel, shaders/dec_gemv_ggml_idp.comp): x quantized once a call
 * by quantize_act in groups of 16 (int8, power-of-two scale, sum) into a GgmlIdpScratch, then the
 * blocks' quants dotted with it 4 x 8 bits at a time, the scales and mins applied in f32. Only where
 * the integer-dot decision (idp-policy.ts: VKMOE_IDP, blocklist, child-process probe) is on.
 */
import { InvalidArgumentError } from "../../errors.ts";
import { GGML_BLOCK_TYPES, type GgmlBlockTensor, type GgmlBlockType } from "../../quant/ggml-blocks.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { uploadBytes } from "../../vk/transfer.ts";
import { DEC_GEMV_GGML_IDP, QUANTIZE_ACT, type ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** blocks `uint[]` r, x r, y w; push O, I, S, blockOffset (bytes), xOffset, yOffset (floats): 24 B. */
export const DEC_GEMV_GGML: ShaderInterface = { name: "dec_gemv_ggml", storageBuffers: 3, pushConstantBytes: 24 };
export { DEC_GEMV_GGML_IDP };
export const GGML_GEMV_MAX_S = 64;
/** quantize_act's group for the integer-dot path: one group per 16-column run of a slice (ggml_blocks.glsl). */
export const GGML_IDP_GROUP = 16;

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
  /** Threads per workgroup, a power of two (default 32: one subgroup on NVIDIA, no shared-memory step). */
  workgroupSize?: number;
  /** Rows per workgroup (default 4). */
  rowsPerWorkgroup?: number;
  /** Tokens per register chunk, 1..8 (default 1, decode): each unit of weights is dequantized once per chunk. */
  tokensPerChunk?: number;
  /** Reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
  /**
   * Consecutive 32-weight slices a lane takes a step, 1 or 2. With 2 a K-quant lane reads 32
   * consecutive quant bytes of one sub-block pair and decodes its scales once for both slices.
   * Default: 2 for Q4_K / Q5_K on the integer-dot path, else 1 (KQUANT_PAIR_TYPES).
   */
  slicesPerLane?: number;
  /**
   * Float path only: d * Σ (q - off) x + m * Σ x per 16-column run instead of Σ w x over weights
   * formed first (default false). One f32 op a weight fewer; one-hot inputs still give GGML's weights
   * bit for bit, other inputs differ from Σ w x at the f32 rounding level (dec_gemv_ggml.comp).
   */
  factored?: boolean;
}

/**
 * Types whose integer-dot GEMV takes two slices a lane by default. H100, 2026-12-06, bench:gemv
 * --ggml --idp-alone, 4096->14336, S = 1, one slice / two a lane (of read bandwidth): Q4_K 81 / 88%,
 * Q5_K 77 / 88%; but Q6_K 85 / 77%, Q5_0 92 / 86%, and the float path lost on every type (Q4_K 58 / 44%).
 */
const KQUANT_PAIR_TYPES: readonly GgmlBlockType[] = ["Q4_K", "Q5_K"];

/** The checked kernel shape and specialization constants shared by both paths' shaders. */
function ggmlKernelShape(device: Device, type: GgmlBlockType, options: GgmlGemvKernelOptions, defaultSlicesPerLane = 1) {
  if (!GGML_BLOCK_TYPES.includes(type)) throw new InvalidArgumentError(`no GPU GEMV for GGML type ${String(type)}; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
  const wg = options.workgroupSize ?? 32;
  if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
  const rpw = options.rowsPerWorkgroup ?? 4;
  if (!Number.isInteger(rpw) || rpw < 1 || rpw > 16) throw new InvalidArgumentError(`rowsPerWorkgroup must be an integer in 1..16, got ${rpw}`);
  const tokens = options.tokensPerChunk ?? 1;
  if (!Number.isInteger(tokens) || tokens < 1 || tokens > 8) throw new InvalidArgumentError(`tokensPerChunk must be an integer in 1..8, got ${tokens}`);
  const shared = wg * rpw * tokens * 4; // the reduction
  if (shared > device.info.limits.maxComputeSharedMemorySize) {
    throw new InvalidArgumentError(`${wg} threads x ${rpw} rows x ${tokens} tokens a chunk need ${shared} B of shared memory (limit ${device.info.limits.maxComputeSharedMemorySize})`);
  }
  const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
  const spl = options.slicesPerLane ?? defaultSlicesPerLane;
  if (spl !== 1 && spl !== 2) throw new InvalidArgumentError(`slicesPerLane must be 1 or 2, got ${spl}`);
  return { workgroupSize: wg, rowsPerWorkgroup: rpw, tokensPerChunk: tokens, slicesPerLane: spl, specialization: { 0: wg, 1: rpw, 2: sub ? 1 : 0, 3: FORMAT_ID[type], 4: tokens } };
}

function checkGemvArgs(kernelType: GgmlBlockType, m: DeviceGgmlMatrix, S: number): void {
  if (m.type !== kernelType) throw new InvalidArgumentError(`a ${m.type} matrix on a ${kernelType} kernel`);
  if (!Number.isInteger(S) || S < 1 || S > GGML_GEMV_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${GGML_GEMV_MAX_S}, got ${S}`);
}

/** One pipeline per GGML type: make one object per type. */
export class GgmlGemvKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly rowsPerWorkgroup: number;
  readonly tokensPerChunk: number;
  readonly slicesPerLane: number;
  readonly factored: boolean;

  constructor(device: Device, readonly type: GgmlBlockType, options: GgmlGemvKernelOptions = {}) {
    const shape = ggmlKernelShape(device, type, options);
    super(device, DEC_GEMV_GGML, { ...shape.specialization, 5: options.factored ? 1 : 0, 6: shape.slicesPerLane }, options);
    this.factored = options.factored ?? false;
    this.slicesPerLane = shape.slicesPerLane;
    this.workgroupSize = shape.workgroupSize;
    this.rowsPerWorkgroup = shape.rowsPerWorkgroup;
    this.tokensPerChunk = shape.tokensPerChunk;
  }

  /** Records one dispatch of ceil(rows / rowsPerWorkgroup) workgroups (split over y past the x limit). The caller places barriers around it. */
  record(cb: CommandBuffer, a: GgmlGemvArgs): CommandBuffer {
    const m = a.matrix, S = a.S;
    checkGemvArgs(this.type, m, S);
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

/** Rows quantized as quantize_act writes them for the integer-dot kernels: xq int8, f32 scales and int sums per 16 columns. */
export interface QuantizedRows {
  readonly xq: Buffer;
  readonly xscale: Buffer;
  readonly xsum: Buffer;
}

/** Device buffers for `values` activations quantized in groups of GGML_IDP_GROUP: int8 xq, f32 scales and int sums per group. */
export class QuantizedRowsBuffers implements Disposable, QuantizedRows {
  readonly xq: Buffer;
  readonly xscale: Buffer;
  readonly xsum: Buffer;

  constructor(device: Device, readonly values: number) {
    const groups = Math.ceil(values / GGML_IDP_GROUP);
    const made: Buffer[] = [];
    try {
      for (const bytes of [values, 4 * groups, 4 * groups]) made.push(new Buffer(device, { size: BigInt(Math.max(16, bytes)), memory: "device" }));
    } catch (e) {
      for (const b of made) b[Symbol.dispose]();
      throw e;
    }
    [this.xq, this.xscale, this.xsum] = made as [Buffer, Buffer, Buffer];
  }

  [Symbol.dispose](): void {
    this.xq[Symbol.dispose]();
    this.xscale[Symbol.dispose]();
    this.xsum[Symbol.dispose]();
  }
}

/** The integer-dot path's quantized x: xq int8 [S][cols], f32 scales and int sums [S][cols / 16], for up to maxTokens tokens. */
export class GgmlIdpScratch extends QuantizedRowsBuffers {
  constructor(device: Device, readonly cols: number, readonly maxTokens: number) {
    if (!Number.isInteger(cols) || cols < 32 || cols % 32 !== 0) throw new InvalidArgumentError(`cols must be a positive multiple of 32, got ${cols}`);
    if (!Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > GGML_GEMV_MAX_S) throw new InvalidArgumentError(`maxTokens must be an integer in 1..${GGML_GEMV_MAX_S}, got ${maxTokens}`);
    super(device, maxTokens * cols);
  }
}

/** quantize_act with groups of 16 columns (GGML_IDP_GROUP), 128 threads a workgroup. */
export class GgmlQuantizeKernel extends DecoderKernel {
  static readonly WG = 128;
  constructor(device: Device, options: DecoderKernelOptions = {}) {
    super(device, QUANTIZE_ACT, { 0: GgmlQuantizeKernel.WG, 4: GGML_IDP_GROUP }, options);
  }

  /** Quantizes S rows of `cols` floats of x from xOffset into s (rows of cols bytes, scales and sums of cols / 16). */
  record(cb: CommandBuffer, x: Buffer, xOffset: number, s: QuantizedRows, cols: number, S: number): CommandBuffer {
    const groupsPerRow = cols / GGML_IDP_GROUP;
    if (!Number.isInteger(groupsPerRow) || groupsPerRow < 1) throw new InvalidArgumentError(`cols must be a positive multiple of ${GGML_IDP_GROUP}, got ${cols}`);
    checkRange("quantize x", x, xOffset, S * cols);
    checkRange("quantize xq", s.xq, 0, (S * cols) / 4);
    checkRange("quantize xscale", s.xscale, 0, S * groupsPerRow);
    checkRange("quantize xsum", s.xsum, 0, S * groupsPerRow);
    const set = this.setFor([x, s.xq, s.xscale, s.xsum]);
    // one thread per xq word: S * groupsPerRow * (16 / 4)
    const [gx, gy] = this.grid(Math.ceil((S * groupsPerRow * (GGML_IDP_GROUP / 4)) / GgmlQuantizeKernel.WG));
    const pc = pushWords([cols, S, groupsPerRow, xOffset, cols / 4]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }
}

export interface GgmlGemvIdpArgs extends GgmlGemvArgs {
  /** Where x is quantized: cols equal to the matrix's, maxTokens at least S. */
  scratch: GgmlIdpScratch;
}

/**
 * The integer-dot GEMV of one GGML type (make one object per type): record() quantizes x into the
 * scratch, places a compute barrier, then runs dec_gemv_ggml_idp. The device must have
 * shaderIntegerDotProduct enabled, and the caller must have the integer-dot decision on (the
 * pipeline is created only then: some drivers crash creating it, idp-policy.ts).
 */
export class GgmlGemvIdpKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly rowsPerWorkgroup: number;
  readonly tokensPerChunk: number;
  readonly slicesPerLane: number;
  private readonly quantize: GgmlQuantizeKernel;

  constructor(device: Device, readonly type: GgmlBlockType, options: GgmlGemvKernelOptions = {}) {
    if (!device.enabled.integerDotProduct) throw new InvalidArgumentError(`the integer-dot GGML GEMV needs shaderIntegerDotProduct, not enabled on ${device.info.name}`);
    const shape = ggmlKernelShape(device, type, options, KQUANT_PAIR_TYPES.includes(type) ? 2 : 1);
    super(device, DEC_GEMV_GGML_IDP, { ...shape.specialization, 5: shape.slicesPerLane }, options);
    this.workgroupSize = shape.workgroupSize;
    this.rowsPerWorkgroup = shape.rowsPerWorkgroup;
    this.tokensPerChunk = shape.tokensPerChunk;
    this.slicesPerLane = shape.slicesPerLane;
    try {
      this.quantize = new GgmlQuantizeKernel(device, options);
    } catch (e) {
      super[Symbol.dispose]();
      throw e;
    }
  }

  /** Records quantize, a compute-to-compute barrier, and the GEMV. The caller places barriers around the whole. */
  record(cb: CommandBuffer, a: GgmlGemvIdpArgs): CommandBuffer {
    this.recordQuantize(cb, a).barrier("computeToCompute");
    return this.recordQuantized(cb, a);
  }

  /** Records x's quantization into the scratch alone, for a recordQuantized behind a barrier the caller places. */
  recordQuantize(cb: CommandBuffer, a: Omit<GgmlGemvIdpArgs, "y" | "yOffset">): CommandBuffer {
    const m = a.matrix, xOffset = a.xOffset ?? 0;
    this.checkArgs(a);
    checkRange("ggml idp gemv x", a.x, xOffset, a.S * m.cols);
    return this.quantize.record(cb, a.x, xOffset, a.scratch, m.cols, a.S);
  }

  /**
   * Records the GEMV alone, over x as the scratch already holds it quantized (by another matrix's
   * record of the same x, or by RmsNormQuantKernel); `a.x` is not read. The caller places the
   * barrier after whatever wrote the scratch.
   */
  recordQuantized(cb: CommandBuffer, a: Omit<GgmlGemvIdpArgs, "x" | "xOffset">): CommandBuffer {
    const m = a.matrix, S = a.S, sc = a.scratch;
    this.checkArgs(a);
    const yOffset = a.yOffset ?? 0;
    checkRange("ggml idp gemv y", a.y, yOffset, S * m.rows);
    const set = this.setFor([m.buffer, sc.xq, sc.xscale, sc.xsum, a.y]);
    const [gx, gy] = this.grid(Math.ceil(m.rows / this.rowsPerWorkgroup));
    const pc = pushWords([m.rows, m.cols, S, 0, yOffset]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(gx, gy);
  }

  private checkArgs(a: Pick<GgmlGemvIdpArgs, "matrix" | "S" | "scratch">): void {
    const m = a.matrix, S = a.S, sc = a.scratch;
    checkGemvArgs(this.type, m, S);
    if (sc.cols !== m.cols || sc.maxTokens < S) throw new InvalidArgumentError(`a scratch of ${sc.maxTokens} tokens x ${sc.cols} columns for ${S} tokens x ${m.cols}`);
  }

  override [Symbol.dispose](): void {
    this.quantize[Symbol.dispose]();
    super[Symbol.dispose]();
  }
}
