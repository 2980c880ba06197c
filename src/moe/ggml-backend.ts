/**
 * Routed experts stored as GGML blocks (the Q4_K / Q5_K / Q6_K / Q5_0 ... experts of K-quant GGUF
 * files) on the GPU: every expert of every such layer uploaded at load as the file holds it
 * (GgmlExpertLayer: no repack), run by the grouped kernels of ggml-experts.ts, one pipeline set per
 * (gate/up type, down type) pair the file's layers use (a Q4_K_M file: Q4_K/Q4_K and Q4_K/Q6_K).
 *
 * Two call paths, as MoeBackend has: `forward(layer, x, routing, y)` (the per-layer MoE call: one
 * submit and one wait) and `graphStage(...)`, the decode graphs' MoE stage (GgmlGraphStage: the
 * router kernel's work list straight into the same kernels, no host hop). Resident only: `open`
 * falls back to the CPU (the caller's `cpu` runner) with one line saying why when the experts do not
 * fit the budget, or the GPU cannot be opened; a lost device moves every later call there too.
 */
import { readConfig, type VkmoeEnv } from "../config.ts";
import { InvalidArgumentError, VkmoeError } from "../errors.ts";
import { matrixCoresPass } from "../kernels/decoder/coopmat-check.ts";
import { groupedItemsMax, GroupExpertsKernel } from "../kernels/decoder/group-experts.ts";
import { planKernels } from "../kernels/setup.ts";
import { computeBudget } from "../pool/budget.ts";
import type { GgmlBlockType } from "../quant/ggml-blocks.ts";
import { GgufLayoutError, NonFiniteValueError } from "../quant/errors.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import { VulkanContext } from "../vk/context.ts";
import type { Device } from "../vk/device.ts";
import { DeviceLostError } from "../vk/errors.ts";
import { Buffer } from "../vk/memory.ts";
import { Fence, Submission } from "../vk/sync.ts";
import { uploadBytes } from "../vk/transfer.ts";
import type { MoeStats } from "./backend.ts";
import { ExpertQuantScratch, ggmlExpertBytes, GgmlExpertKernels, GgmlExpertLayer, MOE_GGML_MAX_SLOTS, writeWorkList, type GgmlExpertTensors } from "./ggml-experts.ts";
import { ExpertsNotResidentError, type MoeGraphStage, type MoeStageSource, type StageRouting } from "./graph-stage.ts";
import { checkRouting, MAX_TOKENS, WorkList, type Routing } from "./routing.ts";
import { cmSlotsFor, prefillPlan } from "./prefill-plan.ts";

const MiB = 2 ** 20, GiB = 2 ** 30;
const size = (bytes: number) => (bytes >= GiB ? `${(bytes / GiB).toFixed(1)} GiB` : `${(bytes / MiB).toFixed(1)} MiB`);
/** Grouped calls of at most this many tokens keep one work item per slot (as QuantGraphStage). */
const PER_SLOT_TOKENS = 4;
/**
 * Prompt chunks' work items hold at most this many slots (dec_group_experts' maxSlots): an expert
 * many tokens chose is split over several workgroups instead of being the dispatch's long tail. 8 is
 * the rows kernels' register chunk (measured: README, "a prompt chunk's experts").
 */
const ITEM_SLOTS = 8;
/** The graph's work header sequence number (the completion word is not polled). */
const GRAPH_SEQ = 1;

/** A (gate/up, down) type pair, the key of its kernels. */
const pairKey = (gateUp: GgmlBlockType, down: GgmlBlockType) => `${gateUp}/${down}`;

/** The per-layer call's CPU path (the runner's CpuExperts): where calls go without the GPU. */
export interface ExpertForward {
  forward(layer: number, x: Float32Array, r: Routing, y: Float32Array): void;
}

