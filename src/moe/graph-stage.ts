/**
 * The MoE layer inside the decode graph (src/graph/): the same kernels as a GpuLayer call, but
 * the slot tables are written on the device by the router kernel (dec_route) from a table of
 * every resident expert's handle, so a whole token runs without a host hop. Only where every
 * routed expert of the layers it serves is resident (nothing is ever uploaded or evicted while
 * the graph runs). A call of few tokens (decode): the fused kernel where the device has float
 * atomics, else [quantize x] + gate+up + [quantize h] + down + sum over one work item per slot (the
 * integer-dot path quantizes x for gate+up and h for down, into the same scratch). A call of more
 * (a prompt chunk): dec_group_experts regroups the slots by expert first, and the grouped kernels
 * read each chosen expert's weights once for all the tokens that chose it: the same kernels as the
 * per-slot path, or (rowsForGrouped) the rows kernels (shaders/moe_rows.glsl, a row per lane, float
 * path, no quantize; slower on the H200, kept as an option), or (matrixCores, for calls of
 * matrixCoresFrom tokens or more) the matrix-core kernels (shaders/moe_pool_cm.glsl).
 */
import { InvalidArgumentError } from "../errors.ts";
import type { CommandBuffer } from "../vk/commands.ts";
import { DescriptorPool, type BufferBinding } from "../vk/descriptors.ts";
import type { VulkanContext } from "../vk/context.ts";
import type { Device } from "../vk/device.ts";
import { Buffer } from "../vk/memory.ts";
import { uploadBytes } from "../vk/transfer.ts";
import { groupedItemsMax, GroupExpertsKernel } from "../kernels/decoder/group-experts.ts";
import { matrixCoreShader } from "../kernels/decoder/quant-gemm.ts";
import { MOE_BINDINGS, MOE_PUSH_BYTES, shaderFile } from "../kernels/shaders.ts";
import type { ExpertPool } from "../pool/expert-pool.ts";
import { packExpert, type ExpertLayout } from "../pool/expert-layout.ts";
import type { QuantMatrix } from "../quant/types.ts";
import { ComputePipeline } from "../vk/pipeline.ts";
import { cmSharedBytes, type MoeNormTail } from "./ggml-experts.ts";
import type { GpuLayer } from "./gpu-layer.ts";
import { cmSlotsFor } from "./prefill-plan.ts";
import { createFusedSharedPipeline, QUANTIZE_WORKGROUP, ROWS_WORKGROUP, SUM_WORKGROUP } from "./shaders.ts";

/** moe_pool_cm's output rows a workgroup: gate+up 64 (each with its gate and up row), down 128. */
const POOL_CM_GATE_UP_ROWS = 64;
const POOL_CM_DOWN_ROWS = 128;

/** The experts of these layers are not all resident: the graph cannot route to them on the device. */
export class ExpertsNotResidentError extends InvalidArgumentError {}

/** Sequence number the graph's calls carry (the completion word is not polled). */
const GRAPH_SEQ = 1;
/** Grouped calls of at most this many tokens keep one work item per slot (no regrouping dispatch). */
const PER_SLOT_TOKENS = 4;

/** How a call of S tokens runs: the fused kernel, grouped over one item per slot, or regrouped by expert. */
export type StagePath = "fused" | "per-slot" | "by-expert";

/** Where dec_route left the call's choices (for regrouping by expert). */
export interface StageRouting {
  chosen: Buffer;
  /** Words: slot u's expert id at chosen[chosenOffset + u]. */
  chosenOffset: number;
  layer: number;
  /** Called after each of the call's steps with its name (a profiler's timestamp; the graph counts the dispatches). */
  mark?: (step: string) => void;
  /** The next layer's input norm, done by the call itself (only where the stage's foldsNorm(S) says it can). */
  normTail?: MoeNormTail;
}

