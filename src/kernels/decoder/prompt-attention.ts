/**
 * Host side of dec_attention_cm (shaders/dec_attention_cm.glsl): the attention of a prompt chunk of
 * one sequence on the matrix cores, in one dispatch however long the chunk: a workgroup per (block
 * of `rows` query rows, KV head) walks every key its tokens see, the scores and the values as f16
 * matrix products with f32 sums. No partial records and no combine pass; out [S][heads][headDim] f32
 * directly, times sigmoid(gate) on a binding with a gate buffer. Layouts and the context rule are
 * DecoderAttention's (token t sees n + t positions, n plus positions[posIndex] on a binding with a
 * positions buffer, capped at maxPositions - (S - 1)).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import { DescriptorPool } from "../../vk/descriptors.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import { ComputePipeline } from "../../vk/pipeline.ts";
import { shaderFile, type ShaderInterface } from "../shaders.ts";
import { matrixCoreShader } from "./quant-gemm.ts";

/** q, keys, values, out, positions, gate; push n, S, heads, kvHeads, kOffset, vOffset (uvec4), qOffset, outOffset, gateOffset (vec4), scale (f32), posIndex, flags, limit: 52 B. */
export const DEC_ATTENTION_CM: ShaderInterface = { name: "dec_attention_cm", storageBuffers: 6, pushConstantBytes: 52 };
/** Its test variant: the same tiles with plain sums in place of the matrix products. */
export const DEC_ATTENTION_CM_EMU: ShaderInterface = { ...DEC_ATTENTION_CM, name: "dec_attention_cm_emu" };

/** The kernel's tile for a head size: query rows and keys a step, and its shared memory (bytes). */
export interface PromptAttentionShape {
  rows: number;
  keys: number;
  sharedBytes: number;
}

/** Query rows a workgroup, most preferred first (keys a tile: 32). */
export const PROMPT_ATTENTION_ROWS = [64, 32, 16] as const;
const PROMPT_ATTENTION_KEYS = 32;

/** dec_attention_cm's tile of `rows` query rows: Q, the K/V tile and S, or the O tile after the walk, and the rows' scales. */
export function promptAttentionShape(headDim: number, rows: number): PromptAttentionShape {
  const keys = PROMPT_ATTENTION_KEYS;
  const q = (rows * (headDim + 8)) / 8, kv = (keys * (headDim + 8)) / 8, s = (rows * (keys + 4)) / 4, o = (rows * (headDim + 4)) / 4;
  return { rows, keys, sharedBytes: 16 * Math.max(q + kv + s, o) + 4 * rows };
}

/**
 * The most rows a workgroup whose tile fits the device's shared memory (64 up to head_dim 128 and 32
 * at 256 in NVIDIA's 48 KB) and whose softmax threads of a row (128 / rows of them, joined by subgroup
 * shuffles) fit its smallest subgroup; undefined: none does.
 */
export function promptAttentionShapeFor(device: Device, headDim: number): PromptAttentionShape | undefined {
  const { limits, subgroup } = device.info;
  if (limits.maxComputeWorkGroupInvocations < 128 || !subgroup.shuffle) return undefined;
  return PROMPT_ATTENTION_ROWS.map((r) => promptAttentionShape(headDim, r)).find((s) => s.sharedBytes <= limits.maxComputeSharedMemorySize && 128 / s.rows <= subgroup.minSize);
}

export interface PromptAttentionOptions {
  heads: number;
  kvHeads: number;
  /** 32, 64, 128 or 256. */
  headDim: number;
  /** true: the device's cooperative matrices; "emulated" (tests): plain sums over the same tiles. */
  matrixCores: true | "emulated";
  /** Descriptor sets `bind` may allocate (default 8). */
  maxBindings?: number;
  /** Query rows a workgroup, one of PROMPT_ATTENTION_ROWS (tests; default: the most that fit). */
  rows?: number;
}

export interface PromptAttentionBuffers {
  q: Buffer;
  keys: Buffer;
  values: Buffer;
  out: Buffer;
  /** u32 words: every call adds positions[posIndex] to its n (and must give maxPositions). */
  positions?: Buffer;
  /** f32 laid out as out: every call writes out * sigmoid(gate). */
  gate?: Buffer;
}

