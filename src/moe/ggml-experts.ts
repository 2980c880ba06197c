/**
 * Routed experts stored as GGML blocks (K-quant files: Q4_K gate/up with Q6_K down, ...) on the GPU:
 * the grouped MoE call of shaders/moe_ggml.comp (gate+up, then down) and moe_sum.comp, over a
 * layer's experts uploaded as the file holds them (no repack). Float path: each weight is GGML's.
 *
 * GgmlExpertLayer: one device buffer with every expert's gate, up and down blocks, and the expert
 * table (uvec4 per expert: byte offsets of gate, up, down). GgmlExpertKernels: one pipeline per
 * mode, format and rows per workgroup (gate/up share a format in real files; down may differ),
 * recording the three dispatches of a call on buffers the caller provides. The work list is
 * routing.ts's WorkList in moe.glsl's layout (writeWorkList).
 *
 * The kernel works by 32-weight slices (ggml_blocks.glsl): a workgroup's R rows x cols/32 slices
 * are one list its lanes share, so rows shorter than the workgroup (down: I 768 is 24 slices)
 * leave no lane idle; R follows the row length (moeRowsPerWorkgroup). Lists grouped by expert (a
 * prompt chunk's: several slots an item) go to shaders/moe_ggml_rows.comp instead, a row per lane:
 * there the slices' reductions, not the reads, were the cost. Where the integer-dot path is on
 * (the caller's decision: idp-policy.ts), those lists run shaders/moe_ggml_rows_idp.comp over x and h
 * quantized by quantize_act (groups of 16) into an ExpertQuantScratch: 4 int8 products an instruction.
 * Where the caller asks for the matrix cores (matrixCores; the graphs' prefill plan does for calls of
 * 256 tokens or more: at a 64-token chunk's few slots an expert they measured slower than the
 * integer-dot rows kernel, README), those lists run shaders/moe_ggml_cm.comp instead: tiles of 64
 * gate + 64 up rows (or 128 down rows) x cmSlots slots, each expert's weights decoded once per
 * cmSlots of its slots.
 */
import { InvalidArgumentError } from "../errors.ts";
import { GGML_BLOCK_LAYOUTS, GGML_BLOCK_TYPES, type GgmlBlockTensor, type GgmlBlockType } from "../quant/ggml-blocks.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "../kernels/decoder/common.ts";
import { GgmlQuantizeKernel, QuantizedRowsBuffers } from "../kernels/decoder/ggml-gemv.ts";
import { cmTileSharedBytes, matrixCoreShader } from "../kernels/decoder/quant-gemm.ts";
import { MOE_GGML_ROWS_IDP, type ShaderInterface } from "../kernels/shaders.ts";
import type { CommandBuffer } from "../vk/commands.ts";
import type { Device } from "../vk/device.ts";
import { Buffer } from "../vk/memory.ts";
import { uploadBytes } from "../vk/transfer.ts";
import type { WorkList } from "./routing.ts";

/**
 * x/h, work, pairs, out, slot weights, expert bytes, expert table, then (down with the slots' sum and
 * the norm tail only) the arrival word and the tail's residual, weights, xn, xq, xscale, xsum; push
 * O, cols, wOffset, eps, flags.
 */
export const MOE_GGML: ShaderInterface = { name: "moe_ggml", storageBuffers: 14, pushConstantBytes: 20 };
/** moe_ggml's bindings and push constants; a row per lane (prompt chunks' lists grouped by expert). */
export const MOE_GGML_ROWS: ShaderInterface = { name: "moe_ggml_rows", storageBuffers: 7, pushConstantBytes: 8 };
/** moe_ggml_rows' bindings and push constants on the matrix cores (shaders/moe_ggml_cm.comp), and its test variant (CM_EMULATE). */
export const MOE_GGML_CM: ShaderInterface = { ...MOE_GGML_ROWS, name: "moe_ggml_cm" };
export const MOE_GGML_CM_EMU: ShaderInterface = { ...MOE_GGML_ROWS, name: "moe_ggml_cm_emu" };
/** moe_ggml_cm's output rows a workgroup: gate+up 64 (each with its gate and up row), down 128. */
const CM_GATE_UP_ROWS = 64;
const CM_DOWN_ROWS = 128;
/** moe_ggml_cm's slots a tile (its specialization constant BN). */
export const CM_SLOT_TILES = [8, 16, 32, 64] as const;
/** moe_ggml_cm's (and moe_pool_cm's) shared memory at `slots` a tile: cm_slice_tile.glsl's, and the slot list. */
export function cmSharedBytes(slots: number): number {
  return cmTileSharedBytes(slots) + 64 * 4;
}
/** ypair, work, y, slot weights, completion word; push D. */
const MOE_SUM: ShaderInterface = { name: "moe_sum", storageBuffers: 5, pushConstantBytes: 4 };
const SUM_WORKGROUP = 256;
/** moe_ggml_rows' lanes a workgroup, and lanes a row by default on the float path (not timed against others). */
const ROWS_WORKGROUP = 64;
const ROWS_LANES = 2;
// On the integer-dot path, the most lanes (up to 8) that leave each lane at least this many slices
// of a row. H200, 2026-12-04 (profile:graph, Qwen3-30B-like Q4_K_M 8 layers, 64-token chunk, µs a
// layer at 2 / 4 / 8 lanes): gate+up (64 slices a row) 314 / 219 / 185, down (24 slices) 177 / 144 / 149.
const ROWS_IDP_MIN_SLICES = 6;

