/**
 * Host side of the decode attention kernel (shaders/dec_attention.comp + dec_attention_combine.comp):
 * S = 1..64 query tokens at the end of a context, over an f16 KV cache, split over the sequence
 * (flash-decoding). Pass 1 runs one workgroup per (span of positions, KV head, token group) for
 * all the query heads of that KV head (each K/V row of the span read once for all of them) and
 * writes per-(token, head, span) partials (max, sum of exp, weighted value sum); pass 2 merges
 * them with the log-sum-exp rule into out [S][heads][headDim] f32. Decode (S <= 4) spans one chunk
 * of `chunk` positions, so the work spreads over the sequence; a prompt chunk of more tokens
 * spans several chunks (walked with the online-softmax rule), so its partials stay at most
 * PREFILL_SPANS records per row however long the context.
 *
 * Decode calls (S <= DECODE_ATTENTION_TOKENS, spans of one chunk) run pass 1 as
 * dec_attention_decode instead where the device allows it (`decodeKernel`): one token per
 * workgroup, the chunk's scores spread over LANES threads per position and its values over one
 * thread per (row, 8 dims), one barrier; its grid along x is capped at `maxDecodeGroups` (each
 * workgroup walks chunks x, x + grid, ...), so a long cache's surplus workgroups stay few. Same
 * partial records, same combine.
 *
 * Prompt chunks of one sequence (S > DECODE_ATTENTION_TOKENS, not batched) run pass 1 as
 * dec_attention_prefill instead where it fits the device (`prefillKernel`): flash-attention
 * style, one workgroup per (span, KV head, block of tokens) for up to `PrefillShape.rows` query
 * rows (32 by default: 4 tokens at GQA 8, against the general pass 1's 16), each K and V tile
 * loaded into shared memory once for all of them, register tiles for the scores and the values.
 * Same spans (so the same partials and numChunks), same records, same combine.
 *
 * RoPE fold (`ropeFold`, decode calls of one sequence): dec_attention_decode with ROPE_FOLD does
 * dec_rope_kv's work itself (the q/k head norms, RoPE, the f16 KV append of the new positions), so
 * a decode token's layer runs GEMVs → attention with no rope step and barrier between: the binding
 * gains the raw k and v (the GEMVs' outputs), the inverse frequencies and the norm weights
 * (`AttentionBuffers.fold`), and a call with `rope` reads q raw (not rotated in place: q and k are
 * left as the GEMVs wrote them) and writes the new k/v rows to the cache as dec_rope_kv does, bit
 * for bit (token t at position n - 1 + t (+ the positions word): dec_rope_kv's pos0 = n - 1). Prompt
 * chunks and batched calls keep the separate step.
 *
 * Output gate (Qwen3.5): a binding made with a `gate` buffer (laid out as out, at the call's
 * gateOffset) has the combine write out * sigmoid(gate), as GatingKernel's "sigmoid-gate" computes
 * it, so the gate needs no dispatch and barrier of its own.
 *
 * The combine is a second dispatch: deterministic, no counter to zero between calls, no coherent
 * reads of other workgroups' partials. With `combineTail` the decode kernel's calls do it instead
 * in the last pass-1 workgroup of each (KV head, token) to finish (an arrival counter it zeroes
 * again; the records written and read coherent, behind fences): one dispatch and one dependent
 * step fewer a decode call, its sums merged online (equal to the combine's to rounding).
 *
 * Layouts: q [S][heads][headDim] f32 (qOffset floats, a multiple of 4); keys and values
 * [ctx][kvHeads][headDim] IEEE halves per layer, one buffer each, the layer's first element at
 * `cacheOffset` halves (a multiple of 8; `layerOffset()`); out [S][heads][headDim] f32 at
 * outOffset floats. Partials: record (token t, head h, span c) at ((t*heads + h)*spans + c)
 * * (headDim + 4) floats: headDim weighted-value floats, m, l, 2 pad.
 *
 * Replay at any position: a binding made with a `positions` buffer (u32 words) reads the context
 * length on the GPU: token 0 sees n + positions[posIndex] positions (n from the call, the base),
 * so one recording with the grid sized for `maxPositions` serves every position the host writes
 * into the word between submits (decode: S = 1, n = 1, positions[0] = p). Both passes cap that n
 * at maxPositions - (S - 1), so a stale or out-of-range word never reads past the cache, the grid
 * or the partials. Without a positions buffer another of the binding's buffers (q) is bound in
 * its place and the flag is clear.
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import { DescriptorPool } from "../../vk/descriptors.ts";
import type { Device } from "../../vk/device.ts";
import { Buffer } from "../../vk/memory.ts";
import { uploadBytes } from "../../vk/transfer.ts";
import { ComputePipeline } from "../../vk/pipeline.ts";
import { shaderFile } from "../shaders.ts";
import { PromptAttentionKernel, promptAttentionShapeFor, type PromptAttentionBinding } from "./prompt-attention.ts";
import { promptAttentionPasses } from "./prompt-attention-check.ts";
import type { QuantizedRows } from "./rmsnorm.ts";
import { BATCH_WORDS, ROPE_MAX_POSITION } from "./rope-kv.ts";

/**
 * Pass 1: q, keys, values, partials, positions; push n, S, heads, kvHeads, kOffset (uvec4), vOffset
 * (uint), qOffset (vec4), numChunks, tokensPerGroup, scale (f32), posIndex, flags (bit 0: n +=
 * positions[posIndex]), limit (n capped at limit - (S - 1)), iters (chunks per span): 56 B.
 */
export const DEC_ATTENTION = { name: "dec_attention", storageBuffers: 5, pushConstantBytes: 56 } as const;
/**
 * Decode's pass 1 (one token per workgroup, spans of one chunk): pass 1's buffers and push constants,
 * then (ROPE_FOLD; pushed as zeros otherwise) kRawOffset, vRawOffset, invOffset, qNormOffset,
 * kNormOffset (floats), eps (f32), rotaryDim, foldFlags (bit 0 head norm): 88 B. Bindings 5..10 (read
 * with ROPE_FOLD only, any buffer otherwise; declared in both variants' layout, which the validation
 * layer checks against the shader's declarations): raw k, raw v, inverse frequencies, norm weights,
 * and the key / value caches again (written). Then (COMBINE_TAIL; any buffer and zeros otherwise)
 * bindings 11..16: the arrival counters, out, the gate, out quantized (xq, xscale, xsum); push
 * outOffset, gateOffset (floats), tailFlags (bit 0 the output gate, bit 1 quantized): 100 B.
 */