export interface GgmlMoeOptions {
  hidden: number;
  intermediate: number;
  experts: number;
  topK: number;
  /** All layers of the model (graph tables are indexed by layer). */
  layers: number;
  /** The layers whose experts run here. */
  moeLayers: readonly number[];
  /** Expert e of layer l as the file holds it (types per layer: gate and up alike, down its own). */
  tensors: (layer: number, expert: number) => GgmlExpertTensors;
  /** Calls without the GPU (it could not open, the experts do not fit, the device was lost). */
  cpu: ExpertForward;
  /** Device memory for experts, MiB; default from the driver (VKMOE_BUDGET_MB overrides both). */
  budgetMB?: number;
  /** Bytes of the driver's default budget kept for the decode graph's dense weights and KV cache. */
  reserveBytes?: number;
  syncValidation?: boolean;
  /** Lists grouped by expert (prompt chunks) on the integer-dot rows kernel (default: the integer-dot decision, planKernels, where the device has subgroup shuffles). */
  integerDot?: boolean;
  /**
   * Lists grouped by expert (prompt chunks) on the matrix cores, moe_ggml_cm, where cooperative
   * matrices are enabled (VKMOE_COOPMAT) and the self-check passes (ahead of integerDot for those
   * lists), every such call. Default: the prefill plan (src/moe/prefill-plan.ts: VKMOE_MOE_COOPMAT,
   * calls of 256 tokens or more where the matrix cores pass their self-check).
   */
  matrixCores?: boolean;
  /** After each layer's upload. */
  progress?: (layer: number) => void;
  log?: (line: string) => void;
}

interface GpuState {
  ctx: VulkanContext;
  /** Per model layer, undefined where the layer's experts are not here. */
  layers: (GgmlExpertLayer | undefined)[];
  kernels: Map<string, GgmlExpertKernels>;
  call: CallBuffers;
  bytes: number;
}

/** The per-layer call's buffers, command buffer and fence: made once, reused by every call. */
class CallBuffers implements Disposable {
  readonly x: Buffer;
  readonly work: Buffer;
  readonly pairs: Buffer;
  readonly slotWeight: Buffer;
  readonly h: Buffer;
  readonly ypair: Buffer;
  readonly y: Buffer;
  readonly done: Buffer;
  /** x and h quantized (the integer-dot path). */
  readonly quantized: ExpertQuantScratch | undefined;
  readonly views: { x: Float32Array; work: Uint32Array; pairs: Uint32Array; slotWeight: Float32Array; y: Float32Array };
  readonly pool: CommandPool;
  readonly cb: CommandBuffer;
  readonly fence: Fence;
  readonly submission: Submission;
  private readonly owned = new DisposableStack();

  constructor(device: Device, D: number, I: number, slots: number, integerDot: boolean) {
    try {
      const buf = (bytes: number, memory: "device" | "upload" | "readback") => this.owned.use(new Buffer(device, { size: BigInt(Math.max(16, bytes)), memory }));
      const S = MAX_TOKENS;
      this.x = buf(4 * S * D, "upload");
      this.work = buf(16 * (1 + slots), "upload");
      this.pairs = buf(4 * slots, "upload");
      this.slotWeight = buf(4 * slots, "upload");
      this.h = buf(4 * slots * I, "device");
      this.ypair = buf(4 * slots * D, "device");
      this.y = buf(4 * S * D, "readback");
      this.done = buf(16, "readback");
      this.quantized = integerDot ? this.owned.use(new ExpertQuantScratch(device, D, I, S, slots / S)) : undefined;
      this.views = {
        x: new Float32Array(this.x.host(), 0, S * D), work: new Uint32Array(this.work.host(), 0, 4 * (1 + slots)),
        pairs: new Uint32Array(this.pairs.host(), 0, slots), slotWeight: new Float32Array(this.slotWeight.host(), 0, slots),
        y: new Float32Array(this.y.host(), 0, S * D),
      };
      this.pool = this.owned.use(new CommandPool(device));
      this.cb = this.pool.allocate();
      this.fence = this.owned.use(new Fence(device));
      this.submission = this.owned.use(new Submission(device, [this.cb], { fence: this.fence }));
    } catch (e) {
      this.owned.dispose();
      throw e;
    }
  }