/** Slots a token moe_ggml's down-with-sum mode takes at most (its MAX_K, dec_route's). */
export const MOE_GGML_MAX_SLOTS = 8;

/** ggml_blocks.glsl's GGML_FMT_*. */
const FORMAT_ID: Readonly<Record<GgmlBlockType, number>> = { Q4_1: 0, Q5_0: 1, Q5_1: 2, Q4_K: 3, Q5_K: 4, Q6_K: 5 };

/** One expert's three matrices as the file holds them: gate, up [I][D], down [D][I]. */
export interface GgmlExpertTensors {
  gate: GgmlBlockTensor;
  up: GgmlBlockTensor;
  down: GgmlBlockTensor;
}

/** Offsets are 16-aligned: Q4_K/Q5_K blocks are read by uvec4 (ggml_blocks.glsl). */
const align16 = (n: number) => Math.ceil(n / 16) * 16;

/** A layer's experts in device memory: their blocks in one buffer, and the offset table. */
export class GgmlExpertLayer implements Disposable {
  readonly experts: number;
  readonly D: number;
  readonly I: number;
  readonly gateUpType: GgmlBlockType;
  readonly downType: GgmlBlockType;
  readonly blocks: Buffer;
  /** uvec4 per expert: byte offsets of gate, up, down in `blocks`, 0. */
  readonly table: Buffer;

  constructor(device: Device, experts: readonly GgmlExpertTensors[]) {
    const first = experts[0];
    if (first === undefined) throw new InvalidArgumentError("a GGML expert layer needs at least one expert");
    const D = first.gate.cols, I = first.gate.rows;
    const gateUpType = first.gate.type, downType = first.down.type;
    for (const [e, x] of experts.entries()) {
      const shapes: [string, GgmlBlockTensor, GgmlBlockType, number, number][] = [
        ["gate", x.gate, gateUpType, I, D], ["up", x.up, gateUpType, I, D], ["down", x.down, downType, D, I],
      ];
      for (const [name, t, type, rows, cols] of shapes) {
        if (t.type !== type || t.rows !== rows || t.cols !== cols) {
          throw new InvalidArgumentError(`expert ${e} ${name}: ${t.type} [${t.rows}][${t.cols}], the layer's is ${type} [${rows}][${cols}]`);
        }
      }
    }
    // Inputs are read as vec4 and by 32-column units: the block sizes (32, 256) already ensure it.
    const table = new Uint32Array(4 * experts.length);
    let at = 0;
    experts.forEach((x, e) => {
      [x.gate, x.up, x.down].forEach((t, m) => {
        table[4 * e + m] = at;
        at = align16(at + t.bytes.byteLength);
      });
    });
    // 16 more bytes: the shader reads the word after a 2-mod-4 field (ggml_blocks.glsl)
    const size = at + 16;
    if (size > 2 ** 32) throw new InvalidArgumentError(`the layer's experts take ${size} bytes; the table's byte offsets are 32-bit`);
    this.experts = experts.length;
    this.D = D;
    this.I = I;
    this.gateUpType = gateUpType;
    this.downType = downType;
    this.blocks = new Buffer(device, { size: BigInt(size), memory: "device" });
    try {
      this.table = new Buffer(device, { size: BigInt(table.byteLength), memory: "device" });
    } catch (e) {
      this.blocks[Symbol.dispose]();
      throw e;
    }
    try {
      const all = new Uint8Array(size);
      experts.forEach((x, e) => [x.gate, x.up, x.down].forEach((t, m) => all.set(t.bytes, table[4 * e + m]!)));
      uploadBytes(device, this.blocks, 0n, all);
      uploadBytes(device, this.table, 0n, new Uint8Array(table.buffer));
    } catch (e) {
      this[Symbol.dispose]();
      throw e;
    }
  }

  [Symbol.dispose](): void {
    this.blocks[Symbol.dispose]();
    this.table[Symbol.dispose]();
  }
}

/**
 * Writes `list` in moe.glsl's layout: work[0..3] = (S, slotsPerToken, items, sequence),
 * work[4 + 4u ..] = (expert id, 0, pairStart, pairCount); pairs and slot weights as the list holds them.
 * Returns the number of slots (S * slotsPerToken).
 */