export const DEC_ATTENTION_DECODE = { name: "dec_attention_decode", storageBuffers: 17, pushConstantBytes: 100 } as const;
/** Prompt chunks' pass 1 (tiled, a block of tokens per workgroup): pass 1's buffers and push constants. */
export const DEC_ATTENTION_PREFILL = { name: "dec_attention_prefill", storageBuffers: 5, pushConstantBytes: 56 } as const;
/**
 * Pass 2: partials, out, positions, gate; push n, S, heads, numChunks, outOffset (floats), posIndex,
 * flags (pass 1's, bit 2: the output gate), limit (as pass 1), span, gateOffset (floats): 40 B.
 */
export const DEC_ATTENTION_COMBINE = { name: "dec_attention_combine", storageBuffers: 7, pushConstantBytes: 40 } as const;

export const MAX_ATTENTION_TOKENS = 64;
/** Calls of at most this many tokens span one chunk per workgroup (decode: parallel over the sequence). */
export const DECODE_ATTENTION_TOKENS = 4;
/** Partial records per row at most for calls of more tokens (a prompt chunk): longer spans instead. */
export const PREFILL_SPANS = 16;
/**
 * Query rows (tokens x heads per KV head) one pass-1 workgroup serves at most: its registers.
 * Prompt chunks take fewer (their workgroups walk several chunks, and there are enough of them).
 */
const MAX_GROUP_ROWS = 32;
/** Partial records per row the combine pass merges at most. */
const MAX_COMBINE_RECORDS = 4096;
/** Decode pass-1 workgroups along x at most by default (each walks every grid-th chunk). */
export const DEFAULT_DECODE_GROUPS = 128;
const MAX_PREFILL_GROUP_ROWS = 16;
export const ATTENTION_HEAD_DIMS = [32, 64, 128, 256] as const;
export const ATTENTION_GQA = [1, 2, 4, 8] as const;
/** dec_attention_prefill's query rows a workgroup and keys a tile by default (each halved where shared memory is short). */
export const DEFAULT_PREFILL_ROWS = 32;
export const DEFAULT_PREFILL_TILE = 32;
/** dec_attention_prefill's threads before the value tiles ask for more (at most 16 vec4 of accumulators a thread). */
const PREFILL_THREADS = 128;
const MAX_PREFILL_VALUE_QUADS = 16;
/** ROPE_FOLD normalises each head over this many threads, as dec_rope_kv's default workgroup (RopeKvKernel), for the same sums. */
const ROPE_FOLD_THREADS = 64;

/**
 * dec_attention_prefill's shape for one rows count: rows (tokens x heads per KV head) and keys
 * per tile, the K/V tiles' type in shared memory, its threads and their register tiles (scores:
 * ra rows x ka keys; values: rc rows x qc quads of dims).
 */
export interface PrefillShape {
  rows: number;
  tile: number;
  halfTiles: boolean;
  workgroupSize: number;
  ra: number;
  ka: number;
  rc: number;
  qc: number;
  /** Shared memory it takes (bytes). */
  sharedBytes: number;
}

/** What a caller may ask of dec_attention_prefill's shape (upper bounds on rows and tile; the tiles' type forced). */
export interface PrefillShapeOptions {
  /** Query rows a workgroup at most: a power of two (default DEFAULT_PREFILL_ROWS). */
  rows?: number;
  /** Keys a tile at most: a power of two >= 8 (default DEFAULT_PREFILL_TILE). */
  tile?: number;
  /** K/V tiles as halves in shared memory (default: floats where they fit, else halves). */
  halfTiles?: boolean;
  /** Threads a workgroup at most: a power of two (default 128, doubled while a thread's value tile passes 16 vec4). */
  workgroupSize?: number;
}

export interface DecoderAttentionOptions {
  heads: number;
  kvHeads: number;
  /** 64, 128 or 256. */
  headDim: number;
  /** Positions per pass-1 workgroup (default 64). */
  chunk?: number;
  /** Threads per workgroup of both passes: a power of two (default 64). */
  workgroupSize?: number;
  /** Descriptor-set pairs `bind` may allocate (default 8). */
  maxBindings?: number;
  /** Unroll pass 1's K and V loops (default on GPUs; a CPU device compiles them too slowly). */
  unroll?: boolean;
  /** Decode calls (S <= DECODE_ATTENTION_TOKENS) through dec_attention_decode (default true where the device allows it). */
  decodeKernel?: boolean;
  /** dec_attention_decode's grid along x at most (default DEFAULT_DECODE_GROUPS): longer contexts loop. */
  maxDecodeGroups?: number;
  /** Prompt chunks (S > DECODE_ATTENTION_TOKENS, not batched) through dec_attention_prefill (default true where it fits the device). */
  prefillKernel?: boolean;
  /** dec_attention_prefill's rows, tile and tile type (benchmarks and tests; the defaults otherwise). */
  prefillShape?: PrefillShapeOptions;
  /** Build dec_attention_decode's ROPE_FOLD variant where the decode kernel runs (default false; see `ropeFold`). */
  ropeFold?: boolean;
  /**
   * Decode calls merge the partial records in the last pass-1 workgroup of each (KV head, token)
   * (dec_attention_decode's COMBINE_TAIL: one dispatch and one barrier fewer a call) where the
   * decode kernel runs and its shared memory allows (default false; see `combineTail`).
   */
  combineTail?: boolean;
  /**
   * The fold's head norm sums with subgroupAdd first, as a RopeKvKernel made with the same
   * `useSubgroup` (default: where the device has subgroup arithmetic and subgroups of at most 64).
   */
  ropeFoldSubgroup?: boolean;
  /**
   * Prompt chunks of one sequence of at least `fromTokens` tokens (> DECODE_ATTENTION_TOKENS) run
   * dec_attention_cm (PromptAttentionKernel: one dispatch on the matrix cores, or its emulation for
   * tests) where its tile fits the device (`promptOnMatrixCores`); default: none do.
   */
  promptMatrixCores?: { variant: true | "emulated"; fromTokens: number };
}

