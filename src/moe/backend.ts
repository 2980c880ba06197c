/**
 * The MoE layer, one typed entry point for GPU and CPU: `forward(layer, x, routing, y)` or
 * `issue(...)` + `take(y)`. The GPU runs resident experts; experts the pool cannot hold run on
 * the CPU while the GPU works, joined in routing order. Anything that fails on a user's driver
 * (no loader, no device, missing shader, out of memory, device lost) degrades to the CPU path
 * with one line saying why. Callers never branch on GPU vs CPU.
 */
import { z } from "zod";
import { readConfig, type VkmoeEnv } from "../config.ts";
import { InvalidArgumentError, VkmoeError } from "../errors.ts";
import { planKernels } from "../kernels/setup.ts";
import { chooseMoeKernelConfig } from "../kernels/tuning.ts";
import { computeBudget } from "../pool/budget.ts";
import { packExpert, type ExpertLayout, type ExpertShape } from "../pool/expert-layout.ts";
import type { BatchTicket, ResidentExpert } from "../pool/cache.ts";
import { ExpertPool, type Addressing } from "../pool/expert-pool.ts";
import { PoolInvariantError } from "../pool/errors.ts";
import type { DeviceSlab } from "../pool/vulkan-slabs.ts";
import { VulkanContext } from "../vk/context.ts";
import { DeviceLostError } from "../vk/errors.ts";
import { GpuLayer, SlabBindingsExhaustedError, type Ticket } from "./gpu-layer.ts";
import { QuantGraphStage, type GraphStageChoices, type MoeGraphStage, type MoeStageSource } from "./graph-stage.ts";
import type { MoeGemvPath } from "./shaders.ts";
import { MoeCpu, type ExpertWeights } from "./reference.ts";
import { decidePrelaunch } from "./prelaunch-policy.ts";
import { checkRouting, MAX_EXPERTS, MAX_TOKENS, MAX_TOP_K, WorkList, type Routing } from "./routing.ts";
import { prefillPlan } from "./prefill-plan.ts";

/** Default of the fusedTokens option (see it), on both GEMV paths. */
const FUSED_TOKENS_DEFAULT = 4;
/** Default of the prelaunchPolls option (its duration is not measured: see the option). */
const PRELAUNCH_POLLS_DEFAULT = 1024;

/** Weights of (layer, expert); expert === experts (E) asks for the shared expert. */
export type ExpertProvider = (layer: number, expert: number) => ExpertWeights;