export function writeWorkList(list: WorkList, S: number, sequence: number, work: Uint32Array, pairs: Uint32Array, slotWeight: Float32Array): number {
  const slots = S * list.slotsPerToken;
  if (work.length < 4 * (1 + list.items) || pairs.length < slots || slotWeight.length < slots) {
    throw new InvalidArgumentError(`work list of ${list.items} items and ${slots} slots does not fit the arrays given`);
  }
  work.set([S, list.slotsPerToken, list.items, sequence >>> 0]);
  for (let u = 0; u < list.items; u++) work.set([list.expert[u]!, 0, list.pairStart[u]!, list.pairCount[u]!], 4 * (1 + u));
  pairs.set(list.pairs.subarray(0, slots));
  slotWeight.set(list.slotWeight.subarray(0, slots));
  return slots;
}

/**
 * The integer-dot rows kernel's quantized inputs, x [S][D] and then h [slots][I] in turn (the call
 * quantizes h only after gate+up has read x, behind a barrier): rows of int8, scales and sums per 16.
 */
export class ExpertQuantScratch extends QuantizedRowsBuffers {
  /** Sized for the most values of S * D and slots * I over the calls it serves. */
  constructor(device: Device, D: number, I: number, maxTokens: number, slotsPerToken: number) {
    super(device, Math.max(maxTokens * D, maxTokens * slotsPerToken * I));
  }
}

class MoeGgmlKernel extends DecoderKernel {
  constructor(device: Device, private readonly shader: ShaderInterface, specialization: Record<number, number>, options: DecoderKernelOptions) {
    super(device, shader, specialization, options);
  }

  /**
   * `buffers`: the first 7 bindings; moe_ggml's down with the norm tail takes all 14 (elsewhere its
   * last 7 are never read: the first buffer fills them). Push words O, cols, then the tail's
   * (moe_ggml's 20 bytes; the rows kernels' 8 take the first two).
   */
  record(cb: CommandBuffer, buffers: Buffer[], O: number, cols: number, rowBlocks: number, items: number, tail?: MoeNormTail): void {
    const n = this.shader.storageBuffers;
    const all = buffers.length < n ? [...buffers, ...new Array<Buffer>(n - buffers.length).fill(buffers[0]!)] : buffers;
    const push = pushWords([O, cols, tail?.wOffset ?? 0, tail?.eps ?? 0, tail?.quantized ? 1 : 0], [3]).subarray(0, this.shader.pushConstantBytes);
    cb.bind(this.pipeline, this.setFor(all)).pushConstants(this.pipeline, push).dispatch(rowBlocks, items);
  }
}

/** Checks a norm tail's buffers for a call of S tokens of D columns. */
function checkNormTail(tail: MoeNormTail, S: number, D: number): void {
  if (tail.wOffset % 4 !== 0 || D % 16 !== 0) throw new InvalidArgumentError(`the norm tail reads vec4s and groups of 16: wOffset ${tail.wOffset}, D ${D}`);
  checkRange("moe ggml norm residual", tail.residual, 0, S * D);
  checkRange("moe ggml norm weights", tail.weights, tail.wOffset, D);
  checkRange("moe ggml norm xn", tail.xn, 0, S * D);
  if (tail.quantized) {
    checkRange("moe ggml norm xq", tail.quantized.xq, 0, (S * D) / 4);
    checkRange("moe ggml norm xscale", tail.quantized.xscale, 0, (S * D) / 16);
    checkRange("moe ggml norm xsum", tail.quantized.xsum, 0, (S * D) / 16);
  }
}

/** The tail's bindings after the arrival word: residual, weights, xn, xq, xscale, xsum (`fill` where not quantized). */
function tailBindings(tail: MoeNormTail, fill: Buffer): Buffer[] {
  const q = tail.quantized;
  return [tail.residual, tail.weights, tail.xn, q?.xq ?? fill, q?.xscale ?? fill, q?.xsum ?? fill];
}

/**
 * Rows per workgroup (1..8) for rows of `slices` 32-weight slices shared out over `wg` lanes: the
 * fewest idle lane-steps (ceil(R * slices / wg) * wg against R * slices), the smaller R on a tie.
 * D 2048 (64 slices) on 64 lanes: 1 row; I 768 (24 slices): 8 rows, 3 slices a lane; I 512: 4 rows.
 */
export function moeRowsPerWorkgroup(slices: number, wg: number): number {
  let best = 1, bestCost = Infinity;
  for (let R = 1; R <= 8; R++) {
    const cost = (Math.ceil((R * slices) / wg) * wg) / (R * slices);
    if (cost < bestCost - 1e-12) { best = R; bestCost = cost; }
  }
  return best;
}