/** The buffers a binding adds for calls with `rope` (the folded head norms, RoPE and KV append). */
export interface AttentionFoldBuffers {
  /** [S][kvHeads][headDim] f32: k as the GEMV wrote it (not normalised, not rotated). */
  k: Buffer;
  /** [S][kvHeads][headDim] f32. */
  v: Buffer;
  /** rotaryDim / 2 f32 inverse frequencies (ops.ts ropeInverseFrequencies). */
  invFreq: Buffer;
  /** The head norms' weights (calls with `rope.norm`; default: none). */
  normWeights?: Buffer;
}

/** A call's folded RoPE (dec_rope_kv's arguments that the attention call does not already give). */
export interface AttentionRope {
  /** Floats: raw k and v in the binding's fold buffers (default 0). */
  kOffset?: number;
  vOffset?: number;
  /** Floats (default 0). */
  invOffset?: number;
  /** Dims of each head that rotate (a multiple of 4, default headDim): Qwen3.5's partial rotary. */
  rotaryDim?: number;
  /** Each q and k head RMS-normalised first, as dec_rope_kv's `norm` (weights in the fold's normWeights). */
  norm?: { qOffset: number; kOffset: number; eps: number };
}

/** The buffers of one binding; see the module comment for layouts. */
export interface AttentionBuffers {
  q: Buffer;
  keys: Buffer;
  values: Buffer;
  /** At least `partialBytes(maxPositions, S)` bytes. */
  partials: Buffer;
  out: Buffer;
  /**
   * u32 words; when given, every call on this binding adds positions[posIndex] (read on the GPU
   * when the command buffer runs) to its n, and must give maxPositions.
   */
  positions?: Buffer;
  /** f32, laid out as out at the call's gateOffset; when given, every call writes out * sigmoid(gate). */
  gate?: Buffer;
  /** Where a call with `quantize` also writes out quantized for the integer-dot GGML GEMV (cols = heads x head_dim). */
  quantized?: QuantizedRows;
  /** The folded RoPE's buffers (calls with `rope`; needs a DecoderAttention made with `ropeFold`). */
  fold?: AttentionFoldBuffers;
}

/** Descriptor sets of both passes for one set of buffers (from `bind`). */
export interface AttentionBinding {
  readonly split: bigint;
  readonly combine: bigint;
  readonly partials: Buffer;
  /** The positions buffer of `AttentionBuffers`, if any. */
  readonly positions?: Buffer;
  /** The gate buffer of `AttentionBuffers`, if any. */
  readonly gate?: Buffer;
  /** The quantized rows of `AttentionBuffers`, if any. */
  readonly quantized?: QuantizedRows;
  /** dec_attention_decode's set (both variants: 11 bindings, the fold's buffers or stand-ins); 0n without the decode kernel. */
  readonly decode: bigint;
  /** Whether the binding was made with fold buffers (calls may take `rope`). */
  readonly fold: boolean;
  /** dec_attention_cm's set (a DecoderAttention made with promptMatrixCores where its tile fits). */
  readonly prompt?: PromptAttentionBinding;
}

export interface AttentionCall {
  /**
   * Positions seen by the first query token (its own included): token t sees n + t. On a binding
   * with a positions buffer this is the base: token 0 sees n + positions[posIndex] (capped at
   * maxPositions - (S - 1)).
   */
  n: number;
  /** The word of the binding's positions buffer added to n (default 0); only with a positions buffer. */
  posIndex?: number;
  /** Query tokens, 1..MAX_ATTENTION_TOKENS. */
  S: number;
  /** The layer's first key/value element, in halves (a multiple of 8); default 0. */
  cacheOffset?: number;
  /** Floats; a multiple of 4; default 0. */
  qOffset?: number;
  /** Floats; default 0. */
  outOffset?: number;
  /**
   * Tokens of different sequences sharing the binding's cache (one decode step of each): token t
   * sees positions[posIndex + t] + 1 positions (capped at maxPositions, each sequence's length)
   * of its own sequence, whose rows start at positions[posIndex + BATCH_WORDS + t] -
   * positions[posIndex + t]. Needs a positions buffer; n is then ignored.
   */
  batched?: boolean;
  /**
   * Size the grid (and the partials stride) for this many positions instead of n + S - 1: surplus
   * workgroups exit at once. Default n + S - 1; required on a binding with a positions buffer
   * (the grid cannot be sized from a word the GPU reads), where it is also the most positions the
   * last token sees (the keys/values must hold that many).
   */
  maxPositions?: number;
  /** Floats: the gate of a binding with a gate buffer, laid out as out (default 0). */
  gateOffset?: number;
  /** Also write out quantized into the binding's `quantized` rows (outOffset 0, S <= their maxTokens). */
  quantize?: boolean;
  /**
   * Fold dec_rope_kv into pass 1 (`foldsRope(S, batched)` must hold; a binding made with `fold`):
   * q is read raw, token t's k and v (the fold's buffers) are normalised, rotated at position
   * n - 1 + t (+ the positions word) and written to the cache rows of those positions.
   */
  rope?: AttentionRope;
}

/** dec_attention_decode's shape for one DecoderAttention (see `decodeShape`). */
interface DecodeShape {
  workgroupSize: number;
  lanes: number;
}

export class DecoderAttention implements Disposable {
  readonly device: Device;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly group: number;
  readonly chunk: number;
  readonly workgroupSize: number;
  readonly unroll: boolean;
  /** dec_attention_decode's threads and lanes per position; undefined: decode calls run the general pass 1. */
  readonly decode: DecodeShape | undefined;
  readonly maxDecodeGroups: number;
  /** What dec_attention_prefill's shape may be; undefined: prompt chunks run the general pass 1. */
  readonly prefill: { rows: number; tile: number; halfTiles?: boolean; workgroupSize?: number } | undefined;
  private readonly decodePipeline: ComputePipeline | undefined;
  /** dec_attention_decode with ROPE_FOLD (undefined: not asked for, or decode calls do not run dec_attention_decode). */
  private readonly foldPipeline: ComputePipeline | undefined;
  private readonly prefillPipelines = new Map<number, { shape: PrefillShape; pipeline: ComputePipeline }>();
  private readonly splitPipelines = new Map<number, ComputePipeline>();
  private readonly combinePipeline: ComputePipeline;
  /** COMBINE_TAIL's arrival counters, a word per (token, KV head), zero between calls (undefined: no tail). */
  private readonly arrivals: Buffer | undefined;
  private readonly pool: DescriptorPool;
  private readonly pc = new DataView(new ArrayBuffer(DEC_ATTENTION_DECODE.pushConstantBytes));
  /** dec_attention_cm and the fewest tokens it takes (undefined: prompt chunks keep the passes above). */
  private readonly prompt: { kernel: PromptAttentionKernel; fromTokens: number } | undefined;