export interface PromptAttentionBinding {
  readonly set: bigint;
  /** What the set binds (a call's reach is checked against their sizes). */
  readonly buffers: Readonly<PromptAttentionBuffers>;
}

export interface PromptAttentionCall {
  /** Positions seen by the first query token (its own included); the base added to positions[posIndex] on a binding with a positions buffer. */
  n: number;
  S: number;
  /** Positions the last token may see at most (the cache's rows): n is capped at maxPositions - (S - 1). */
  maxPositions: number;
  posIndex?: number;
  /** Halves, a multiple of 8: the layer's first key and value (default 0). */
  cacheOffset?: number;
  /** Floats, multiples of 4 (default 0). */
  qOffset?: number;
  outOffset?: number;
  gateOffset?: number;
}

export class PromptAttentionKernel implements Disposable {
  readonly group: number;
  readonly shape: PromptAttentionShape;
  private readonly pipeline: ComputePipeline;
  private readonly pool: DescriptorPool;
  private readonly pc = new DataView(new ArrayBuffer(DEC_ATTENTION_CM.pushConstantBytes));

  constructor(readonly device: Device, readonly options: PromptAttentionOptions) {
    const { heads, kvHeads, headDim } = options;
    if (![32, 64, 128, 256].includes(headDim)) throw new InvalidArgumentError(`headDim must be 32, 64, 128 or 256, got ${headDim}`);
    if (!Number.isInteger(kvHeads) || kvHeads < 1 || !Number.isInteger(heads) || heads % kvHeads !== 0) throw new InvalidArgumentError(`heads (${heads}) must be a positive multiple of kvHeads (${kvHeads})`);
    this.group = heads / kvHeads;
    if (![1, 2, 4, 8].includes(this.group)) throw new InvalidArgumentError(`heads / kvHeads must be 1, 2, 4 or 8, got ${this.group}`);
    const rows = options.rows;
    if (rows !== undefined && (!(PROMPT_ATTENTION_ROWS as readonly number[]).includes(rows) || rows < this.group)) throw new InvalidArgumentError(`rows must be one of ${PROMPT_ATTENTION_ROWS.join(", ")} and at least heads / kvHeads, got ${rows}`);
    const shape = rows !== undefined ? promptAttentionShape(headDim, rows) : promptAttentionShapeFor(device, headDim);
    const limit = device.info.limits.maxComputeSharedMemorySize;
    if (!shape || shape.sharedBytes > limit || device.info.limits.maxComputeWorkGroupInvocations < 128) {
      throw new InvalidArgumentError(`dec_attention_cm does not fit ${device.info.name} for head_dim ${headDim}${rows ? ` at ${rows} rows` : ""} (128 threads, ${promptAttentionShape(headDim, rows ?? 16).sharedBytes} B of shared memory; limit ${limit} B)`);
    }
    const { shuffle, minSize } = device.info.subgroup;
    if (!shuffle || 128 / shape.rows > minSize) throw new InvalidArgumentError(`dec_attention_cm at ${shape.rows} rows joins ${128 / shape.rows} threads a row by subgroup shuffles: ${device.info.name} has ${shuffle ? `subgroups of ${minSize}` : "no subgroup shuffles"}`);
    this.shape = shape;
    const shader = matrixCoreShader(device, { cm: DEC_ATTENTION_CM, emulated: DEC_ATTENTION_CM_EMU }, options.matrixCores);
    this.pipeline = new ComputePipeline(device, {
      spirv: shaderFile(shader.name), storageBuffers: shader.storageBuffers, pushConstantBytes: shader.pushConstantBytes,
      specialization: { 0: headDim, 1: this.shape.rows, 2: this.shape.keys },
    });
    const maxBindings = options.maxBindings ?? 8;
    this.pool = new DescriptorPool(device, maxBindings, DEC_ATTENTION_CM.storageBuffers * maxBindings);
  }

  /** A descriptor set for these buffers (reuse it for every call on them). */
  bind(b: PromptAttentionBuffers): PromptAttentionBinding {
    // q stands in for a missing positions or gate buffer (never read: its flag is clear)
    const set = this.pool.allocate(this.pipeline, [{ buffer: b.q }, { buffer: b.keys }, { buffer: b.values }, { buffer: b.out }, { buffer: b.positions ?? b.q }, { buffer: b.gate ?? b.q }]);
    return { set, buffers: { ...b } };
  }