class MoeSumKernel extends DecoderKernel {
  constructor(device: Device, options: DecoderKernelOptions) {
    super(device, MOE_SUM, { 0: SUM_WORKGROUP }, options);
  }

  record(cb: CommandBuffer, buffers: Buffer[], D: number, S: number): void {
    cb.bind(this.pipeline, this.setFor(buffers)).pushConstants(this.pipeline, pushWords([D])).dispatch(Math.ceil((S * D) / SUM_WORKGROUP));
  }
}

export interface GgmlExpertKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup, a power of two (default 64; 8 on a CPU device, one Lavapipe subgroup: its barriers are context switches). */
  workgroupSize?: number;
  /** Rows per workgroup, 1..8 (default: per mode, from the row length, moeRowsPerWorkgroup). */
  rowsPerWorkgroup?: number;
  /** Slots per register chunk, 1..8 (default 4): an expert's blocks are dequantized once per chunk. A call whose items hold one slot each runs a 1-slot pipeline. */
  tokensPerChunk?: number;
  /** Reduce with subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
  /** Lists grouped by expert (several slots an item) run moe_ggml_rows (default: where the device has subgroup shuffles in compute); false: moe_ggml's slices. */
  rowsForGrouped?: boolean;
  /** moe_ggml_rows' slots per register chunk, 1..8 (default 8). */
  rowsTokensPerChunk?: number;
  /** moe_ggml_rows' lanes a row, 1, 2, 4 or 8, at most the subgroup size (default ROWS_LANES; on the integer-dot path by the row's slices, rowsLanesFor). */
  rowsLanes?: number;
  /**
   * Lists grouped by expert run the integer-dot rows kernel (moe_ggml_rows_idp) over quantized x and
   * h (default false: the caller passes its integer-dot decision; the device needs
   * shaderIntegerDotProduct enabled and subgroup shuffles, and each such call an ExpertQuantScratch).
   */
  integerDot?: boolean;
  /** moe_ggml_rows_idp reads a lane's next slice before computing the current one (default false: slower on the H200 at the default lanes, 2026-12-04). */
  rowsPrefetch?: boolean;
  /** moe_ggml_rows_idp's rows a lane, 1..4 (default 1): each x group a lane loads serves that many rows. */
  rowsPerLane?: number;
  /**
   * Lists grouped by expert run moe_ggml_cm on the matrix cores (true; the device needs
   * cooperative matrices enabled), or its emulation ("emulated": tests on devices without them).
   * Default false. Takes precedence over integerDot for those lists.
   */
  matrixCores?: boolean | "emulated";
  /** moe_ggml_cm's slots a tile, one of CM_SLOT_TILES (default 8: a 64-token chunk gives an expert about 4). */
  cmSlots?: number;
  /** With matrixCores: only calls of at least this many tokens take moe_ggml_cm, shorter ones the other kernels (default 1: every grouped call). */
  matrixCoresFrom?: number;
  /**
   * Decode calls (itemPerSlot) may do the next layer's input norm in down's last workgroup (calls
   * that pass `normTail`; the graph stage's foldsNorm says so): the caller's decision, kept here with
   * the kernels it applies to (default false).
   */
  normTail?: boolean;
}

/** The buffers of one call (the caller owns them; offsets are 0). */
export interface GgmlExpertCall {
  layer: GgmlExpertLayer;
  /** S tokens in this call, and the work list's item count (as written by writeWorkList). */
  S: number;
  items: number;
  slotsPerToken: number;
  /** f32 [S][D]. */
  x: Buffer;
  /** uvec4 work list (moe.glsl's layout): 1 + items entries. */
  work: Buffer;
  /** uint [S * slotsPerToken]: slots grouped by item. */
  pairs: Buffer;
  /** f32 [S * slotsPerToken]: router weight of each slot (0: skipped by moe_sum). */
  slotWeight: Buffer;
  /** f32 [S * slotsPerToken][I] scratch. */
  h: Buffer;
  /** f32 [S * slotsPerToken][D] scratch. */
  ypair: Buffer;
  /** f32 [S][D]: Σ over a token's slots of weight · down(silu(gate x) ⊙ up x). */
  y: Buffer;
  /** One uint: the work header's sequence number, written when y is complete. */
  done: Buffer;
  /** Where x and h are quantized on the integer-dot path (required there for lists grouped by expert). */
  quantized?: ExpertQuantScratch;
  /** Called after each step with its name (a profiler's timestamp). */
  mark?: (step: string) => void;
  /**
   * Every item holds one slot (a per-slot list): the call runs 1-slot pipelines. Default: items ===
   * S * slotsPerToken, exact for a list built on the host; a grid sized for the most items a call
   * can have (the decode graph's) says which list it is.
   */
  singleSlotItems?: boolean;
  /**
   * Item u is slot u, one slot each (dec_route's list in the decode graph): down then sums each
   * token's slots itself and writes y (two dispatches, no moe_sum; `done` is not written).
   */
  itemPerSlot?: boolean;
  /** uint [1], zero: the norm tail's arrival word (calls with normTail; each call leaves it zero). */
  control?: Buffer;
  /** An itemPerSlot call also does the next layer's input norm in its last workgroup (see MoeNormTail). */
  normTail?: MoeNormTail;
}