const optionsSchema = z.strictObject({
  shape: z.strictObject({
    format: z.enum(["q4", "q8"]),
    groupSize: z.union([z.literal(32), z.literal(64), z.literal(128)]),
    scaleType: z.enum(["f16", "f32"]),
    hidden: z.number().int().positive(),
    intermediate: z.number().int().positive(),
  }),
  experts: z.number().int().min(1).max(MAX_EXPERTS),
  topK: z.number().int().min(1).max(MAX_TOP_K),
  layers: z.number().int().positive(),
  shared: z.boolean().default(false),
  limit: z.number().positive().finite().optional(),
  weights: z.custom<ExpertProvider>((v) => typeof v === "function", "weights must be a function (layer, expert) => { gate, up, down }"),
  /** Device memory for experts; default from the driver (VKMOE_BUDGET_MB overrides both). */
  budgetMB: z.number().positive().optional(),
  /** Bytes of the driver's default budget kept for other device memory (the decode graph's dense weights and KV cache). */
  reserveBytes: z.number().int().nonnegative().default(0),
  /** Calls that may be in flight at once. */
  tickets: z.number().int().min(1).max(8).default(2),
  /**
   * An expert not resident when a call needs it: "upload" it (evicting colder experts) or run its
   * pairs on the "cpu" while the GPU runs the resident ones. Default "upload": on the H200 a
   * 2.5 MiB expert uploads in ~0.4-0.6 ms (4-7 GB/s) while the CPU path spends ~3.5 ms per
   * (token, expert) pair of the same shape (bench-pool, bench-moe).
   */
  onMiss: z.enum(["upload", "cpu"]).default("upload"),
  /**
   * How a synchronous wait waits: "spin" polls the completion word the GPU writes into host
   * memory (no FFI call) for up to 200 µs, then the fence (up to 3 vkGetFenceStatus), then
   * vkWaitForFences: 3 to 6 FFI calls a call; "block" sleeps in vkWaitForFences at once (3 FFI
   * calls). Default "spin": on the H200 an S=1 layer call took 44.6 µs against 66.9 µs blocking,
   * and 217 µs against 258 µs at S=16 (scripts/profile-moe.ts, 4 layers).
   */
  wait: z.enum(["block", "spin"]).default("spin"),
  /**
   * Calls of at most this many tokens run in one dispatch (gate+up, SiLU, and down added up per
   * token with float atomics; on the integer-dot path each workgroup quantizes x itself); larger
   * calls run [quantize] + gate+up + down + sum, which reads each expert's weights once whatever S is. 0: always the latter; devices
   * without float atomics (or VKMOE_FLOAT_ATOMICS=off) too. Default 4, measured on the H200
   * (scripts/profile-moe.ts --warm, 2 layers, host µs of forward(), fused against grouped): float
   * path S=1 40.1 / 50.4, S=2 54.2 / 66.2, S=4 92.1 / 100; integer-dot path S=1 41.3 / 54.5,
   * S=2 50.6 / 65.8, S=4 76.6 / 86.8.
   */
  fusedTokens: z.number().int().min(0).max(MAX_TOKENS).optional(),
  /**
   * Pre-launch of fused calls: while one runs, the next ticket's kernel is submitted already and
   * waits on the GPU for the next call's inputs (a doorbell word), polling it at most this many
   * times (default 1024; each poll is a memory round trip and two workgroup barriers, so on the
   * order of a millisecond; not measured) before it ends by
   * itself; a call that comes later, or with another S or k, is submitted as usual, with the same
   * answer. 0: off. Only on drivers where it is verified, unless VKMOE_PRELAUNCH=on (see
   * prelaunch-policy.ts); needs 2 or more tickets and expert memory the CPU writes directly (not
   * staged uploads). H200, bench-moe, S=1: 27-32 µs a call against 34-39 µs submitted when made.
   */
  prelaunchPolls: z.number().int().min(0).max(1 << 26).optional(),
  /** Override of the kernel shape chosen from the tuning table (benchmarks, tuning). */
  kernel: z.strictObject({
    workgroupSize: z.number().int().positive(),
    rowsPerWorkgroup: z.number().int().positive(),
    colThreads: z.number().int().min(0),
    rowLanes: z.number().int().positive(),
  }).partial().optional(),
  addressing: z.enum(["bda", "descriptor"]).optional(),
  policy: z.enum(["lru", "heat"]).optional(),
  /** Khronos synchronization validation on the backend's instance (needs VKMOE_VALIDATION=1; slow: tests only). */
  syncValidation: z.boolean().default(false),
  /** Where one line about falling back to the CPU goes. */
  log: z.custom<(line: string) => void>((v) => typeof v === "function").optional(),
});
export type MoeOptions = z.input<typeof optionsSchema>;

export class MoeInputError extends InvalidArgumentError {}

export interface MoeStats {
  mode: "gpu" | "cpu";
  why: string;
  calls: number;
  gpuPairs: number;
  cpuPairs: number;
  /** GPU calls that ran fused (one dispatch; see the fusedTokens option). */
  fusedCalls: number;
  /** Pre-launched fused kernels (prelaunchPolls option): rung and run, rung too late, stopped unused. */
  prelaunch?: { ran: number; gaveUp: number; cancelled: number };
  cache?: ReturnType<ExpertPool["stats"]>;
}

interface GpuState {
  ctx: VulkanContext;
  pool: ExpertPool;
  layer: GpuLayer;
  /** Why pre-launch is off (the driver policy, VKMOE_PRELAUNCH, or another submitter); undefined where it runs. */
  prelaunchOff: string | undefined;
  /** The configuration it was opened with (graph stages' prefill plan). */
  env: VkmoeEnv;
}

/**
 * A call in flight: `take(y)` joins it (blocking); `await ready()` first keeps the event loop free
 * while the GPU runs. Taking a ticket twice is a MoeInputError. On the GPU path the object is
 * recycled by a later issue() once taken (issue() allocates nothing): keep it only until take().
 */