  [Symbol.dispose](): void {
    this.owned.dispose();
  }
}

export class GgmlMoeBackend implements Disposable, MoeStageSource {
  private gpu: GpuState | undefined;
  private whyCpu = "";
  private readonly work: WorkList;
  private readonly log: (line: string) => void;
  private counters = { calls: 0, gpuPairs: 0, cpuPairs: 0 };
  private injectLost = false;
  private heldAfterLoss: GpuState | undefined;
  private seq = 0;
  private names: string | undefined;
  sharedDevice = false;

  private constructor(readonly options: GgmlMoeOptions) {
    this.log = options.log ?? ((line) => console.error(line));
    this.work = new WorkList(options.experts, MAX_TOKENS * options.topK);
  }

  /** Opens the GPU path and uploads every expert of `moeLayers`, or the CPU path with one line saying why. */
  static open(options: GgmlMoeOptions, env: VkmoeEnv = readConfig()): GgmlMoeBackend {
    const { hidden: D, intermediate: I, experts: E, topK } = options;
    if (!Number.isInteger(E) || E < 1 || !Number.isInteger(topK) || topK < 1 || topK > E) throw new InvalidArgumentError(`experts ${E} and topK ${topK}: need 1 <= topK <= experts`);
    const backend = new GgmlMoeBackend(options);
    backend.typeNames();
    if (!env.VKMOE_GPU) backend.toCpu("VKMOE_GPU=0");
    else {
      try {
        backend.gpu = backend.openGpu(env, D, I);
      } catch (e) {
        // bad file data (a NaN block scale, a short tensor) is the file's error, not the GPU's
        if (!(e instanceof VkmoeError) || e instanceof NonFiniteValueError || e instanceof GgufLayoutError) throw e;
        backend.toCpu(e.message.replace(/\s*\n\s*/g, "; "));
      }
    }
    return backend;
  }

  /** The types of layer l's experts (from expert 0; GgmlExpertLayer checks the others). */
  private typesOf(l: number): { gateUp: GgmlBlockType; down: GgmlBlockType } {
    const t = this.options.tensors(l, 0);
    if (t.gate.type !== t.up.type) throw new InvalidArgumentError(`layer ${l}: gate ${t.gate.type} and up ${t.up.type} experts differ; the GPU kernel takes one type for both`);
    return { gateUp: t.gate.type, down: t.down.type };
  }