  /** Records the call's one dispatch; the caller orders the q and cache writes before it and the reads of out after. */
  record(cb: CommandBuffer, binding: PromptAttentionBinding, call: PromptAttentionCall): void {
    const { n, S, maxPositions } = call;
    const posIndex = call.posIndex ?? 0, cacheOffset = call.cacheOffset ?? 0;
    const qOffset = call.qOffset ?? 0, outOffset = call.outOffset ?? 0, gateOffset = call.gateOffset ?? 0;
    const { heads, kvHeads, headDim } = this.options;
    if (!Number.isInteger(S) || S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${S}`);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`n must be a positive integer, got ${n}`);
    if (!Number.isInteger(maxPositions) || maxPositions < n + S - 1 || maxPositions > 0xffffffff) throw new InvalidArgumentError(`maxPositions ${maxPositions} must be an integer in n + S - 1 (${n + S - 1})..2^32-1`);
    const b = binding.buffers;
    if (b.positions) {
      if (!Number.isInteger(posIndex) || posIndex < 0 || BigInt(4 * (posIndex + 1)) > b.positions.size) throw new InvalidArgumentError(`posIndex ${posIndex} is outside the positions buffer (${b.positions.size} B)`);
    } else if (call.posIndex !== undefined) {
      throw new InvalidArgumentError("posIndex needs a binding with a positions buffer");
    }
    if (!Number.isInteger(cacheOffset) || cacheOffset < 0 || cacheOffset % 8 !== 0) throw new InvalidArgumentError(`cacheOffset must be a non-negative multiple of 8 halves, got ${cacheOffset}`);
    for (const [name, v] of [["qOffset", qOffset], ["outOffset", outOffset], ["gateOffset", gateOffset]] as const) {
      if (!Number.isInteger(v) || v < 0 || v % 4 !== 0) throw new InvalidArgumentError(`${name} must be a non-negative multiple of 4 floats, got ${v}`);
    }
    if (call.gateOffset !== undefined && !b.gate) throw new InvalidArgumentError("gateOffset needs a binding with a gate buffer");
    // what the call reads and writes, against the bound buffers (bytes)
    const rows = S * heads * headDim, cache = 2 * (cacheOffset + maxPositions * kvHeads * headDim);
    for (const [name, buffer, bytes] of [
      ["q", b.q, 4 * (qOffset + rows)], ["out", b.out, 4 * (outOffset + rows)], ["keys", b.keys, cache], ["values", b.values, cache],
      ...(b.gate ? [["gate", b.gate, 4 * (gateOffset + rows)] as const] : []),
    ] as const) {
      if (BigInt(bytes) > buffer.size) throw new InvalidArgumentError(`the ${name} buffer (${buffer.size} B) is shorter than the ${bytes} B the call reaches`);
    }
    const tokens = this.shape.rows / this.group;
    const groups = Math.ceil(S / tokens);
    if (groups > this.device.info.limits.maxComputeWorkGroupCount[0]!) throw new InvalidArgumentError(`${S} tokens need ${groups} workgroups, past maxComputeWorkGroupCount[0]`);
    const pc = this.pc;
    const flags = (b.positions ? 1 : 0) | (b.gate ? 2 : 0);
    [n, S, heads, kvHeads, cacheOffset / 8, cacheOffset / 8, qOffset / 4, outOffset / 4, gateOffset / 4].forEach((w, i) => pc.setUint32(4 * i, w, true));
    pc.setFloat32(36, 1 / Math.sqrt(headDim), true);
    [posIndex, flags, maxPositions].forEach((w, i) => pc.setUint32(40 + 4 * i, w, true));
    cb.bind(this.pipeline, binding.set).pushConstants(this.pipeline, new Uint8Array(pc.buffer)).dispatch(groups, kvHeads, 1);
  }

  [Symbol.dispose](): void {
    this.pool[Symbol.dispose]();
    this.pipeline[Symbol.dispose]();
  }
}