export interface MoeTicket {
  ready(): Promise<void>;
  take(y: Float32Array): void;
}

export class MoeBackend implements Disposable, MoeStageSource {
  readonly options: z.output<typeof optionsSchema>;
  readonly shape: ExpertShape;
  private gpu: GpuState | undefined;
  private whyCpu = "";
  private readonly work = new WorkList();
  private readonly cpu: MoeCpu;
  private readonly cpuItems: Int32Array;
  /** The reused call object of each GpuLayer ticket. */
  private readonly calls = new Map<Ticket, GpuCall>();
  private counters = { calls: 0, gpuPairs: 0, cpuPairs: 0, fusedCalls: 0 };
  /** The upload source of the expert being ensured: one object, reused, so a call allocates no closures (read only on a miss). */
  private readonly missing = {
    layer: 0,
    expert: 0,
    byteLength: 0,
    layout: undefined as ExpertLayout | undefined,
    fill: (dest: Uint8Array) => {
      const m = this.options.weights(this.missing.layer, this.missing.expert);
      packExpert(this.missing.layout!, m.gate, m.up, m.down, dest);
    },
  };
  private readonly log: (line: string) => void;

  private constructor(options: z.output<typeof optionsSchema>) {
    this.options = options;
    this.shape = options.shape as ExpertShape;
    this.log = options.log ?? ((line) => console.error(line));
    this.cpu = new MoeCpu(this.shape.hidden, this.shape.intermediate);
    this.cpuItems = new Int32Array(this.work.capacityPairs);
  }

  /** Validates options (zod) and opens the GPU path, or the CPU path with one line saying why. */
  static open(options: MoeOptions, env?: VkmoeEnv): MoeBackend {
    const parsed = optionsSchema.safeParse(options);
    if (!parsed.success) throw new InvalidArgumentError(`invalid MoE options:\n${z.prettifyError(parsed.error)}`);
    const backend = new MoeBackend(parsed.data);
    const config = env ?? readConfig();
    if (!config.VKMOE_GPU) backend.toCpu("VKMOE_GPU=0");
    else {
      try {
        backend.gpu = backend.openGpu(config);
      } catch (e) {
        backend.toCpu(e instanceof VkmoeError ? e.message.replace(/\s*\n\s*/g, "; ") : String(e));
      }
    }
    return backend;
  }

  private openGpu(env: VkmoeEnv): GpuState {
    const ctx = new VulkanContext({ syncValidation: this.options.syncValidation }, env);
    let pool: ExpertPool | undefined;
    try {
      const device = ctx.device;
      const addressing: Addressing = this.options.addressing ?? (device.enabled.bufferDeviceAddress ? "bda" : "descriptor");
      const budget = env.VKMOE_BUDGET_MB !== undefined || this.options.budgetMB === undefined
        ? computeBudget(device, { overrideMB: env.VKMOE_BUDGET_MB, ignoreBudgetExtension: env.VKMOE_IGNORE_BUDGET_EXT })
        : { bytes: this.options.budgetMB * 2 ** 20, why: "budgetMB option" };
      // An explicit budget is the experts' own; the driver's default keeps room for the rest of the model.
      const explicit = env.VKMOE_BUDGET_MB !== undefined || this.options.budgetMB !== undefined;
      const budgetBytes = Math.floor(explicit ? budget.bytes : Math.max(0, budget.bytes - this.options.reserveBytes));
      pool = new ExpertPool(device, { shape: this.shape, budgetBytes, addressing, policy: this.options.policy });
      const maxSlots = MAX_TOKENS * (this.options.topK + (this.options.shared ? 1 : 0));
      const maxItems = Math.min(maxSlots, this.options.experts + 1);
      const config = { ...chooseMoeKernelConfig(device.info), ...this.options.kernel };
      // The integer-dot decision of the GEMV kernels (VKMOE_IDP, blocklist, child-process probe) picks the gate+up path.
      const path = planKernels(device, env).integerDot.on ? "integer-dot" : "float";
      const prelaunch = decidePrelaunch(env.VKMOE_PRELAUNCH, device.info);
      const prelaunchPolls = prelaunch.on ? this.options.prelaunchPolls ?? PRELAUNCH_POLLS_DEFAULT : 0;
      const layer = new GpuLayer(device, pool, config, { maxItems, maxSlots, tickets: this.options.tickets, path, fusedTokens: this.options.fusedTokens ?? FUSED_TOKENS_DEFAULT, prelaunchPolls }, this.options.limit);
      layer.waitStyle = this.options.wait;
      this.missing.byteLength = pool.layout.bytes;
      this.missing.layout = pool.layout;
      return { ctx, pool, layer, prelaunchOff: prelaunch.on ? undefined : prelaunch.why, env };
    } catch (e) {
      pool?.[Symbol.dispose]();
      ctx[Symbol.dispose]();
      throw e;
    }
  }