  private openGpu(env: VkmoeEnv, D: number, I: number): GpuState | undefined {
    const o = this.options;
    const types = o.moeLayers.map((l) => this.typesOf(l));
    const bytes = types.reduce((n, t) => n + o.experts * ggmlExpertBytes(D, I, t.gateUp, t.down), 0);
    const ctx = new VulkanContext({ syncValidation: o.syncValidation ?? false }, env);
    const made: Disposable[] = [];
    try {
      const device = ctx.device;
      const explicit = env.VKMOE_BUDGET_MB !== undefined || o.budgetMB !== undefined;
      const budget = env.VKMOE_BUDGET_MB !== undefined || o.budgetMB === undefined
        ? computeBudget(device, { overrideMB: env.VKMOE_BUDGET_MB, ignoreBudgetExtension: env.VKMOE_IGNORE_BUDGET_EXT }).bytes
        : o.budgetMB * 2 ** 20;
      const budgetBytes = Math.floor(explicit ? budget : Math.max(0, budget - (o.reserveBytes ?? 0)));
      if (bytes > budgetBytes) {
        ctx[Symbol.dispose]();
        this.toCpu(`${size(bytes)} do not fit the GPU budget of ${size(budgetBytes)} (they run resident or not at all)`);
        return undefined;
      }
      const kernels = new Map<string, GgmlExpertKernels>();
      const layers: (GgmlExpertLayer | undefined)[] = Array.from({ length: o.layers }, () => undefined);
      // The integer-dot decision of the GEMV kernels (VKMOE_IDP, blocklist, child-process probe) picks the prompt chunks' path.
      const integerDot = device.info.subgroup.shuffle && device.enabled.integerDotProduct && (o.integerDot ?? planKernels(device, env).integerDot.on);
      // prompt chunks' experts on the matrix cores (prefill-plan.ts: calls of 256 tokens or more under
      // VKMOE_MOE_COOPMAT=auto); an explicit matrixCores takes every grouped call
      const plan = prefillPlan(device, env);
      const from = o.matrixCores === undefined ? plan.expertsOnMatrixCoresFrom : o.matrixCores && device.enabled.cooperativeMatrix && matrixCoresPass(device) ? 1 : undefined;
      const matrixCores = from !== undefined, cmSlots = cmSlotsFor(plan.chunk);
      for (const [i, l] of o.moeLayers.entries()) {
        const t = types[i]!, key = pairKey(t.gateUp, t.down);
        if (!kernels.has(key)) {
          const k = new GgmlExpertKernels(device, t, { maxSets: 4 * o.layers + 8, integerDot, matrixCores, cmSlots, matrixCoresFrom: from, normTail: env.VKMOE_NORM_TAIL === "on" });
          made.push(k);
          kernels.set(key, k);
        }
        const layer = new GgmlExpertLayer(device, Array.from({ length: o.experts }, (_, e) => o.tensors(l, e)));
        made.push(layer);
        layers[l] = layer;
        o.progress?.(l);
      }
      const call = new CallBuffers(device, D, I, MAX_TOKENS * o.topK, integerDot && !(matrixCores && from === 1));
      made.push(call);
      return { ctx, layers, kernels, call, bytes };
    } catch (e) {
      for (const m of made.reverse()) m[Symbol.dispose]();
      ctx[Symbol.dispose]();
      throw e;
    }
  }

  private toCpu(why: string): void {
    this.whyCpu = why;
    this.log(`vkmoe: ${this.typeNames()} experts run on the CPU: ${why}`);
  }

  /** "Q4_K/Q6_K": the distinct types of this backend's layers (read once: `why` is read often, the experts may be released). */
  private typeNames(): string {
    if (this.names !== undefined) return this.names;
    const names = new Set<string>();
    for (const l of this.options.moeLayers) {
      const t = this.options.tensors(l, 0);
      names.add(t.gate.type).add(t.up.type).add(t.down.type);
    }
    return (this.names = [...names].sort().join("/"));
  }

  get mode(): "gpu" | "cpu" {
    return this.gpu ? "gpu" : "cpu";
  }

  get why(): string {
    const g = this.gpu;
    if (!g) return `${this.typeNames()} experts run on the CPU: ${this.whyCpu}`;
    const pairs = [...g.kernels.keys()].join(", ");
    return `GPU: ${g.ctx.device.info.name}, ${this.typeNames()} experts resident as the file holds them (${size(g.bytes)}; ${pairs})`;
  }

  get context(): VulkanContext | undefined {
    return this.gpu?.ctx;
  }

  /** Pipelines of (gate/up, down) pairs, "Q4_K/Q6_K" (tests). */
  get kernelPairs(): string[] {
    return [...(this.gpu?.kernels.keys() ?? [])];
  }

  takeValidationMessages(): string[] {
    return (this.gpu?.ctx.instance.takeMessages() ?? []).map((m) => `[${m.severity}] ${m.idName}: ${m.message}`);
  }

  graphStage(moeLayers: readonly number[], maxTokens: number): MoeGraphStage {
    const g = this.gpu;
    if (!g) throw new InvalidArgumentError(`the MoE layer runs on the CPU (${this.whyCpu})`);
    const missing = moeLayers.find((l) => !g.layers[l]);
    if (missing !== undefined) throw new ExpertsNotResidentError(`layer ${missing}'s experts are not on the GPU`);
    return new GgmlGraphStage(g.ctx.device, g.layers, g.kernels, { layers: this.options.layers, experts: this.options.experts, topK: this.options.topK, maxTokens });
  }