  constructor(device: Device, options: DecoderAttentionOptions) {
    const { heads, kvHeads, headDim } = options;
    const chunk = options.chunk ?? 64, wg = options.workgroupSize ?? 64, maxBindings = options.maxBindings ?? 8;
    if (!(ATTENTION_HEAD_DIMS as readonly number[]).includes(headDim)) throw new InvalidArgumentError(`headDim must be 32, 64, 128 or 256, got ${headDim}`);
    if (!Number.isInteger(kvHeads) || kvHeads < 1 || !Number.isInteger(heads) || heads % kvHeads !== 0) {
      throw new InvalidArgumentError(`heads (${heads}) must be a positive multiple of kvHeads (${kvHeads})`);
    }
    const group = heads / kvHeads;
    if (!(ATTENTION_GQA as readonly number[]).includes(group)) throw new InvalidArgumentError(`heads / kvHeads must be 1, 2, 4 or 8, got ${group}`);
    if (!Number.isInteger(chunk) || chunk < 1 || chunk > 1024) throw new InvalidArgumentError(`chunk must be an integer in 1..1024, got ${chunk}`);
    if (!Number.isInteger(wg) || (wg & (wg - 1)) !== 0 || wg < DECODE_ATTENTION_TOKENS * group || wg > device.info.limits.maxComputeWorkGroupInvocations) {
      throw new InvalidArgumentError(`workgroupSize ${wg} must be a power of two, at least ${DECODE_ATTENTION_TOKENS * group} (heads per KV head x ${DECODE_ATTENTION_TOKENS} tokens) and at most maxComputeWorkGroupInvocations`);
    }
    if (this.sharedBytes(group, headDim, chunk) > device.info.limits.maxComputeSharedMemorySize) {
      throw new InvalidArgumentError(`chunk ${chunk} needs ${this.sharedBytes(group, headDim, chunk)} B of shared memory for one token (limit ${device.info.limits.maxComputeSharedMemorySize})`);
    }
    const pm = options.promptMatrixCores;
    if (pm && (!Number.isInteger(pm.fromTokens) || pm.fromTokens <= DECODE_ATTENTION_TOKENS)) throw new InvalidArgumentError(`promptMatrixCores.fromTokens must be an integer above ${DECODE_ATTENTION_TOKENS}, got ${pm.fromTokens}`);
    const ps = options.prefillShape ?? {};
    const rows = ps.rows ?? DEFAULT_PREFILL_ROWS, tile = ps.tile ?? DEFAULT_PREFILL_TILE;
    const pow2 = (x: number) => Number.isInteger(x) && x >= 1 && (x & (x - 1)) === 0;
    if (!pow2(rows) || rows > 256) throw new InvalidArgumentError(`prefillShape.rows must be a power of two in 1..256, got ${rows}`);
    if (!pow2(tile) || tile < 8 || tile > 256) throw new InvalidArgumentError(`prefillShape.tile must be a power of two in 8..256, got ${tile}`);
    if (ps.workgroupSize !== undefined && (!pow2(ps.workgroupSize) || ps.workgroupSize < 32)) throw new InvalidArgumentError(`prefillShape.workgroupSize must be a power of two >= 32, got ${ps.workgroupSize}`);
    this.device = device;
    this.heads = heads;
    this.kvHeads = kvHeads;
    this.headDim = headDim;
    this.group = group;
    this.chunk = chunk;
    this.workgroupSize = wg;
    this.unroll = options.unroll ?? device.info.type !== 4;
    const maxDecodeGroups = options.maxDecodeGroups ?? DEFAULT_DECODE_GROUPS;
    if (!Number.isInteger(maxDecodeGroups) || maxDecodeGroups < 1) throw new InvalidArgumentError(`maxDecodeGroups must be a positive integer, got ${maxDecodeGroups}`);
    this.maxDecodeGroups = maxDecodeGroups;
    this.decode = options.decodeKernel === false ? undefined : this.decodeShape();
    if (options.decodeKernel === true && !this.decode) throw new InvalidArgumentError(`dec_attention_decode does not fit this device for head_dim ${headDim}, GQA ${group}, chunk ${chunk} (threads or shared memory)`);
    this.prefill = options.prefillKernel === false ? undefined : { rows: Math.max(rows, group), tile, ...(ps.halfTiles !== undefined && { halfTiles: ps.halfTiles }), ...(ps.workgroupSize && { workgroupSize: ps.workgroupSize }) };
    // the smallest block (one token) must fit, or prompt chunks keep the general pass 1
    if (this.prefill && !this.prefillShape(group)) {
      if (options.prefillKernel === true) throw new InvalidArgumentError(`dec_attention_prefill does not fit this device for head_dim ${headDim}, GQA ${group} (threads or shared memory)`);
      this.prefill = undefined;
    }
    if (this.decode) {
      const tailBytes = options.combineTail ? 16 * group * (headDim / 4) : 0;
      const maxShared = device.info.limits.maxComputeSharedMemorySize;
      const tail = options.combineTail === true && this.sharedBytes(group, headDim, chunk) + tailBytes <= maxShared
        && (!options.ropeFold || this.foldSharedBytes() + tailBytes <= maxShared);
      if (tail) {
        this.arrivals = new Buffer(device, { size: BigInt(4 * DECODE_ATTENTION_TOKENS * kvHeads), memory: "device" });
        uploadBytes(device, this.arrivals, 0n, new Uint8Array(4 * DECODE_ATTENTION_TOKENS * kvHeads));
      }
      this.decodePipeline = new ComputePipeline(device, {
        spirv: shaderFile(DEC_ATTENTION_DECODE.name), storageBuffers: DEC_ATTENTION_DECODE.storageBuffers, pushConstantBytes: DEC_ATTENTION_DECODE.pushConstantBytes,
        specialization: { 0: this.decode.workgroupSize, 1: headDim, 2: chunk, 3: group, 4: this.unroll ? 1 : 0, 5: this.decode.lanes, 8: tail ? 1 : 0 },
      });
      if (options.ropeFold && this.foldSharedBytes() <= device.info.limits.maxComputeSharedMemorySize) {
        // the head norm's sums as dec_rope_kv's (subgroupAdd where subgroups fit its 64-thread heads)
        const fits = device.info.subgroup.arithmetic && device.info.subgroup.maxSize <= ROPE_FOLD_THREADS;
        if (options.ropeFoldSubgroup && !fits) throw new InvalidArgumentError(`ropeFoldSubgroup needs subgroup arithmetic and subgroups of at most ${ROPE_FOLD_THREADS}`);
        const sub = options.ropeFoldSubgroup ?? fits;
        this.foldPipeline = new ComputePipeline(device, {
          spirv: shaderFile(DEC_ATTENTION_DECODE.name), storageBuffers: DEC_ATTENTION_DECODE.storageBuffers, pushConstantBytes: DEC_ATTENTION_DECODE.pushConstantBytes,
          specialization: { 0: this.decode.workgroupSize, 1: headDim, 2: chunk, 3: group, 4: this.unroll ? 1 : 0, 5: this.decode.lanes, 6: 1, 7: sub ? 1 : 0, 8: tail ? 1 : 0 },
        });
      }
    }
    this.combinePipeline = new ComputePipeline(device, {
      spirv: shaderFile(DEC_ATTENTION_COMBINE.name), storageBuffers: DEC_ATTENTION_COMBINE.storageBuffers,
      pushConstantBytes: DEC_ATTENTION_COMBINE.pushConstantBytes, specialization: { 0: wg, 1: headDim },
    });
    const decodeSets = this.decodePipeline ? 1 : 0;
    this.pool = new DescriptorPool(device, (2 + decodeSets) * maxBindings, (DEC_ATTENTION.storageBuffers + DEC_ATTENTION_COMBINE.storageBuffers + decodeSets * DEC_ATTENTION_DECODE.storageBuffers) * maxBindings);
    if (pm) {
      // where its tile does not fit, or the real kernel fails its self-check, prompt chunks keep the passes above
      if (promptAttentionShapeFor(device, headDim) && (pm.variant !== true || promptAttentionPasses(device, { heads, kvHeads, headDim }))) {
        try {
          this.prompt = { kernel: new PromptAttentionKernel(device, { heads, kvHeads, headDim, matrixCores: pm.variant, maxBindings }), fromTokens: pm.fromTokens };
        } catch (e) {
          this[Symbol.dispose]();  // what the constructor made so far
          throw e;
        }
      }
    }
  }