  private toCpu(why: string): void {
    this.whyCpu = why;
    this.log(`vkmoe: running the MoE layer on the CPU: ${why}`);
  }

  get mode(): "gpu" | "cpu" {
    return this.gpu ? "gpu" : "cpu";
  }

  /** The GPU's GEMV path ("float", or "integer-dot": x quantized to int8 for gate+up), undefined on the CPU path. */
  get gemvPath(): MoeGemvPath | undefined {
    return this.gpu?.layer.pipelines.path;
  }

  /** Calls of at most this many tokens run fused on the GPU (0 on the CPU path). */
  get fusedTokens(): number {
    return this.gpu?.layer.fusedTokens ?? 0;
  }

  get why(): string {
    if (!this.gpu) return this.whyCpu;
    const { layer, prelaunchOff } = this.gpu;
    const prelaunch = layer.prelaunched ? " (pre-launched)" : prelaunchOff ? ` (not pre-launched: ${prelaunchOff})` : "";
    const fused = layer.pipelines.fused ? `fused calls of S <= ${layer.fusedTokens}${prelaunch}` : "no fused calls (no float atomics)";
    return `GPU: ${this.gpu.ctx.device.info.name}, ${this.gpu.pool.addressing} addressing, ${layer.pipelines.path} path, ${fused}`;
  }

  /** Khronos validation messages since the last call, one line each (with VKMOE_VALIDATION=1; tests fail on any). */
  takeValidationMessages(): string[] {
    return (this.gpu?.ctx.instance.takeMessages() ?? []).map((m) => `[${m.severity}] ${m.idName}: ${m.message}`);
  }

  /** The Vulkan context when the GPU path is active (banner, benchmarks). */
  get context(): VulkanContext | undefined {
    return this.gpu?.ctx;
  }

  get pool(): ExpertPool | undefined {
    return this.gpu?.pool;
  }

  /**
   * The decode graph's MoE stage for `moeLayers` on the GPU path (src/graph/): throws
   * ExpertsNotResidentError unless every routed expert of those layers is resident, and
   * InvalidArgumentError on the CPU path or with a shared expert (not in the graph yet).
   */
  graphStage(moeLayers: readonly number[], maxTokens: number, choices: GraphStageChoices = {}): MoeGraphStage {
    const g = this.gpu;
    if (!g) throw new InvalidArgumentError(`the MoE layer runs on the CPU (${this.whyCpu})`);
    if (this.options.shared) throw new InvalidArgumentError("a shared expert is not in the decode graph yet");
    // prompt chunks' experts on the matrix cores (prefill-plan.ts: VKMOE_MOE_COOPMAT, the device's matrix-core GEMM passing its self-check)
    const device = g.ctx.device;
    const from = choices.matrixCores === undefined ? prefillPlan(device, g.env).expertsOnMatrixCoresFrom : undefined;
    const cm = from !== undefined ? { matrixCores: true, matrixCoresFrom: from } : {};
    return new QuantGraphStage(device, g.pool, g.layer, { layers: this.options.layers, experts: this.options.experts, topK: this.options.topK, moeLayers, maxTokens, ...cm, ...choices });
  }