/**
 * The next layer's input norm done by a decode call's last workgroup (down with the slots' sum;
 * shaders/moe_norm_tail.glsl): per token, residual += y, xn = RMSNorm(residual) * weights[wOffset ..],
 * and xn quantized in groups of 16 where `quantized` is given (the integer-dot GEMVs' input, as
 * dec_rmsnorm_quant writes it).
 */
export interface MoeNormTail {
  residual: Buffer;
  weights: Buffer;
  /** Floats; a multiple of 4. */
  wOffset: number;
  eps: number;
  xn: Buffer;
  quantized?: { xq: Buffer; xscale: Buffer; xsum: Buffer };
}

/**
 * The grouped MoE call over GGML block experts of one (gate/up format, down format) pair. The
 * gate+up and down pipelines are made on first use per rows-per-workgroup (which follows the
 * layer's D and I unless given), so one object serves every shape.
 */
export class GgmlExpertKernels implements Disposable {
  readonly gateUpType: GgmlBlockType;
  readonly downType: GgmlBlockType;
  readonly workgroupSize: number;
  readonly tokensPerChunk: number;
  private readonly rowsOption: number | undefined;
  private readonly useSubgroup: boolean;
  private readonly options: GgmlExpertKernelOptions;
  private readonly modes = new Map<string, MoeGgmlKernel>();
  private readonly sum: MoeSumKernel;
  readonly rowsForGrouped: boolean;
  readonly rowsTokens: number;
  /** moe_ggml_rows' lanes a row as given (undefined: rowsLanesFor's default). */
  readonly rowsLanes: number | undefined;
  /** moe_ggml_rows_idp's rows a lane. */
  readonly rowsPerLane: number;
  readonly integerDot: boolean;
  /** moe_ggml_cm's shader for lists grouped by expert (the KHR or NV build, or the emulation); undefined: matrix cores off. */
  private readonly cmShader: ShaderInterface | undefined;
  /** moe_ggml_cm's slots a tile (GgmlExpertKernelOptions.cmSlots). */
  readonly cmSlots: number;
  /** Grouped calls of at least this many tokens take moe_ggml_cm (GgmlExpertKernelOptions.matrixCoresFrom). */
  readonly matrixCoresFrom: number;
  private quantizer: GgmlQuantizeKernel | undefined;
  /** Decode calls may carry the next layer's input norm (GgmlExpertKernelOptions.normTail). */
  readonly normTail: boolean;