export interface MoeGraphStageOptions {
  layers: number;
  experts: number;
  topK: number;
  /** MoE layers the graph runs (each must have every expert resident). */
  moeLayers: readonly number[];
  /** Tokens per call at most (the fused kernel's grid covers S tokens). */
  maxTokens: number;
  /**
   * Calls regrouped by expert run the rows kernels (default false); false keeps them on the
   * grouped gate+up / down kernels of the per-slot path (tests and benchmarks compare the two).
   */
  rowsForGrouped?: boolean;
  /**
   * Calls regrouped by expert run on the matrix cores (shaders/moe_pool_cm.glsl: true, where the
   * device has cooperative matrices enabled; "emulated": its test variant), ahead of
   * rowsForGrouped. Default false.
   */
  matrixCores?: boolean | "emulated";
  /** With matrixCores: only calls of at least this many tokens run there (default 1: every call regrouped by expert). */
  matrixCoresFrom?: number;
  /**
   * A layer's shared expert (Qwen3.5 MoE), for the fused decode calls to run as one more slot a
   * token: taken where the stage runs fused calls with BDA addressing and the matrices have the
   * routed experts' shape (QuantGraphStage; runsShared says where it did). Undefined: none.
   */
  sharedExperts?: (layer: number) => SharedExpertHost | undefined;
}

/** A shared expert as the host holds it: its matrices, and the row of its sigmoid gate (shared_expert_gate, D floats). */
export interface SharedExpertHost {
  gate: QuantMatrix;
  up: QuantMatrix;
  down: QuantMatrix;
  gateRow: Float32Array;
}

/** What a caller may choose of a graph stage's kernels (MoeGraphStageOptions' choices). */
export type GraphStageChoices = Pick<MoeGraphStageOptions, "rowsForGrouped" | "sharedExperts" | "matrixCores" | "matrixCoresFrom">;

/**
 * What the whole-token graphs (decode-graph.ts, hybrid-graph.ts) record for a MoE layer, whichever
 * experts are behind it (QuantGraphStage: q4/q8 in the expert pool; GgmlGraphStage: GGML blocks as
 * the file holds them). The router kernel (dec_route) writes the slot tables from `table` (uvec2
 * handle per (layer, expert), at tableOffset(l)); `record` then runs the layer's experts.
 */
export interface MoeGraphStage extends Disposable {
  readonly device: Device;
  readonly table: Buffer;
  readonly work: Buffer;
  readonly pairs: Buffer;
  readonly slotWeight: Buffer;
  readonly slotExpert: Buffer;
  /** Decode calls' kernel: fused (float atomics) or grouped. */
  readonly mode: "fused" | "grouped";
  /** The work header's sequence number the router writes. */
  readonly seq: number;
  tableOffset(l: number): number;
  /** Records one call of S tokens x [S][D] -> y [S][D] after the router (the caller places barriers around it). */
  record(cb: CommandBuffer, x: Buffer, y: Buffer, S?: number, routing?: StageRouting): void;
  /** Dispatches a call of S tokens records. */
  dispatches(S?: number): number;
  /**
   * Whether a call of S tokens is one dispatch with no barrier inside (the fused kernel): what the
   * caller records beside it runs alongside all of it, none of it after the call's first step.
   */
  oneStep(S?: number): boolean;
  /**
   * Whether a call of S tokens of this layer runs its shared expert too (one more slot a token:
   * sigmoid(x . gate row) times the shared expert, added into y): the caller then runs no shared
   * expert of its own. Absent: never.
   */
  runsShared?(layer: number, S?: number): boolean;
  /** Whether a call of S tokens can do the next layer's input norm itself (StageRouting.normTail). */
  foldsNorm?(S: number): boolean;
}

/** What openDeviceDecoder / openHybridDecoder need of a GPU expert backend (MoeBackend, GgmlMoeBackend). */
export interface MoeStageSource {
  readonly mode: "gpu" | "cpu";
  readonly why: string;
  readonly context: VulkanContext | undefined;
  /** The graph's stage for these layers: ExpertsNotResidentError unless all their experts are resident. */
  graphStage(moeLayers: readonly number[], maxTokens: number, choices?: GraphStageChoices): MoeGraphStage;
  /** Another submitter shares the queue (the graph's split runs). */
  stopPrelaunch(why: string): void;
  /** On a lost device, wait for abandonGpu() before freeing (the graph frees its objects first). */
  sharedDevice: boolean;
}