  /** Everything about a call's input but x's values (checkValues). */
  private checkInput(layer: number, x: Float32Array, r: Routing): void {
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.options.layers) throw new MoeInputError(`layer ${layer} is outside 0..${this.options.layers - 1}`);
    checkRouting(r, this.options.experts);
    if (r.k > this.options.topK) throw new MoeInputError(`k = ${r.k} exceeds the topK = ${this.options.topK} this layer was opened with`);
    const D = this.shape.hidden;
    if (!(x instanceof Float32Array) || x.length !== r.S * D) throw new MoeInputError(`x must be a Float32Array of S*D = ${r.S * D}`);
  }

  /** NaN or an infinity in x: MoeInputError naming the first one. */
  private checkValues(x: Float32Array): void {
    if (allFinite(x)) return;
    const D = this.shape.hidden;
    for (let i = 0; i < x.length; i++) if (!Number.isFinite(x[i]!)) throw new MoeInputError(`x[${Math.floor(i / D)}][${i % D}] is ${x[i]}`);
  }

  /**
   * Uploads every expert (and shared expert) of `layers` while they fit in the budget, never
   * evicting: a model's load, so its first tokens do not wait on uploads. `progress(done, total)`
   * after each layer. On the CPU path it does nothing. Returns what was loaded and skipped, and the
   * layers whose experts are all resident.
   */
  preload(layers: readonly number[], progress?: (done: number, total: number) => void): { loaded: number; skipped: number; bytes: number; complete: number[] } {
    const g = this.gpu;
    const sum = { loaded: 0, skipped: 0, bytes: 0, complete: [] as number[] };
    if (!g) return sum;
    const E = this.options.experts;
    const count = E + (this.options.shared ? 1 : 0);
    const layout = g.pool.layout;
    for (let i = 0; i < layers.length; i++) {
      const layer = layers[i]!;
      const items = Array.from({ length: count }, (_, expert) => ({
        layer,
        expert,
        source: {
          byteLength: layout.bytes,
          fill: (dest: Uint8Array) => {
            const m = this.options.weights(layer, expert);
            packExpert(layout, m.gate, m.up, m.down, dest);
          },
        },
      }));
      const r = g.pool.cache.preload(items);
      sum.loaded += r.loaded;
      sum.skipped += r.skipped;
      sum.bytes += r.bytes;
      if (r.skipped === 0) sum.complete.push(layer);
      progress?.(i + 1, layers.length);
    }
    g.pool.flush();
    return sum;
  }

  /** y[S, D] = Σ_k w_k · expert_k(x) (+ shared). Synchronous. */
  forward(layer: number, x: Float32Array, r: Routing, y: Float32Array): void {
    this.issue(layer, x, r).take(y);
  }

  /**
   * Starts a call; the GPU runs while the caller does other work. `take(y)` joins. On the GPU
   * path the returned ticket is one object per in-flight slot (`tickets` option), reused by a
   * later issue() once taken: keep it only until its take().
   */
  issue(layer: number, x: Float32Array, r: Routing): MoeTicket {
    this.checkInput(layer, x, r);
    this.counters.calls++;
    const E = this.options.experts;
    const shared = this.options.shared;
    this.work.build(r, E, shared);
    if (this.gpu) {
      let c: GpuCall | undefined;
      try {
        c = this.issueGpu(this.gpu, layer, x, r);
      } catch (e) {
        if (!(e instanceof DeviceLostError)) throw e;
        this.dropGpu(`device lost (${e.fn})`);
      }
      if (c !== undefined) {
        // x's values are checked while the GPU runs (1.4-3 µs for D = 2048 on the H200's host, off
        // the call's critical path); with a NaN or an infinity the call is dropped, its answer unread.
        try {
          this.checkValues(x);
        } catch (e) {
          this.abandon(c);
          throw e;
        }
        return c;
      }
    }
    this.checkValues(x);
    const D = this.shape.hidden;
    const out = new Float32Array(r.S * D);
    for (let u = 0; u < this.work.items; u++) this.cpuItem(layer, x, u, out);
    return { ready: async () => {}, take: (y) => copyOut(out, y, r.S * D) };
  }

  private cpuItem(layer: number, x: Float32Array, u: number, out: Float32Array): void {
    const w = this.work;
    const weights = this.options.weights(layer, w.expert[u]!);
    for (let i = 0; i < w.pairCount[u]!; i++) {
      const slot = w.pairs[w.pairStart[u]! + i]!;
      this.cpu.addPair(weights, x, Math.floor(slot / w.slotsPerToken), w.slotWeight[slot]!, out, this.options.limit);
      this.counters.cpuPairs++;
    }
  }

  /** The reused call object of GpuLayer ticket `t` (made on its first call). */
  private callOf(g: GpuState, t: Ticket): GpuCall {
    let c = this.calls.get(t);
    if (c === undefined) {
      c = new GpuCall(g, t, (call, y) => this.takeGpu(call, y), (call) => this.readyGpu(call));
      this.calls.set(t, c);
    }
    return c;
  }

  /**
   * Builds the call's tables in the layer's staging tables (GpuLayer.submit copies them into the
   * ticket's mapped buffers) and submits. Per call it allocates nothing: the ticket's call object
   * and pin batch are reused, resident experts give their device address as two cached u32 words,
   * and the CPU-share buffer is only touched when some expert runs on the CPU.
   */
  private issueGpu(g: GpuState, layer: number, x: Float32Array, r: Routing): GpuCall {
    const w = this.work;
    const t: Ticket = g.layer.acquire();
    const c = this.callOf(g, t);
    const tables = g.layer.tables;
    const { work: item, pairs, slotWeight, slotExpert } = tables;
    const S = r.S, K = w.slotsPerToken;
    const bda = g.pool.addressing === "bda";
    const cpuOnMiss = this.options.onMiss === "cpu";
    const cache = g.pool.cache;
    let gpuItems = 0, gpuPairCount = 0, cpuCount = 0;
    // While every expert so far is resident, items are only looked up (one map lookup each); their
    // pins, cache statistics and eviction-policy updates wait until after the doorbell, while the GPU
    // runs (the decode steady state: every expert a hit). Nothing can evict in between: no upload
    // happens, and nothing else runs. The first miss pins the items before it first (its upload
    // may evict), and the rest of the call pins as it goes.
    let deferring = true, deferred = 0;
    let batch: BatchTicket<DeviceSlab> | undefined;
    try {
      batch = c.batch = g.pool.beginBatch(c.batch);
      for (let i = 0, n = S * K; i < n; i++) slotWeight[i] = w.slotWeight[i]!;
      for (let u = 0; u < w.items; u++) {
        const e = w.expert[u]!, start = w.pairStart[u]!, count = w.pairCount[u]!;
        let res: ResidentExpert<DeviceSlab> | undefined = deferring ? cache.get(layer, e) : undefined;
        if (res !== undefined) deferred++;
        else {
          if (deferring) {
            deferring = false;
            this.pinResident(batch, layer, deferred);
          }
          if (!cpuOnMiss || cache.has(layer, e)) {
            this.missing.layer = layer;
            this.missing.expert = e;
            const v = batch.tryEnsure(layer, e, this.missing);
            if (v.resident) res = v.expert;
          }
        }
        let slot = 0;
        if (res !== undefined && !bda) {
          try {
            slot = g.layer.slotOf(res.allocation.slab);
          } catch (err) {
            if (!(err instanceof SlabBindingsExhaustedError)) throw err;
            res = undefined;
          }
        }
        if (res === undefined) {
          this.cpuItems[cpuCount++] = u;
          for (let i = 0; i < count; i++) slotWeight[w.pairs[start + i]!] = 0;
          continue;
        }
        const at = 4 * (1 + gpuItems);
        const a = bda ? res.addressLo : slot, b = bda ? res.addressHi : res.allocation.offset / 16;
        item[at] = a;
        item[at + 1] = b;
        item[at + 2] = gpuPairCount;
        item[at + 3] = count;
        for (let i = 0; i < count; i++) {
          const p = w.pairs[start + i]!;
          pairs[gpuPairCount++] = p;
          slotExpert[2 * p] = a;
          slotExpert[2 * p + 1] = b;
        }
        gpuItems++;
      }
      g.pool.flush();
      item[0] = S; item[1] = K; item[2] = gpuItems;
      tables.pairCount = gpuPairCount;
      const mode = gpuItems > 0 ? g.layer.submit(t, x, S, K, gpuItems) : undefined;
      if (deferring) this.pinResident(batch, layer, deferred);
      if (mode === "fused") {
        this.counters.fusedCalls++;
        g.layer.prelaunchNext(S, K); // while this call runs
      }
    } catch (e) {
      try {
        if (t.busy) g.layer.wait(t);
      } finally {
        batch?.release();
        g.layer.releaseTicket(t);
      }
      throw e;
    }
    this.counters.gpuPairs += gpuPairCount;
    c.layer = layer;
    c.x = x;
    c.r = r;
    c.S = S;
    c.gpuItems = gpuItems;
    c.cpuItems = cpuCount;
    c.lost = undefined;
    c.taken = false;
    if (cpuCount > 0) {
      // The CPU share runs while the GPU works.
      try {
        t.cpuY.fill(0, 0, S * this.shape.hidden);
        for (let i = 0; i < cpuCount; i++) this.cpuItem(layer, x, this.cpuItems[i]!, t.cpuY);
      } catch (e) {
        this.abandon(c);
        throw e;
      }
    }
    return c;
  }

  /** Pins work items [0, n), each found resident by a plain lookup in this call (each a hit). */
  private pinResident(batch: BatchTicket<DeviceSlab>, layer: number, n: number): void {
    const w = this.work;
    for (let u = 0; u < n; u++) {
      const v = batch.tryEnsure(layer, w.expert[u]!, this.missing);
      if (!v.resident || !v.hit) throw new PoolInvariantError(`expert (${layer}, ${w.expert[u]}) was resident when looked up and not when pinned`);
    }
  }

  /** Drops an issued call without reading its answer (releaseCall); a lost device turns the backend to the CPU. */
  private abandon(c: GpuCall): void {
    c.taken = true;
    try {
      this.releaseCall(c);
    } catch (e) {
      if (!(e instanceof DeviceLostError)) throw e;
      this.dropGpu(`device lost (${e.fn})`);
    }
  }

  /** Frees a call's ticket and pins, after waiting for GPU work still running on it (DeviceLostError from that wait). */
  private releaseCall(c: GpuCall): void {
    const { g, t } = c;
    try {
      if (this.gpu === g && t.busy) g.layer.wait(t);
    } finally {
      c.batch!.release();
      c.x = undefined;
      c.r = undefined;
      if (this.gpu === g) g.layer.releaseTicket(t);
    }
  }

  private readyGpu(c: GpuCall): Promise<void> {
    if (c.gpuItems === 0 || c.taken || this.gpu !== c.g) return RESOLVED;
    return c.g.layer.waitAsync(c.t).catch((e: unknown) => {
      c.lost = e; // take() turns it into the CPU result
    });
  }

  private takeGpu(c: GpuCall, y: Float32Array): void {
    if (c.taken) throw new MoeInputError("this ticket was already taken");
    c.taken = true;
    const { g, t, S } = c;
    const n = S * this.shape.hidden;
    try {
      if (y.length < n) throw new MoeInputError(`y must hold S*D = ${n} floats`);
      if (this.gpu !== g) throw c.lost ?? new DeviceLostError("an earlier call (the GPU path was dropped)");
      if (c.lost) throw c.lost;
      if (c.gpuItems > 0) g.layer.wait(t);
      if (c.cpuItems === 0) y.set(c.gpuY(S, this.shape.hidden));
      else if (c.gpuItems === 0) for (let i = 0; i < n; i++) y[i] = t.cpuY[i]!;
      else {
        const gy = t.views.y, cy = t.cpuY;
        for (let i = 0; i < n; i++) y[i] = gy[i]! + cy[i]!;
      }
    } catch (e) {
      if (!(e instanceof DeviceLostError)) throw e;
      if (this.gpu === g) this.dropGpu(`device lost (${e.fn})`);
      const r = c.r!, x = c.x!;
      this.work.build(r, this.options.experts, this.options.shared); // a later issue() may have reused it
      const out = new Float32Array(n);
      for (let u = 0; u < this.work.items; u++) this.cpuItem(c.layer, x, u, out);
      copyOut(out, y, n);
    } finally {
      // Also after a short y or any other error: the call's results are dropped, its ticket and pins freed.
      this.releaseCall(c);
    }
  }

  /** After a lost device: free what we hold (vkDestroy* stays valid on a lost device), CPU from now on. */
  private dropGpu(why: string): void {
    if (this.sharedDevice) {
      // the other user still holds objects of this device: free ours only after it (abandonGpu)
      this.heldAfterLoss = this.gpu;
      this.gpu = undefined;
      this.calls.clear();
      this.whyCpu = why;
      return;
    }
    this[Symbol.dispose]();
    this.toCpu(why);
  }

  /**
   * Another user shares this backend's device (the decode graph's split runs): on a lost device
   * the backend moves to the CPU without its own line (that user says it) and keeps the device
   * until abandonGpu() or disposal, which that user calls once its own objects are freed.
   */
  sharedDevice = false;
  private heldAfterLoss: GpuState | undefined;

  /**
   * Turns pre-launched fused calls off: another submitter shares the queue (the decode graph's
   * split runs), and its work would wait behind an armed kernel that waits for our next call.
   */
  stopPrelaunch(why: string): void {
    if (!this.gpu) return;
    this.gpu.layer.setPrelaunch(false);
    this.gpu.prelaunchOff ??= why;
  }

  /** The device was lost elsewhere (the decode graph on the same device): CPU from now on, no line (the caller says it). */
  abandonGpu(why: string): void {
    if (!this.gpu && !this.heldAfterLoss) return;
    this[Symbol.dispose]();
    this.whyCpu = why;
  }

  /** Fault hook for tests: the next GPU wait reports VK_ERROR_DEVICE_LOST. */
  injectDeviceLost(): void {
    if (this.gpu) this.gpu.layer.injectDeviceLost = true;
  }

  stats(): MoeStats {
    const g = this.gpu;
    return { mode: this.mode, why: this.why, ...this.counters, cache: g?.pool.stats(), prelaunch: g ? { ...g.layer.prelaunchCounts } : undefined };
  }

  [Symbol.dispose](): void {
    const g = this.gpu ?? this.heldAfterLoss;
    this.gpu = this.heldAfterLoss = undefined;
    this.calls.clear();
    if (!g) return;
    g.layer[Symbol.dispose]();
    g.pool[Symbol.dispose]();
    g.ctx[Symbol.dispose]();
  }
}