  /**
   * dec_attention_decode's shape: one thread per (row, 8 dims) for the values (at least 64), and
   * for the scores as many lanes per position as the threads cover the chunk with (a power of two
   * dividing headDim / 8). Undefined where the device's threads or shared memory do not allow it.
   */
  private decodeShape(): DecodeShape | undefined {
    const hd8 = this.headDim / 8;
    let wg = 64;
    while (wg < this.group * hd8) wg *= 2;
    if (wg > this.device.info.limits.maxComputeWorkGroupInvocations) return undefined;
    let lanes = 1;
    while (lanes * 2 <= hd8 && lanes * 2 * this.chunk <= wg) lanes *= 2;
    if (4 * this.group * this.chunk * lanes > this.device.info.limits.maxComputeSharedMemorySize) return undefined;
    return { workgroupSize: wg, lanes };
  }

  /** ROPE_FOLD's shared memory: the decode kernel's scores, q rows, new k/v rows and the head norms' partial sums. */
  private foldSharedBytes(): number {
    const d = this.decode!;
    return 4 * this.group * this.chunk * d.lanes + 4 * this.group * this.headDim + 2 * 2 * DECODE_ATTENTION_TOKENS * this.headDim + 4 * (this.group + DECODE_ATTENTION_TOKENS) * ROPE_FOLD_THREADS;
  }

  /** Whether this object folds the RoPE step into its decode calls of one sequence (`ropeFold`, where it fits). */
  get ropeFold(): boolean {
    return this.foldPipeline !== undefined;
  }

  /** Whether a call of S tokens may take `rope` (decode calls of one sequence, on an object made with `ropeFold`). */
  foldsRope(S: number, batched = false): boolean {
    return this.foldPipeline !== undefined && !batched && S >= 1 && S <= DECODE_ATTENTION_TOKENS;
  }

  /**
   * dec_attention_prefill's shape for at most `rows` query rows (a power of two >= group): the
   * largest rows, then tile, then float tiles that fit the device's shared memory and threads;
   * undefined where none does.
   */
  prefillShape(rows: number): PrefillShape | undefined {
    const want = this.prefill;
    if (!want) return undefined;
    const limits = this.device.info.limits, hd4 = this.headDim / 4;
    for (let r = Math.min(rows, want.rows); r >= this.group; r /= 2) {
      for (let tile = want.tile; tile >= 8; tile /= 2) {
        for (const halfTiles of want.halfTiles === undefined ? [false, true] : [want.halfTiles]) {
          let wg = want.workgroupSize ?? PREFILL_THREADS;
          while (!want.workgroupSize && (r * hd4) / wg > MAX_PREFILL_VALUE_QUADS && 2 * wg <= limits.maxComputeWorkGroupInvocations) wg *= 2;
          wg = Math.min(wg, r * tile, r * hd4);
          if (wg > limits.maxComputeWorkGroupInvocations) continue;
          // register tiles near square (scores), rows first (values: P is a broadcast, V a load a quad)
          const scores = (r * tile) / wg, values = (r * hd4) / wg;
          let ka = 2 ** Math.floor(Math.log2(scores) / 2), ra = scores / ka;
          while (ra > r) { ra /= 2; ka *= 2; }
          let rc = 2 ** Math.ceil(Math.log2(values) / 2), qc = values / rc;
          while (rc > r) { rc /= 2; qc *= 2; }
          if (ka > tile || qc > hd4) continue;
          const tk = tile / ka;
          const sharedBytes = 16 * r * (hd4 + 1) + tile * (hd4 + 1) * (halfTiles ? 8 : 16) + (halfTiles ? 16 : 8) + 4 * r * (tile + 1) + 4 * r * tk + 4 * r;
          if (sharedBytes > limits.maxComputeSharedMemorySize) continue;
          return { rows: r, tile, halfTiles, workgroupSize: wg, ra, ka, rc, qc, sharedBytes };
        }
      }
    }
    return undefined;
  }

  /** The rows of dec_attention_prefill's workgroups for S tokens: enough for all of them, at most the shape's. */
  private prefillRows(S: number): number {
    let rows = this.group;
    while (rows < S * this.group && rows < this.prefill!.rows) rows *= 2;
    return rows;
  }