/** The graph stage over q4/q8 experts resident in the expert pool. */
export class QuantGraphStage implements MoeGraphStage {
  readonly device: Device;
  /** uvec2 per (layer, expert): the expert's handle as the kernels read it (BDA address, or slab element and offset). */
  readonly table: Buffer;
  readonly work: Buffer;
  readonly pairs: Buffer;
  readonly slotWeight: Buffer;
  readonly slotExpert: Buffer;
  /** Decode calls' kernel: fused where the device has float atomics, else grouped. */
  readonly mode: "fused" | "grouped";
  readonly experts: number;
  readonly topK: number;
  /** Calls regrouped by expert run the rows kernels (MoeGraphStageOptions.rowsForGrouped). */
  readonly rowsForGrouped: boolean;
  private readonly done: Buffer;
  private readonly arrived: Buffer;
  private readonly yacc: Buffer | undefined;
  private readonly gate: Buffer;
  private readonly h: Buffer;
  private readonly ypair: Buffer;
  private readonly quantized: { xq: Buffer; xscale: Buffer; xsum: Buffer } | undefined;
  /**
   * quantize_act over x: GpuLayer's push with this stage's tokens (the per-layer call's say 64: a
   * longer prompt chunk's later tokens were left unquantized, their gate+up read stale rows).
   */
  private readonly quantizeX: Uint32Array | undefined;
  /** quantize_act over h (the integer-dot down's input): push I, slots, groups a row, offset 0, xq words a row; threads a slot. */
  private readonly quantizeH: { push: Uint32Array; threadsPerSlot: number } | undefined;
  private readonly descriptors: DescriptorPool;
  private readonly groupKernel: GroupExpertsKernel;
  private readonly sets = new Map<string, bigint[]>();
  private readonly owned: Buffer[] = [];
  /** moe_pool_cm's gate+up and down pipelines (MoeGraphStageOptions.matrixCores) and its slots a tile (BN): as many as a prompt chunk of maxTokens gives an expert. */
  private readonly cm: { gateUp: ComputePipeline; down: ComputePipeline; slots: number } | undefined;
  /** Calls of at least this many tokens take `cm` (MoeGraphStageOptions.matrixCoresFrom). */
  private readonly cmFrom: number;
  /** The shared experts' blobs and gate rows, the fused kernel that runs them, and each layer's push constants. */
  private readonly shared: { pipeline: ComputePipeline; gateRows: Buffer; push: Map<number, Uint32Array> } | undefined;