  /** Nothing is pre-launched here. */
  stopPrelaunch(_why: string): void {}

  /** y[S][D] = Σ_j w_j · expert_j(x); one submit and one wait on the GPU path. */
  forward(layer: number, x: Float32Array, r: Routing, y: Float32Array): void {
    const o = this.options, D = o.hidden;
    if (!Number.isInteger(layer) || layer < 0 || layer >= o.layers) throw new InvalidArgumentError(`layer ${layer} is outside 0..${o.layers - 1}`);
    checkRouting(r, o.experts);
    if (r.k > o.topK) throw new InvalidArgumentError(`k = ${r.k} exceeds the topK = ${o.topK} this backend was opened with`);
    if (!(x instanceof Float32Array) || x.length < r.S * D) throw new InvalidArgumentError(`x must be a Float32Array of S*D = ${r.S * D}`);
    if (y.length < r.S * D) throw new InvalidArgumentError(`y must hold S*D = ${r.S * D} floats`);
    this.counters.calls++;
    const g = this.gpu, L = g?.layers[layer];
    if (!g || !L) {
      this.counters.cpuPairs += r.S * r.k;
      o.cpu.forward(layer, x, r, y);
      return;
    }
    try {
      this.forwardGpu(g, L, x, r, y);
      this.counters.gpuPairs += r.S * r.k;
    } catch (e) {
      if (!(e instanceof DeviceLostError)) throw e;
      this.dropGpu(`device lost (${e.fn})`);
      this.counters.cpuPairs += r.S * r.k;
      o.cpu.forward(layer, x, r, y);
    }
  }

  private forwardGpu(g: GpuState, L: GgmlExpertLayer, x: Float32Array, r: Routing, y: Float32Array): void {
    const c = g.call, w = this.work, D = this.options.hidden, S = r.S;
    w.build(r, this.options.experts, false);
    this.seq = (this.seq + 1) >>> 0;
    writeWorkList(w, S, this.seq, c.views.work, c.views.pairs, c.views.slotWeight);
    c.views.x.set(x.subarray(0, S * D));
    const kernels = g.kernels.get(pairKey(L.gateUpType, L.downType))!;
    c.fence.reset();
    c.cb.begin();
    kernels.record(c.cb, { layer: L, S, items: w.items, slotsPerToken: w.slotsPerToken, x: c.x, work: c.work, pairs: c.pairs, slotWeight: c.slotWeight, h: c.h, ypair: c.ypair, y: c.y, done: c.done, quantized: c.quantized });
    c.cb.barrier("computeToHost").end();
    c.submission.submit();
    if (!c.fence.waitSpin(200_000)) throw new DeviceLostError("vkWaitForFences (timed out)");
    if (this.injectLost) {
      this.injectLost = false;
      throw new DeviceLostError("vkWaitForFences (simulated)");
    }
    y.set(c.views.y.subarray(0, S * D));
  }

  /** After a lost device: free what we hold (unless the graph shares the device: abandonGpu then), CPU from now on. */
  private dropGpu(why: string): void {
    if (this.sharedDevice) {
      this.heldAfterLoss = this.gpu;
      this.gpu = undefined;
      this.whyCpu = why;
      return;
    }
    this.freeGpu();
    this.toCpu(why);
  }

  /** The device was lost elsewhere (the decode graph): CPU from now on, no line (the caller says it). */
  abandonGpu(why: string): void {
    if (!this.gpu && !this.heldAfterLoss) return;
    this.freeGpu();
    this.whyCpu = why;
  }

  /** Fault hook for tests: the next GPU call reports VK_ERROR_DEVICE_LOST (after really running). */
  injectDeviceLost(): void {
    if (this.gpu) this.injectLost = true;
  }