  /** dec_attention_prefill's shape and pipeline for a call of S tokens (undefined: the general pass 1 runs it). */
  prefillFor(S: number): { shape: PrefillShape; pipeline: ComputePipeline } | undefined {
    if (!this.prefill || S <= DECODE_ATTENTION_TOKENS) return undefined;
    const rows = this.prefillRows(S);
    let entry = this.prefillPipelines.get(rows);
    if (!entry) {
      const shape = this.prefillShape(rows);
      if (!shape) return undefined;
      const pipeline = new ComputePipeline(this.device, {
        spirv: shaderFile(DEC_ATTENTION_PREFILL.name), storageBuffers: DEC_ATTENTION_PREFILL.storageBuffers, pushConstantBytes: DEC_ATTENTION_PREFILL.pushConstantBytes,
        specialization: {
          0: shape.workgroupSize, 1: this.headDim, 2: this.chunk, 3: shape.rows, 4: shape.tile, 5: shape.halfTiles ? 1 : 0,
          6: shape.ra, 7: shape.ka, 8: shape.rc, 9: shape.qc,
        },
      });
      this.prefillPipelines.set(rows, (entry = { shape, pipeline }));
    }
    return entry;
  }

  /** Pass 1's shared memory for `rows` query rows: q, scores, the span's running values and state. */
  private sharedBytes(rows: number, headDim = this.headDim, chunk = this.chunk): number {
    return 4 * rows * (2 * headDim + chunk + 3);
  }

  /** Tokens one pass-1 workgroup serves for S tokens: as many as its registers, threads and shared memory allow. */
  tokensPerGroup(S: number): number {
    const rows = S <= DECODE_ATTENTION_TOKENS ? MAX_GROUP_ROWS : MAX_PREFILL_GROUP_ROWS;
    let T = Math.max(1, Math.min(S, Math.floor(Math.min(rows, this.workgroupSize) / this.group)));
    while (T > 1 && this.sharedBytes(this.group * T) > this.device.info.limits.maxComputeSharedMemorySize) T--;
    return T;
  }

  /** Chunks of `chunk` positions a pass-1 workgroup walks for a call of S tokens over `positions`. */
  itersPerSpan(positions: number, S: number): number {
    const chunks = Math.ceil(positions / this.chunk);
    return S <= DECODE_ATTENTION_TOKENS ? 1 : Math.max(1, Math.ceil(chunks / PREFILL_SPANS));
  }

  /** Pass-1 workgroups along x (and partial records per row) for S tokens over `positions`. */
  spans(positions: number, S: number = 1): number {
    return Math.ceil(positions / (this.chunk * this.itersPerSpan(positions, S)));
  }

  /** Bytes of partials scratch for S tokens when the last token sees `maxPositions` positions. */
  partialBytes(maxPositions: number, S: number = MAX_ATTENTION_TOKENS): number {
    return 4 * S * this.heads * this.spans(maxPositions, S) * (this.headDim + 4);
  }

  /** Bytes of partials scratch every call of 1..maxS tokens over at most `maxPositions` positions fits in. */
  partialBytesUpTo(maxPositions: number, maxS: number = MAX_ATTENTION_TOKENS): number {
    let most = 0;
    for (let S = 1; S <= maxS; S++) most = Math.max(most, this.partialBytes(maxPositions, S));
    return most;
  }

  /** The first key/value element of `layer` in a cache of `ctx` positions per layer (halves). */
  layerOffset(layer: number, ctx: number): number {
    return layer * ctx * this.kvHeads * this.headDim;
  }

  private splitPipeline(rows: number): ComputePipeline {
    let p = this.splitPipelines.get(rows);
    if (!p) {
      p = new ComputePipeline(this.device, {
        spirv: shaderFile(DEC_ATTENTION.name), storageBuffers: DEC_ATTENTION.storageBuffers, pushConstantBytes: DEC_ATTENTION.pushConstantBytes,
        specialization: { 0: this.workgroupSize, 1: this.headDim, 2: this.chunk, 3: rows, 4: this.unroll ? 1 : 0 },
      });
      this.splitPipelines.set(rows, p);
    }
    return p;
  }

  /** Descriptor sets for these buffers (written once; reuse the binding for every call on them). */
  bind(b: AttentionBuffers): AttentionBinding {
    // every split pipeline shares one set layout (5 storage buffers), so any of them allocates it;
    // without a positions buffer q stands in for it (never read: the flag is clear)
    const pos = b.positions ?? b.q;
    // checked before any set is allocated (a refused binding takes nothing from the pool)
    const qr = b.quantized;
    if (qr && qr.cols !== this.heads * this.headDim) throw new InvalidArgumentError(`quantized rows of ${qr.cols} columns for an output of ${this.heads * this.headDim}`);
    const f = b.fold;
    if (f && !this.foldPipeline) throw new InvalidArgumentError("fold buffers need a DecoderAttention made with ropeFold (where its decode kernel runs)");
    const split = this.pool.allocate(this.splitPipeline(this.group), [{ buffer: b.q }, { buffer: b.keys }, { buffer: b.values }, { buffer: b.partials }, { buffer: pos }]);
    // without a gate the partials stand in for it (never read: the flag is clear)
    const combine = this.pool.allocate(this.combinePipeline, [
      { buffer: b.partials }, { buffer: b.out }, { buffer: pos }, { buffer: b.gate ?? b.partials },
      { buffer: qr?.xq ?? b.partials }, { buffer: qr?.xscale ?? b.partials }, { buffer: qr?.xsum ?? b.partials },
    ]);
    // dec_attention_decode's set: pass 1's buffers, then the fold's (q stands in for them without)
    const decode = this.decodePipeline
      ? this.pool.allocate(this.decodePipeline, [
        { buffer: b.q }, { buffer: b.keys }, { buffer: b.values }, { buffer: b.partials }, { buffer: pos },
        { buffer: f?.k ?? b.q }, { buffer: f?.v ?? b.q }, { buffer: f?.invFreq ?? b.q }, { buffer: f?.normWeights ?? f?.invFreq ?? b.q },
        { buffer: f ? b.keys : b.q }, { buffer: f ? b.values : b.q },
        // COMBINE_TAIL's (any buffer without it: never read)
        { buffer: this.arrivals ?? b.partials }, { buffer: b.out }, { buffer: b.gate ?? b.partials },
        { buffer: qr?.xq ?? b.partials }, { buffer: qr?.xscale ?? b.partials }, { buffer: qr?.xsum ?? b.partials },
      ])
      : 0n;
    const prompt = this.prompt?.kernel.bind({ q: b.q, keys: b.keys, values: b.values, out: b.out, ...(b.positions && { positions: b.positions }), ...(b.gate && { gate: b.gate }) });
    return {
      split, combine, decode, fold: f !== undefined, partials: b.partials, ...(b.positions && { positions: b.positions }), ...(b.gate && { gate: b.gate }), ...(qr && { quantized: qr }), ...(prompt && { prompt }),
    };
  }