  constructor(device: Device, pool: ExpertPool, private readonly layer: GpuLayer, opts: MoeGraphStageOptions) {
    this.device = device;
    const E = (this.experts = opts.experts), K = (this.topK = opts.topK);
    // off by default: on the H200 (2026-12-03) a Qwen3.6-like Q4_0 64-token chunk took 867 µs a
    // layer in the rows kernels against 377 in the grouped integer-dot ones
    this.rowsForGrouped = opts.rowsForGrouped ?? false;
    const S = opts.maxTokens;
    const bda = pool.addressing === "bda";
    const handles = new Uint32Array(2 * opts.layers * E);
    for (const l of opts.moeLayers) {
      for (let e = 0; e < E; e++) {
        const r = pool.cache.get(l, e);
        if (!r) throw new ExpertsNotResidentError(`expert ${e} of layer ${l} is not resident`);
        handles[2 * (l * E + e)] = bda ? r.addressLo : layer.slotOf(r.allocation.slab);
        handles[2 * (l * E + e) + 1] = bda ? r.addressHi : r.allocation.offset / 16;
      }
    }
    const buf = (bytes: number, memory: "device" | "upload" = "device") => {
      const b = new Buffer(device, { size: BigInt(Math.max(16, bytes)), memory, priority: 1 });
      this.owned.push(b);
      return b;
    };
    const D = layer.D, I = layer.I, slots = S * K;
    this.table = buf(handles.byteLength);
    uploadBytes(device, this.table, 0n, new Uint8Array(handles.buffer));
    this.work = buf(16 * (1 + slots));
    this.pairs = buf(4 * slots);
    this.slotWeight = buf(4 * slots);
    this.slotExpert = buf(8 * slots);
    this.done = buf(16);
    this.gate = buf(16);
    this.arrived = buf(16);
    const p = layer.pipelines;
    this.mode = p.fused ? "fused" : "grouped";
    this.yacc = p.fused ? buf(4 * Math.min(S, layer.fusedTokens) * D) : undefined;
    this.h = buf(4 * slots * I);
    this.ypair = buf(4 * slots * D);
    if (p.quantize) {
      // x [S][D], then (grouped calls) h [slots][I]: quantize_act's rows of each, in turn
      const gs = pool.layout.shape.groupSize;
      const words = Math.max(S * Math.ceil(D / 16) * 4, slots * Math.ceil(I / 16) * 4);
      const groups = Math.max(S * Math.ceil(D / gs), slots * Math.ceil(I / gs));
      this.quantized = { xq: buf(4 * words), xscale: buf(4 * groups), xsum: buf(4 * groups) };
      this.quantizeX = layer.pushQuantize.slice();
      this.quantizeX[1] = S;
      if (p.downIdp) this.quantizeH = { push: new Uint32Array([I, slots, Math.ceil(I / gs), 0, Math.ceil(I / 16) * 4]), threadsPerSlot: Math.ceil(I / gs) * (gs / 4) };
    }
    // The fused kernel's count and sums start at 0 (its last workgroup zeroes them again); the
    // rest is zeroed so that no kernel ever reads undefined memory.
    for (const b of this.owned) if (b !== this.table) uploadBytes(device, b, 0n, new Uint8Array(Number(b.size)));
    this.descriptors = new DescriptorPool(device, 16, 16 * (10 + p.maxSlabs));
    this.groupKernel = new GroupExpertsKernel(device);
    this.shared = this.mode === "fused" && bda && opts.sharedExperts ? this.placeShared(pool.layout, opts.moeLayers, opts.sharedExperts) : undefined;
    this.cmFrom = opts.matrixCoresFrom ?? 1;
    try {
      this.cm = opts.matrixCores ? this.createCm(pool, opts.matrixCores, cmSlotsFor(opts.maxTokens)) : undefined;
    } catch (e) {
      this[Symbol.dispose]();
      throw e;
    }
  }

  /** Whether calls regrouped by expert (of matrixCoresFrom tokens or more) run on the matrix cores (moe_pool_cm). */
  get matrixCores(): boolean {
    return this.cm !== undefined;
  }

  /** moe_pool_cm's pipelines for this pool's shape and addressing (the rows kernels' bindings and push constants). */
  private createCm(pool: ExpertPool, matrixCores: true | "emulated", slots: number) {
    const { format, scaleType, groupSize } = pool.layout.shape;
    const name = `moe_pool_${pool.addressing === "bda" ? "bda" : "desc"}_cm`;
    const shader = matrixCoreShader(this.device, {
      cm: { name, storageBuffers: MOE_BINDINGS, pushConstantBytes: MOE_PUSH_BYTES },
      emulated: { name: `${name}_emu`, storageBuffers: MOE_BINDINGS, pushConstantBytes: MOE_PUSH_BYTES },
    }, matrixCores);
    const shared = cmSharedBytes(slots);
    if (shared > this.device.info.limits.maxComputeSharedMemorySize) throw new InvalidArgumentError(`moe_pool_cm needs ${shared} B of shared memory (limit ${this.device.info.limits.maxComputeSharedMemorySize})`);
    const maxSlabs = this.layer.pipelines.maxSlabs;
    const make = (gateUp: boolean) => {
      const spec: Record<number, number> = { 1: gateUp ? 1 : 0, 2: format === "q4" ? 4 : 8, 3: scaleType === "f16" ? 1 : 0, 4: groupSize, 5: slots };
      if (maxSlabs === 0) return new ComputePipeline(this.device, { spirv: shaderFile(shader.name), storageBuffers: MOE_BINDINGS, pushConstantBytes: MOE_PUSH_BYTES, specialization: spec });
      return new ComputePipeline(this.device, {
        spirv: shaderFile(shader.name), storageBuffers: MOE_BINDINGS + 1, pushConstantBytes: MOE_PUSH_BYTES,
        descriptorCounts: [...Array.from({ length: MOE_BINDINGS }, () => 1), maxSlabs], specialization: { ...spec, 8: maxSlabs },
      });
    };
    const gateUp = make(true);
    try {
      return { gateUp, down: make(false), slots };
    } catch (e) {
      gateUp[Symbol.dispose]();
      throw e;
    }
  }