  stats(): MoeStats {
    return { mode: this.mode, why: this.why, calls: this.counters.calls, gpuPairs: this.counters.gpuPairs, cpuPairs: this.counters.cpuPairs, fusedCalls: 0 };
  }

  private freeGpu(): void {
    const g = this.gpu ?? this.heldAfterLoss;
    this.gpu = this.heldAfterLoss = undefined;
    if (!g) return;
    try {
      g.ctx.device.waitIdle();
    } catch {
      // a lost device: destroying is still valid
    }
    g.call[Symbol.dispose]();
    for (const l of g.layers) l?.[Symbol.dispose]();
    for (const k of g.kernels.values()) k[Symbol.dispose]();
    g.ctx[Symbol.dispose]();
  }

  [Symbol.dispose](): void {
    this.freeGpu();
  }
}

interface GgmlGraphStageOptions {
  layers: number;
  experts: number;
  topK: number;
  maxTokens: number;
}

/**
 * The decode graphs' MoE stage over GGML block experts: `table` holds (expert id, 0) per (layer,
 * expert), so the work items dec_route (one per slot) and dec_group_experts (one per chosen expert)
 * write carry the expert id that moe_ggml looks up in the layer's own expert table. The layer's
 * (gate/up, down) pair picks the kernels; each layer has its own descriptor sets (its blocks).
 */
export class GgmlGraphStage implements MoeGraphStage {
  readonly table: Buffer;
  readonly work: Buffer;
  readonly pairs: Buffer;
  readonly slotWeight: Buffer;
  readonly slotExpert: Buffer;
  readonly mode = "grouped" as const;
  readonly seq = GRAPH_SEQ;
  private readonly h: Buffer;
  private readonly ypair: Buffer;
  private readonly done: Buffer;
  /** The norm tail's arrival word (decode calls with the next layer's input norm). */
  private readonly control: Buffer;
  private readonly quantized: ExpertQuantScratch | undefined;
  private readonly group: GroupExpertsKernel;
  /** The layers' kernels on the matrix cores, if any (one slot tile an item for the calls they take). */
  private readonly cm: GgmlExpertKernels | undefined;
  private readonly owned = new DisposableStack();

  constructor(
    readonly device: Device,
    private readonly layers: readonly (GgmlExpertLayer | undefined)[],
    private readonly kernels: ReadonlyMap<string, GgmlExpertKernels>,
    private readonly opts: GgmlGraphStageOptions,
  ) {
    try {
      const E = opts.experts, K = opts.topK, slots = opts.maxTokens * K;
      const D = layers.find((l) => l)?.D ?? 0, I = layers.find((l) => l)?.I ?? 0;
      const buf = (bytes: number) => this.owned.use(new Buffer(device, { size: BigInt(Math.max(16, bytes)), memory: "device", priority: 1 }));
      const ids = new Uint32Array(2 * opts.layers * E);
      for (let l = 0; l < opts.layers; l++) for (let e = 0; e < E; e++) ids[2 * (l * E + e)] = e;
      this.table = buf(ids.byteLength);
      uploadBytes(device, this.table, 0n, new Uint8Array(ids.buffer));
      this.work = buf(16 * (1 + slots));
      this.pairs = buf(4 * slots);
      this.slotWeight = buf(4 * slots);
      this.slotExpert = buf(8 * slots);
      this.h = buf(4 * slots * I);
      this.ypair = buf(4 * slots * D);
      this.done = buf(16);
      this.control = buf(4);
      // Zeroed, so that no kernel ever reads undefined memory (and the arrival word starts at 0).
      for (const b of [this.work, this.pairs, this.slotWeight, this.slotExpert, this.h, this.ypair, this.done, this.control]) uploadBytes(device, b, 0n, new Uint8Array(Number(b.size)));
      // the matrix cores take lists grouped by expert ahead of the integer-dot kernel: no quantized x or h where they take every call
      const idp = [...kernels.values()].some((k) => k.integerDot && !k.cmFor(PER_SLOT_TOKENS + 1));
      this.quantized = idp && opts.maxTokens > PER_SLOT_TOKENS ? this.owned.use(new ExpertQuantScratch(device, D, I, opts.maxTokens, K)) : undefined;
      this.group = this.owned.use(new GroupExpertsKernel(device, { maxSets: opts.layers + 4 }));
      this.cm = [...kernels.values()].find((k) => k.matrixCores);
    } catch (e) {
      this.owned.dispose();
      throw e;
    }
  }