  /**
   * Records both passes and the barrier between them into `cb`. The caller orders q / cache (and
   * positions-word) writes before (a compute or transfer barrier; a host write before the submit
   * needs none) and reads of out after.
   */
  record(cb: CommandBuffer, binding: AttentionBinding, call: AttentionCall): void {
    const { n, S } = call;
    const cacheOffset = call.cacheOffset ?? 0, qOffset = call.qOffset ?? 0, outOffset = call.outOffset ?? 0;
    if (!Number.isInteger(S) || S < 1 || S > MAX_ATTENTION_TOKENS) throw new InvalidArgumentError(`S must be an integer in 1..${MAX_ATTENTION_TOKENS}, got ${S}`);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`n must be a positive integer, got ${n}`);
    const fromBuffer = binding.positions !== undefined;
    const posIndex = call.posIndex ?? 0;
    if (fromBuffer) {
      if (call.maxPositions === undefined) throw new InvalidArgumentError("maxPositions is required on a binding with a positions buffer");
      if (!Number.isInteger(posIndex) || posIndex < 0 || BigInt(4 * (posIndex + 1)) > binding.positions!.size) {
        throw new InvalidArgumentError(`posIndex ${posIndex} is outside the positions buffer (${binding.positions!.size} B)`);
      }
    } else if (call.posIndex !== undefined) {
      throw new InvalidArgumentError("posIndex needs a binding with a positions buffer");
    }
    const batched = call.batched ?? false;
    if (batched) {
      if (!fromBuffer) throw new InvalidArgumentError("a batched call reads each token's position from the binding's positions buffer");
      if (S > BATCH_WORDS) throw new InvalidArgumentError(`a batched call takes at most ${BATCH_WORDS} tokens, got ${S}`);
      if (BigInt(4 * (posIndex + BATCH_WORDS + S)) > binding.positions!.size) throw new InvalidArgumentError(`a batched call reads positions words ${posIndex}..${posIndex + BATCH_WORDS + S - 1}, past the buffer (${binding.positions!.size} B)`);
    }
    const least = batched ? 1 : n + S - 1; // batched: each token's own count, capped at maxPositions
    const positions = call.maxPositions ?? least;
    if (!Number.isInteger(positions) || positions < least) throw new InvalidArgumentError(`maxPositions ${positions} is below ${batched ? "1" : `n + S - 1 = ${least}`}`);
    if (positions > 0xffffffff) throw new InvalidArgumentError(`maxPositions ${positions} exceeds u32`);
    if (!Number.isInteger(cacheOffset) || cacheOffset < 0 || cacheOffset % 8 !== 0) throw new InvalidArgumentError(`cacheOffset must be a non-negative multiple of 8 halves, got ${cacheOffset}`);
    if (!Number.isInteger(qOffset) || qOffset < 0 || qOffset % 4 !== 0) throw new InvalidArgumentError(`qOffset must be a non-negative multiple of 4 floats, got ${qOffset}`);
    if (!Number.isInteger(outOffset) || outOffset < 0) throw new InvalidArgumentError(`outOffset must be a non-negative integer, got ${outOffset}`);
    const gateOffset = call.gateOffset ?? 0;
    if (binding.gate) {
      if (!Number.isInteger(gateOffset) || gateOffset < 0) throw new InvalidArgumentError(`gateOffset must be a non-negative integer, got ${gateOffset}`);
      const gateBytes = 4 * (gateOffset + S * this.heads * this.headDim);
      if (BigInt(gateBytes) > binding.gate.size) throw new InvalidArgumentError(`the gate buffer (${binding.gate.size} B) is shorter than the ${gateBytes} B the call reads`);
    } else if (call.gateOffset !== undefined) {
      throw new InvalidArgumentError("gateOffset needs a binding with a gate buffer");
    }
    if (call.quantize) {
      const qr = binding.quantized;
      if (!qr) throw new InvalidArgumentError("quantize needs a binding with quantized rows");
      if (qr.maxTokens < S) throw new InvalidArgumentError(`quantized rows for ${qr.maxTokens} tokens, the call has ${S}`);
      if (outOffset !== 0) throw new InvalidArgumentError("a quantizing call writes out at offset 0");
    }
    const rope = call.rope;
    if (rope) {
      if (!this.foldsRope(S, batched)) throw new InvalidArgumentError(`rope folds into decode calls of one sequence (S <= ${DECODE_ATTENTION_TOKENS}, not batched) on a DecoderAttention made with ropeFold`);
      if (!binding.fold) throw new InvalidArgumentError("rope needs a binding made with fold buffers");
      const rd = rope.rotaryDim ?? this.headDim;
      if (!Number.isInteger(rd) || rd < 4 || rd % 4 !== 0 || rd > this.headDim) throw new InvalidArgumentError(`rotaryDim must be a multiple of 4 in 4..headDim (${this.headDim}), got ${rd}`);
      if (rope.norm && !(rope.norm.eps >= 0 && Number.isFinite(rope.norm.eps))) throw new InvalidArgumentError(`norm eps must be finite and >= 0, got ${rope.norm.eps}`);
      if (!fromBuffer && n - 1 + S > ROPE_MAX_POSITION) throw new InvalidArgumentError(`positions must lie in 0..2^24, got ${n - 1}+${S}`);
    }
    const iters = this.itersPerSpan(positions, S);
    const numChunks = this.spans(positions, S);
    const need = this.partialBytes(positions, S);
    if (BigInt(need) > binding.partials.size) throw new InvalidArgumentError(`partials scratch of ${binding.partials.size} B, ${need} B needed`);
    const maxX = this.device.info.limits.maxComputeWorkGroupCount[0]!;
    if (numChunks > maxX) throw new InvalidArgumentError(`${numChunks} chunks exceed maxComputeWorkGroupCount[0] (${maxX}): use a larger chunk`);
    if (numChunks > MAX_COMBINE_RECORDS) throw new InvalidArgumentError(`${numChunks} partial records per row exceed the combine pass's ${MAX_COMBINE_RECORDS}: use a larger chunk`);
    // decode: one token per workgroup; batched: each token its own sequence, one per group
    const decode = this.decodePipeline !== undefined && S <= DECODE_ATTENTION_TOKENS && iters === 1;
    // prompt chunks of one sequence: a block of shape.rows / group tokens per workgroup
    const prefill = batched ? undefined : this.prefillFor(S);
    const T = batched || decode ? 1 : prefill ? prefill.shape.rows / this.group : this.tokensPerGroup(S);
    const split = rope ? this.foldPipeline! : decode ? this.decodePipeline! : prefill ? prefill.pipeline : this.splitPipeline(this.group * T);
    const pc = this.pc;
    const flags = batched ? 2 : fromBuffer ? 1 : 0;
    const words = [n, S, this.heads, this.kvHeads, cacheOffset / 8, cacheOffset / 2, qOffset / 4, numChunks, T];
    words.forEach((w, i) => pc.setUint32(4 * i, w, true));
    pc.setFloat32(36, 1 / Math.sqrt(this.headDim), true);
    [posIndex, flags, positions, iters].forEach((w, i) => pc.setUint32(40 + 4 * i, w, true));
    // dec_attention_decode's fold words (zeros without rope: unread)
    const norm = rope?.norm;
    [rope?.kOffset ?? 0, rope?.vOffset ?? 0, rope?.invOffset ?? 0, norm?.qOffset ?? 0, norm?.kOffset ?? 0].forEach((w, i) => pc.setUint32(56 + 4 * i, w, true));
    pc.setFloat32(76, norm?.eps ?? 0, true);
    [rope ? rope.rotaryDim ?? this.headDim : 0, norm ? 1 : 0].forEach((w, i) => pc.setUint32(80 + 4 * i, w, true));
    const gridX = decode ? Math.min(numChunks, this.maxDecodeGroups) : numChunks;
    const pushBytes = decode ? DEC_ATTENTION_DECODE.pushConstantBytes : DEC_ATTENTION.pushConstantBytes;
    const tail = decode && this.arrivals !== undefined;
    [outOffset, gateOffset, (binding.gate ? 1 : 0) | (call.quantize ? 2 : 0)].forEach((w, i) => pc.setUint32(88 + 4 * i, tail ? w : 0, true));
    cb.bind(split, decode ? binding.decode : binding.split).pushConstants(split, new Uint8Array(pc.buffer, 0, pushBytes)).dispatch(gridX, this.kvHeads, Math.ceil(S / T));
    if (tail) return;  // the last workgroup of each row group merged its records
    cb.barrier("computeToCompute");
    const combineFlags = flags | (binding.gate ? 4 : 0) | (call.quantize ? 8 : 0);
    [n, S, this.heads, numChunks, outOffset, posIndex, combineFlags, positions, this.chunk * iters, gateOffset].forEach((w, i) => pc.setUint32(4 * i, w, true));
    cb.bind(this.combinePipeline, binding.combine).pushConstants(this.combinePipeline, new Uint8Array(pc.buffer, 0, DEC_ATTENTION_COMBINE.pushConstantBytes)).dispatch(this.heads, S);
  }

  [Symbol.dispose](): void {
    this.pool[Symbol.dispose]();
    for (const p of this.splitPipelines.values()) p[Symbol.dispose]();
    this.decodePipeline?.[Symbol.dispose]();
    this.foldPipeline?.[Symbol.dispose]();
    for (const e of this.prefillPipelines.values()) e.pipeline[Symbol.dispose]();
    this.prefillPipelines.clear();
    this.splitPipelines.clear();
    this.combinePipeline[Symbol.dispose]();
    this.arrivals?.[Symbol.dispose]();
    this.prompt?.kernel[Symbol.dispose]();
  }

  /** Whether decode calls (S <= DECODE_ATTENTION_TOKENS tokens a call) merge their records in pass 1 (`combineTail`, where it fits). */
  get combineTail(): boolean {
    return this.arrivals !== undefined;
  }

  /**
   * A prompt chunk of one sequence longer than MAX_ATTENTION_TOKENS (its keys and values all in the
   * cache already, its first token's position in the binding's positions word 0): its queries
   * MAX_ATTENTION_TOKENS at a time, one call after another (they share the partials scratch).
   * Returns the dispatches recorded.
   */
  recordLong(cb: CommandBuffer, binding: AttentionBinding, a: { S: number; maxPositions: number }): number {
    const row = this.heads * this.headDim;
    let dispatches = 0;
    for (let t0 = 0; t0 < a.S; t0 += MAX_ATTENTION_TOKENS) {
      const n = Math.min(MAX_ATTENTION_TOKENS, a.S - t0);
      if (t0 > 0) cb.barrier("computeToCompute");
      this.record(cb, binding, { n: 1 + t0, S: n, maxPositions: a.maxPositions, posIndex: 0, qOffset: t0 * row, outOffset: t0 * row, ...(binding.gate && { gateOffset: t0 * row }) });
      dispatches += this.dispatches(n);
    }
    return dispatches;
  }

  /** Whether a prompt chunk of S tokens of one sequence runs on dec_attention_cm (`recordPrompt`; promptMatrixCores). */
  promptOnMatrixCores(S: number, batched = false): boolean {
    return this.prompt !== undefined && !batched && S >= this.prompt.fromTokens;
  }

  /**
   * A prompt chunk of one sequence whose keys and values are all in the cache (its first token's
   * position in the binding's positions word 0), on dec_attention_cm: one dispatch, out written
   * (times the binding's gate) with no quantized rows. Returns the dispatches recorded.
   */
  recordPrompt(cb: CommandBuffer, binding: AttentionBinding, a: { S: number; maxPositions: number }): number {
    if (!this.promptOnMatrixCores(a.S) || !binding.prompt) throw new InvalidArgumentError(`a prompt chunk of ${a.S} tokens does not run dec_attention_cm here (promptOnMatrixCores)`);
    this.prompt!.kernel.record(cb, binding.prompt, { n: 1, S: a.S, maxPositions: a.maxPositions, ...(binding.positions && { posIndex: 0 }), ...(binding.gate && { gateOffset: 0 }) });
    return 1;
  }

  /** Dispatches a call of S tokens records. */
  dispatches(S: number): number {
    return this.combineTail && S <= DECODE_ATTENTION_TOKENS ? 1 : 2;
  }
}