  /**
   * Each layer's shared expert that has the routed experts' shape, packed as one of them into a
   * buffer of its own (their addresses go to the kernel as push constants), and the gate rows; the
   * fused kernel with the shared slot. Undefined where no layer has one that fits.
   */
  private placeShared(layout: ExpertLayout, moeLayers: readonly number[], source: (l: number) => SharedExpertHost | undefined) {
    const { format, groupSize, scaleType, hidden: D, intermediate: I } = layout.shape;
    const fits = (m: QuantMatrix, rows: number, cols: number) => m.format === format && m.groupSize === groupSize && m.scaleType === scaleType && m.rows === rows && m.cols === cols;
    const hosts = moeLayers.flatMap((l) => {
      const h = source(l);
      return h && fits(h.gate, I, D) && fits(h.up, I, D) && fits(h.down, D, I) && h.gateRow.length === D ? [{ l, h }] : [];
    });
    if (hosts.length === 0) return undefined;
    const blobs = new Buffer(this.device, { size: BigInt(hosts.length * layout.bytes), memory: "device", deviceAddress: true, priority: 1 });
    this.owned.push(blobs);
    const gateRows = new Buffer(this.device, { size: BigInt(4 * hosts.length * D), memory: "device", priority: 1 });
    this.owned.push(gateRows);
    const bytes = new Uint8Array(hosts.length * layout.bytes), rows = new Float32Array(hosts.length * D);
    const push = new Map<number, Uint32Array>();
    hosts.forEach(({ l, h }, i) => {
      packExpert(layout, h.gate, h.up, h.down, bytes.subarray(i * layout.bytes, (i + 1) * layout.bytes));
      rows.set(h.gateRow, i * D);
      const address = blobs.address + BigInt(i * layout.bytes);
      const words = new Uint32Array(16);
      words.set(this.layer.pushFused);
      words.set([Number(address & 0xffffffffn), Number(address >> 32n), i * D], 13);
      push.set(l, words);
    });
    uploadBytes(this.device, blobs, 0n, bytes);
    uploadBytes(this.device, gateRows, 0n, new Uint8Array(rows.buffer));
    // last: the buffers above are owned (disposed with the stage) whatever happens here
    const pipeline = createFusedSharedPipeline(this.device, this.layer.config, layout.shape, this.layer.pipelines.path);
    return { pipeline, gateRows, push };
  }

  oneStep(S = 1): boolean {
    return this.pathFor(S) === "fused";
  }

  runsShared(layer: number, S = 1): boolean {
    return this.shared?.push.has(layer) === true && this.pathFor(S) === "fused";
  }

  /** How a call of S tokens runs (see the module comment). */
  pathFor(S: number): StagePath {
    if (this.mode === "fused" && S <= this.layer.fusedTokens) return "fused";
    return S <= PER_SLOT_TOKENS ? "per-slot" : "by-expert";
  }

  /** Element of `table` where layer l's handles start (uvec2 units). */
  tableOffset(l: number): number {
    return l * this.experts;
  }

  private slabs(stage: BufferBinding[]): (BufferBinding | BufferBinding[])[] {
    return this.layer.pipelines.maxSlabs > 0 ? [...stage, this.layer.slabArray(this.gate)] : stage;
  }