const RESOLVED: Promise<void> = Promise.resolve();

/**
 * The ticket of a call on the GPU path: one per GpuLayer ticket, reused by every call that ticket
 * serves (a call allocates no ticket, closure or pin batch). Its state is the call's; take() and
 * ready() are the backend's, bound once.
 */
class GpuCall implements MoeTicket {
  batch: BatchTicket<DeviceSlab> | undefined;
  layer = 0;
  x: Float32Array | undefined;
  r: Routing | undefined;
  S = 0;
  gpuItems = 0;
  cpuItems = 0;
  taken = true;
  lost: unknown;
  /** Views of the readback buffer's first S*D floats, made once per S. */
  private readonly yViews: (Float32Array | undefined)[] = [];

  constructor(
    readonly g: GpuState,
    readonly t: Ticket,
    private readonly takeFn: (c: GpuCall, y: Float32Array) => void,
    private readonly readyFn: (c: GpuCall) => Promise<void>,
  ) {}

  ready(): Promise<void> {
    return this.readyFn(this);
  }

  take(y: Float32Array): void {
    this.takeFn(this, y);
  }

  gpuY(S: number, D: number): Float32Array {
    return (this.yViews[S] ??= this.t.views.y.subarray(0, S * D));
  }
}

/**
 * True when every element is finite, in one pass: a float64 sum of float32 values cannot overflow
 * (|x| < 2^128, so it would take 2^895 of them), so it is finite exactly when every term is; an
 * Infinity or NaN anywhere makes it ±Infinity or NaN. Four partial sums keep the adds independent.
 */
function allFinite(x: Float32Array): boolean {
  let a = 0, b = 0, c = 0, d = 0;
  const n = x.length, m = n & ~3;
  let i = 0;
  for (; i < m; i += 4) {
    a += x[i]!;
    b += x[i + 1]!;
    c += x[i + 2]!;
    d += x[i + 3]!;
  }
  for (; i < n; i++) a += x[i]!;
  return Number.isFinite(a + b + c + d);
}

function copyOut(src: Float32Array, y: Float32Array, n: number): void {
  if (y.length < n) throw new MoeInputError(`y must hold S*D = ${n} floats`);
  y.set(src.subarray(0, n));
}