  tableOffset(l: number): number {
    return l * this.opts.experts;
  }

  /** Slots a work item of a call of S tokens regrouped by expert holds at most (dec_group_experts' maxSlots): a matrix-core tile's, else the rows kernels' ITEM_SLOTS. */
  private itemSlots(S: number): number {
    return this.cm?.cmFor(S) ? this.cm.cmSlots : ITEM_SLOTS;
  }

  private byExpert(S: number): boolean {
    return S > PER_SLOT_TOKENS;
  }

  record(cb: CommandBuffer, x: Buffer, y: Buffer, S = 1, routing?: StageRouting): void {
    if (!routing) throw new InvalidArgumentError("the GGML experts' stage needs the router's output (routing: its layer and choices)");
    const L = this.layers[routing.layer];
    if (!L) throw new ExpertsNotResidentError(`layer ${routing.layer}'s experts are not on the GPU`);
    if (!Number.isInteger(S) || S < 1 || S > this.opts.maxTokens) throw new InvalidArgumentError(`S must be an integer in 1..${this.opts.maxTokens}, got ${S}`);
    const K = this.opts.topK, E = this.opts.experts;
    let items = S * K;
    if (this.byExpert(S)) {
      this.group.record(cb, {
        chosen: routing.chosen, table: this.table, work: this.work, pairs: this.pairs, slotWeight: this.slotWeight,
        S, E, k: K, seq: GRAPH_SEQ, chosenOffset: routing.chosenOffset, tableOffset: this.tableOffset(routing.layer), maxSlots: this.itemSlots(S),
      });
      routing.mark?.("group");
      cb.barrier("computeToCompute");
      items = groupedItemsMax(S, E, K, this.itemSlots(S)); // moe_ggml's workgroups past the list's count return at once
    }
    this.kernels.get(pairKey(L.gateUpType, L.downType))!.record(cb, {
      layer: L, S, items, slotsPerToken: K, x, work: this.work, pairs: this.pairs, slotWeight: this.slotWeight, h: this.h, ypair: this.ypair, y, done: this.done,
      quantized: this.quantized,
      singleSlotItems: !this.byExpert(S), // dec_route's list: one item a slot, item u slot u
      itemPerSlot: this.downSums(S),
      control: this.control,
      ...(routing.normTail && this.foldsNorm(S) && { normTail: routing.normTail }),
      mark: routing.mark,
    });
  }

  /** Decode calls do the next layer's input norm in their last workgroup (VKMOE_NORM_TAIL). */
  foldsNorm(S: number): boolean {
    return this.downSums(S) && [...this.kernels.values()].every((k) => k.normTail);
  }

  /** dec_route's list (item u = slot u) with at most MOE_GGML_MAX_SLOTS slots a token: down sums them itself. */
  private downSums(S: number): boolean {
    return !this.byExpert(S) && this.opts.topK <= MOE_GGML_MAX_SLOTS;
  }

  /** gate+up, then down (+ sum) behind a barrier, at every S. */
  oneStep(): boolean {
    return false;
  }

  dispatches(S = 1): number {
    if (this.downSums(S)) return 2;
    if (!this.byExpert(S)) return 3;
    // dec_group_experts, then the call (the integer-dot one also quantizes x and h)
    const k = this.kernels.values().next().value;
    return 1 + (k ? k.groupedDispatches(S) : 3);
  }

  [Symbol.dispose](): void {
    this.owned.dispose();
  }
}