  private setsFor(x: Buffer, y: Buffer, kernels: "fused" | "fused-shared" | "grouped" | "rows" | "cm"): bigint[] {
    const key = `${x.handle}/${y.handle}/${kernels}`;
    let sets = this.sets.get(key);
    if (sets) return sets;
    const p = this.layer.pipelines;
    const b = (buffer: Buffer) => ({ buffer });
    if (kernels === "rows" || kernels === "cm") {
      // The float path's gate+up bindings (x itself, not its quantized rows), whatever the path.
      const [gu, dn] = kernels === "cm" ? [this.cm!.gateUp, this.cm!.down] : [p.rowsGateUp, p.rowsDown];
      sets = [
        this.descriptors.allocate(gu, this.slabs([x, this.work, this.pairs, this.h, this.slotWeight].map(b))),
        this.descriptors.allocate(dn, this.slabs([this.h, this.work, this.pairs, this.ypair, this.slotWeight].map(b))),
        this.descriptors.allocate(p.sum, [this.ypair, this.work, y, this.slotWeight, this.done].map(b)),
      ];
    } else if (kernels === "fused") {
      sets = [this.descriptors.allocate(p.fused!, this.slabs([x, this.work, this.slotExpert, y, this.slotWeight, this.done, this.arrived, this.yacc!, this.gate].map(b)))];
    } else if (kernels === "fused-shared") {
      sets = [this.descriptors.allocate(this.shared!.pipeline, [x, this.work, this.slotExpert, y, this.slotWeight, this.done, this.arrived, this.yacc!, this.gate, this.shared!.gateRows].map(b))];
    } else {
      const q = this.quantized;
      const gateUp = [q ? q.xq : x, this.work, this.pairs, this.h, this.slotWeight, ...(q ? [q.xscale, q.xsum] : [])].map(b);
      // the integer-dot path: x quantized for gate+up, then h for down, into the same scratch
      const down = p.downIdp && this.quantizeH && q
        ? [this.descriptors.allocate(p.quantize!, [this.h, q.xq, q.xscale, q.xsum].map(b)), this.descriptors.allocate(p.downIdp, this.slabs([q.xq, this.work, this.pairs, this.ypair, this.slotWeight, q.xscale, q.xsum].map(b)))]
        : [this.descriptors.allocate(p.down, this.slabs([this.h, this.work, this.pairs, this.ypair, this.slotWeight].map(b)))];
      sets = [
        ...(p.quantize && q ? [this.descriptors.allocate(p.quantize, [x, q.xq, q.xscale, q.xsum].map(b))] : []),
        this.descriptors.allocate(p.gateUp, this.slabs(gateUp)),
        ...down,
        this.descriptors.allocate(p.sum, [this.ypair, this.work, y, this.slotWeight, this.done].map(b)),
      ];
    }
    this.sets.set(key, sets);
    return sets;
  }