  constructor(readonly device: Device, types: { gateUp: GgmlBlockType; down: GgmlBlockType }, options: GgmlExpertKernelOptions = {}) {
    for (const t of [types.gateUp, types.down]) {
      if (!GGML_BLOCK_TYPES.includes(t)) throw new InvalidArgumentError(`no GPU MoE kernel for GGML type ${String(t)}; supported: ${GGML_BLOCK_TYPES.join(", ")}`);
    }
    const wg = options.workgroupSize ?? (device.info.type === 4 ? 8 : 64);
    if (!Number.isInteger(wg) || wg < 1 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two, got ${wg}`);
    const rows = options.rowsPerWorkgroup;
    if (rows !== undefined && (!Number.isInteger(rows) || rows < 1 || rows > 8)) throw new InvalidArgumentError(`rowsPerWorkgroup must be an integer in 1..8, got ${rows}`);
    const tokens = options.tokensPerChunk ?? 4;
    if (!Number.isInteger(tokens) || tokens < 1 || tokens > 8) throw new InvalidArgumentError(`tokensPerChunk must be an integer in 1..8, got ${tokens}`);
    const shared = wg * 2 * (rows ?? 8) * tokens * 4;
    if (shared > device.info.limits.maxComputeSharedMemorySize) throw new InvalidArgumentError(`the reduction needs ${shared} B of shared memory (limit ${device.info.limits.maxComputeSharedMemorySize})`);
    this.gateUpType = types.gateUp;
    this.downType = types.down;
    this.workgroupSize = wg;
    this.tokensPerChunk = tokens;
    this.rowsOption = rows;
    this.useSubgroup = options.useSubgroup ?? device.info.subgroup.arithmetic;
    this.options = options;
    this.rowsForGrouped = options.rowsForGrouped ?? device.info.subgroup.shuffle;
    if (this.rowsForGrouped && !device.info.subgroup.shuffle) throw new InvalidArgumentError(`moe_ggml_rows needs subgroup shuffles in compute shaders, not on ${device.info.name}`);
    this.rowsTokens = options.rowsTokensPerChunk ?? 8;
    if (!Number.isInteger(this.rowsTokens) || this.rowsTokens < 1 || this.rowsTokens > 8) throw new InvalidArgumentError(`rowsTokensPerChunk must be an integer in 1..8, got ${this.rowsTokens}`);
    this.integerDot = options.integerDot ?? false;
    this.rowsLanes = options.rowsLanes;
    this.rowsPerLane = options.rowsPerLane ?? 1;
    if (!Number.isInteger(this.rowsPerLane) || this.rowsPerLane < 1 || this.rowsPerLane > 4) throw new InvalidArgumentError(`rowsPerLane must be an integer in 1..4, got ${this.rowsPerLane}`);
    if (this.rowsLanes !== undefined && (![1, 2, 4, 8].includes(this.rowsLanes) || this.rowsLanes > device.info.subgroup.size)) {
      throw new InvalidArgumentError(`rowsLanes must be 1, 2, 4 or 8 (at most the subgroup size ${device.info.subgroup.size}), got ${this.rowsLanes}`);
    }
    if (this.integerDot && !device.enabled.integerDotProduct) throw new InvalidArgumentError(`the integer-dot GGML experts need shaderIntegerDotProduct, not enabled on ${device.info.name}`);
    if (this.integerDot && !this.rowsForGrouped) throw new InvalidArgumentError("the integer-dot GGML experts run the rows kernel: rowsForGrouped must be on");
    this.normTail = options.normTail ?? false;
    this.cmSlots = options.cmSlots ?? 8;
    this.matrixCoresFrom = options.matrixCoresFrom ?? 1;
    if (!Number.isInteger(this.matrixCoresFrom) || this.matrixCoresFrom < 1) throw new InvalidArgumentError(`matrixCoresFrom must be a positive integer, got ${this.matrixCoresFrom}`);
    if (!(CM_SLOT_TILES as readonly number[]).includes(this.cmSlots)) throw new InvalidArgumentError(`cmSlots must be one of ${CM_SLOT_TILES.join(", ")}, got ${this.cmSlots}`);
    const cmShared = cmSharedBytes(this.cmSlots);
    if (options.matrixCores && cmShared > device.info.limits.maxComputeSharedMemorySize) {
      throw new InvalidArgumentError(`moe_ggml_cm at ${this.cmSlots} slots a tile needs ${cmShared} B of shared memory (limit ${device.info.limits.maxComputeSharedMemorySize})`);
    }
    this.cmShader = options.matrixCores ? matrixCoreShader(device, { cm: MOE_GGML_CM, emulated: MOE_GGML_CM_EMU }, options.matrixCores) : undefined;
    this.sum = new MoeSumKernel(device, options);
  }

  /** Dispatches record() makes for a list grouped by expert of S tokens (the per-slot lists: 2 or 3). */
  groupedDispatches(S = 1): number {
    return this.integerDot && !this.cmFor(S) ? 5 : 3;
  }

  /** Whether a grouped call of S tokens takes moe_ggml_cm. */
  cmFor(S: number): boolean {
    return this.cmShader !== undefined && S >= this.matrixCoresFrom;
  }

  /** Lists grouped by expert run on the matrix cores (moe_ggml_cm, or its emulation). */
  get matrixCores(): boolean {
    return this.cmShader !== undefined;
  }

  /** moe_ggml_cm's pipeline of a mode. */
  private cmMode(gateUp: boolean): MoeGgmlKernel {
    const key = `cm:${gateUp ? "gu" : "down"}`;
    let k = this.modes.get(key);
    if (k === undefined) {
      k = new MoeGgmlKernel(this.device, this.cmShader!, { 0: FORMAT_ID[gateUp ? this.gateUpType : this.downType], 1: gateUp ? 1 : 0, 2: this.cmSlots }, this.options);
      this.modes.set(key, k);
    }
    return k;
  }

  /** moe_ggml_rows' rows a workgroup. */
  private rowsPerRowsWorkgroup(cols: number, idp = false): number {
    return (ROWS_WORKGROUP / this.rowsLanesFor(cols)) * (idp ? this.rowsPerLane : 1);
  }

  /** moe_ggml_rows' lanes a row for rows of `cols` columns (see ROWS_IDP_MIN_SLICES). */
  rowsLanesFor(cols: number): number {
    if (this.rowsLanes !== undefined) return this.rowsLanes;
    if (!this.integerDot) return Math.min(ROWS_LANES, this.device.info.subgroup.size);
    let lanes = Math.min(8, this.device.info.subgroup.size);
    while (lanes > 1 && cols / 32 / lanes < ROWS_IDP_MIN_SLICES) lanes /= 2;
    return lanes;
  }

  /** moe_ggml_rows' (or moe_ggml_rows_idp's) pipeline of a mode. */
  private rowsMode(gateUp: boolean, cols: number, idp = false): MoeGgmlKernel {
    const lanes = this.rowsLanesFor(cols);
    const key = `rows${idp ? "-idp" : ""}:${gateUp ? "gu" : "down"}:${lanes}`;
    let k = this.modes.get(key);
    if (k === undefined) {
      const format = FORMAT_ID[gateUp ? this.gateUpType : this.downType];
      const spec = { 0: ROWS_WORKGROUP, 2: format, 3: this.rowsTokens, 4: gateUp ? 1 : 0, 5: lanes };
      k = new MoeGgmlKernel(this.device, idp ? MOE_GGML_ROWS_IDP : MOE_GGML_ROWS, idp ? { ...spec, 6: this.options.rowsPrefetch ? 1 : 0, 7: this.rowsPerLane } : spec, this.options);
      this.modes.set(key, k);
    }
    return k;
  }

  /** Rows per workgroup of a mode for rows of `cols` columns. */
  rowsPerWorkgroup(cols: number): number {
    return this.rowsOption ?? moeRowsPerWorkgroup(cols / 32, this.workgroupSize);
  }

  private mode(gateUp: boolean, rows: number, tokens: number, downSum = false, normTail = false): MoeGgmlKernel {
    const key = `${gateUp ? "gu" : downSum ? (normTail ? "down-sum-norm" : "down-sum") : "down"}:${rows}:${tokens}`;
    let k = this.modes.get(key);
    if (k === undefined) {
      const format = FORMAT_ID[gateUp ? this.gateUpType : this.downType];
      const spec = { 0: this.workgroupSize, 1: rows, 2: format, 3: tokens, 4: gateUp ? 1 : 0 };
      k = new MoeGgmlKernel(this.device, MOE_GGML, { ...spec, 5: this.useSubgroup ? 1 : 0, 6: downSum ? 1 : 0, 7: normTail ? 1 : 0 }, this.options);
      this.modes.set(key, k);
    }
    return k;
  }

  /** Records gate+up, down and the sum with compute barriers between them (the caller places the ones around the call). */
  record(cb: CommandBuffer, c: GgmlExpertCall): CommandBuffer {
    const L = c.layer, D = L.D, I = L.I;
    if (L.gateUpType !== this.gateUpType || L.downType !== this.downType) {
      throw new InvalidArgumentError(`a ${L.gateUpType}/${L.downType} layer on ${this.gateUpType}/${this.downType} kernels`);
    }
    if (!Number.isInteger(c.S) || c.S < 1) throw new InvalidArgumentError(`S must be a positive integer, got ${c.S}`);
    const slots = c.S * c.slotsPerToken;
    if (!Number.isInteger(c.items) || c.items < 1 || c.items > slots) throw new InvalidArgumentError(`items must be in 1..${slots}, got ${c.items}`);
    checkRange("moe ggml x", c.x, 0, c.S * D);
    checkRange("moe ggml work", c.work, 0, 4 * (1 + c.items));
    checkRange("moe ggml pairs", c.pairs, 0, slots);
    checkRange("moe ggml slot weights", c.slotWeight, 0, slots);
    checkRange("moe ggml h", c.h, 0, slots * I);
    checkRange("moe ggml ypair", c.ypair, 0, slots * D);
    checkRange("moe ggml y", c.y, 0, c.S * D);
    checkRange("moe ggml done", c.done, 0, 1);
    const common = [c.work, c.pairs];
    const mark = (step: string) => c.mark?.(step);
    const Rg = this.rowsPerWorkgroup(D), Rd = this.rowsPerWorkgroup(I);
    // As many items as slots: one slot each (decode's per-slot lists). A 1-slot pipeline then: its
    // registers are sized for one slot, not tokensPerChunk (more workgroups resident per core).
    const single = c.singleSlotItems ?? c.items === slots;
    if (!single && !c.itemPerSlot && this.cmFor(c.S)) {
      this.cmMode(true).record(cb, [c.x, ...common, c.h, c.slotWeight, L.blocks, L.table], I, D, Math.ceil(I / CM_GATE_UP_ROWS), c.items);
      mark("gate+up");
      cb.barrier("computeToCompute");
      this.cmMode(false).record(cb, [c.h, ...common, c.ypair, c.slotWeight, L.blocks, L.table], D, I, Math.ceil(D / CM_DOWN_ROWS), c.items);
      mark("down");
      cb.barrier("computeToCompute");
      this.sum.record(cb, [c.ypair, c.work, c.y, c.slotWeight, c.done], D, c.S);
      mark("sum");
      return cb;
    }
    if (!single && !c.itemPerSlot && this.integerDot) {
      const q = c.quantized;
      if (!q) throw new InvalidArgumentError("the integer-dot GGML experts need an ExpertQuantScratch (quantized) for lists grouped by expert");
      if (q.values < Math.max(c.S * D, slots * I)) throw new InvalidArgumentError(`a quantized scratch of ${q.values} values for x ${c.S} x ${D} and h ${slots} x ${I}`);
      const quantize = (this.quantizer ??= new GgmlQuantizeKernel(this.device, this.options));
      quantize.record(cb, c.x, 0, q, D, c.S);
      mark("quantize x");
      cb.barrier("computeToCompute");
      this.rowsMode(true, D, true).record(cb, [q.xq, ...common, c.h, c.slotWeight, L.blocks, L.table, q.xscale, q.xsum], I, D, Math.ceil(I / this.rowsPerRowsWorkgroup(D, true)), c.items);
      mark("gate+up");
      cb.barrier("computeToCompute");
      quantize.record(cb, c.h, 0, q, I, slots);
      mark("quantize h");
      cb.barrier("computeToCompute");
      this.rowsMode(false, I, true).record(cb, [q.xq, ...common, c.ypair, c.slotWeight, L.blocks, L.table, q.xscale, q.xsum], D, I, Math.ceil(D / this.rowsPerRowsWorkgroup(I, true)), c.items);
      mark("down");
      cb.barrier("computeToCompute");
      this.sum.record(cb, [c.ypair, c.work, c.y, c.slotWeight, c.done], D, c.S);
      mark("sum");
      return cb;
    }
    if (!single && !c.itemPerSlot && this.rowsForGrouped) {
      this.rowsMode(true, D).record(cb, [c.x, ...common, c.h, c.slotWeight, L.blocks, L.table], I, D, Math.ceil(I / this.rowsPerRowsWorkgroup(D)), c.items);
      mark("gate+up");
      cb.barrier("computeToCompute");
      this.rowsMode(false, I).record(cb, [c.h, ...common, c.ypair, c.slotWeight, L.blocks, L.table], D, I, Math.ceil(D / this.rowsPerRowsWorkgroup(I)), c.items);
      mark("down");
      cb.barrier("computeToCompute");
      this.sum.record(cb, [c.ypair, c.work, c.y, c.slotWeight, c.done], D, c.S);
      mark("sum");
      return cb;
    }
    const tokens = single ? 1 : this.tokensPerChunk;
    this.mode(true, Rg, tokens).record(cb, [c.x, ...common, c.h, c.slotWeight, L.blocks, L.table], I, D, Math.ceil(I / Rg), c.items);
    mark("gate+up");
    cb.barrier("computeToCompute");
    if (c.itemPerSlot) {
      if (c.items !== slots) throw new InvalidArgumentError(`a list of an item per slot has ${slots} items, got ${c.items}`);
      if (c.slotsPerToken > MOE_GGML_MAX_SLOTS) throw new InvalidArgumentError(`down sums up to ${MOE_GGML_MAX_SLOTS} slots a token, got ${c.slotsPerToken}`);
      // the token's K slots x I / 32 slices a row shared out over the lanes
      const Rs = this.rowsOption ?? moeRowsPerWorkgroup((c.slotsPerToken * I) / 32, this.workgroupSize);
      const tail = c.normTail;
      const buffers = [c.h, ...common, c.y, c.slotWeight, L.blocks, L.table];
      if (tail) {
        checkNormTail(tail, c.S, D);
        if (!c.control) throw new InvalidArgumentError("a call with the norm tail needs its arrival word (control)");
        checkRange("moe ggml control", c.control, 0, 1);
        buffers.push(c.control, ...tailBindings(tail, c.control));
      }
      this.mode(false, Rs, 1, true, tail !== undefined).record(cb, buffers, D, I, Math.ceil(D / Rs), c.S, tail);
      mark(tail ? "down + sum, next norm" : "down + sum");
      return cb;
    }
    this.mode(false, Rd, tokens).record(cb, [c.h, ...common, c.ypair, c.slotWeight, L.blocks, L.table], D, I, Math.ceil(D / Rd), c.items);
    mark("down");
    cb.barrier("computeToCompute");
    this.sum.record(cb, [c.ypair, c.work, c.y, c.slotWeight, c.done], D, c.S);
    mark("sum");
    return cb;
  }

  [Symbol.dispose](): void {
    for (const k of this.modes.values()) k[Symbol.dispose]();
    this.modes.clear();
    this.quantizer?.[Symbol.dispose]();
    this.sum[Symbol.dispose]();
  }
}

/** Bytes of one expert's three matrices (for sizing). */
export function ggmlExpertBytes(D: number, I: number, gateUp: GgmlBlockType, down: GgmlBlockType): number {
  const g = GGML_BLOCK_LAYOUTS[gateUp], d = GGML_BLOCK_LAYOUTS[down];
  return 2 * I * (D / g.blockElements) * g.blockBytes + D * (I / d.blockElements) * d.blockBytes;
}