  /**
   * Records one call of S tokens reading x [S][D] and writing y [S][D], after the router kernel
   * wrote the slot tables (the caller places a compute barrier between them, and after this).
   * Calls regrouped by expert (`pathFor(S)`) read the router's choices from `routing`.
   */
  record(cb: CommandBuffer, x: Buffer, y: Buffer, S = 1, routing?: StageRouting): void {
    const L = this.layer, p = L.pipelines, K = this.topK;
    const path = this.pathFor(S);
    const rows = path === "by-expert" && this.rowsForGrouped;
    const shared = routing && this.runsShared(routing.layer, S) ? this.shared! : undefined;
    if (shared) {
      // the router's K slots a token, then the shared expert's
      const set = this.setsFor(x, y, "fused-shared")[0]!;
      cb.bind(shared.pipeline, set).pushConstants(shared.pipeline, shared.push.get(routing!.layer)!).dispatch(Math.ceil(L.I / p.fusedBlockRows), K + 1, S);
      routing?.mark?.("fused + shared expert");
      return;
    }
    const cm = path === "by-expert" && S >= this.cmFrom ? this.cm : undefined;
    const sets = this.setsFor(x, y, path === "fused" ? "fused" : cm ? "cm" : rows ? "rows" : "grouped");
    if (path === "fused") {
      cb.bind(p.fused!, sets[0]!).pushConstants(p.fused!, L.pushFused).dispatch(Math.ceil(L.I / p.fusedBlockRows), K, S);
      routing?.mark?.("fused");
      return;
    }
    let items = S * K;
    if (path === "by-expert") {
      if (!routing) throw new InvalidArgumentError(`a call of ${S} tokens is regrouped by expert: it needs the router's choices (routing)`);
      this.groupKernel.record(cb, {
        chosen: routing.chosen, table: this.table, work: this.work, pairs: this.pairs, slotWeight: this.slotWeight,
        S, E: this.experts, k: K, seq: GRAPH_SEQ, chosenOffset: routing.chosenOffset, tableOffset: this.tableOffset(routing.layer),
        ...(cm && { maxSlots: cm.slots }),
      });
      routing.mark?.("group");
      cb.barrier("computeToCompute");
      // moe_pool_cm: items of at most one slot tile (an expert many tokens chose is split over workgroups)
      items = cm ? groupedItemsMax(S, this.experts, K, cm.slots) : Math.min(items, this.experts);
    }
    const mark = (step: string) => routing?.mark?.(step);
    if (cm || rows) {
      // the matrix-core kernels or the rows kernels: gate+up and down on the float path's bindings, then the sum
      const [gateUp, down] = cm ? [cm.gateUp, cm.down] : [p.rowsGateUp, p.rowsDown];
      const [gateUpRows, downRows] = cm ? [POOL_CM_GATE_UP_ROWS, POOL_CM_DOWN_ROWS] : [ROWS_WORKGROUP, ROWS_WORKGROUP];
      cb.bind(gateUp, sets[0]!).pushConstants(gateUp, L.pushGateUp).dispatch(Math.ceil(L.I / gateUpRows), items);
      mark("gate+up");
      cb.barrier("computeToCompute").bind(down, sets[1]!).pushConstants(down, L.pushDown).dispatch(Math.ceil(L.D / downRows), items);
      mark("down");
      cb.barrier("computeToCompute").bind(p.sum, sets[2]!).pushConstants(p.sum, L.pushSum).dispatch(Math.ceil((S * L.D) / SUM_WORKGROUP));
      mark("sum");
      return;
    }
    let i = 0;
    if (p.quantize) {
      cb.bind(p.quantize, sets[i++]!).pushConstants(p.quantize, this.quantizeX!).dispatch(Math.ceil((S * L.quantizeThreadsPerToken) / QUANTIZE_WORKGROUP));
      mark("quantize x");
      cb.barrier("computeToCompute");
    }
    cb.bind(p.gateUp, sets[i++]!).pushConstants(p.gateUp, L.pushGateUp).dispatch(Math.ceil(L.I / L.rows), items);
    mark("gate+up");
    cb.barrier("computeToCompute");
    const qh = this.quantizeH;
    if (p.downIdp && qh) {
      cb.bind(p.quantize!, sets[i++]!).pushConstants(p.quantize!, qh.push).dispatch(Math.ceil((S * K * qh.threadsPerSlot) / QUANTIZE_WORKGROUP));
      mark("quantize h");
      cb.barrier("computeToCompute").bind(p.downIdp, sets[i++]!).pushConstants(p.downIdp, L.pushDown).dispatch(Math.ceil(L.D / p.downBlockRows), items);
    } else {
      cb.bind(p.down, sets[i++]!).pushConstants(p.down, L.pushDown).dispatch(Math.ceil(L.D / p.downBlockRows), items);
    }
    mark("down");
    cb.barrier("computeToCompute").bind(p.sum, sets[i++]!).pushConstants(p.sum, L.pushSum).dispatch(Math.ceil((S * L.D) / SUM_WORKGROUP));
    mark("sum");
  }

  /** Dispatches a call of S tokens records. */
  dispatches(S = 1): number {
    const path = this.pathFor(S);
    if (path === "fused") return 1;
    if (path === "by-expert" && (this.rowsForGrouped || (this.cm && S >= this.cmFrom))) return 4;  // group, rows (or cm) gate+up and down, sum
    // [quantize x] + gate+up + [quantize h] + down + sum (+ the regrouping)
    const p = this.layer.pipelines;
    return 3 + (p.quantize ? 1 : 0) + (this.quantizeH ? 1 : 0) + (path === "by-expert" ? 1 : 0);
  }

  get seq(): number {
    return GRAPH_SEQ;
  }

  [Symbol.dispose](): void {
    this.shared?.pipeline[Symbol.dispose]();
    this.cm?.gateUp[Symbol.dispose]();
    this.cm?.down[Symbol.dispose]();
    this.groupKernel[Symbol.dispose]();
    this.descriptors[Symbol.dispose]();
    for (const b of this.owned) b[Symbol.dispose]();
    this.owned.length = 0;
  }
}
