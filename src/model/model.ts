/**
 * A loaded model: `Model.load(path)` takes a Hugging Face directory or a GGUF file and returns the
 * decoder with its tokenizer, chat template and generation defaults; `model.session({ ctx })` opens
 * a sequence. Model code knows no Vulkan type: the experts' device lives behind ExpertRunner.
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { readConfig, type VkmoeEnv } from "../config.ts";
import { MATRIX_CORE_CHUNK } from "../moe/prefill-plan.ts";
import { GraphUnsupportedError, hybridGraphReserveBytes, openDeviceDecoder, openHybridDecoder, type DeviceBatch, type DeviceDecoder } from "../graph/index.ts";
import { InvalidArgumentError, VkmoeError } from "../errors.ts";
import { openTensorFile } from "../formats/index.ts";
import type { GgufFile, TensorFile } from "../formats/tensor.ts";
import { ChatTemplate } from "../tokenizer/chat-template.ts";
import { TextTokenizer } from "../tokenizer/tokenizer.ts";
import type { Qwen3MoeConfig } from "./config.ts";
import type { CpuDecoder } from "./cpu-decoder.ts";
import { Decoder } from "./decoder.ts";
import { HybridDecoder } from "./hybrid-decoder.ts";
import { modelConfigFromGguf, modelConfigFromHf, type ModelConfig } from "./model-config.ts";
import { loadQwen35Weights, type HybridWeights } from "./qwen35-weights.ts";
import { ModelConfigError } from "./errors.ts";
import { openExperts, type ExpertRunner } from "./experts.ts";
import { Session, type SessionOptions } from "./session.ts";
import { openDeviceBatch, SessionBatch } from "./session-batch.ts";
import { loadWeights, type ModelWeights, type QuantPlan } from "./weights.ts";

/** How a float checkpoint's weights are held: "auto" experts q4 + dense q8; "none" all float (exact); "q8" / "q4" everything so. */
export type QuantChoice = "auto" | "none" | "q8" | "q4";
export const QUANT_CHOICES: readonly QuantChoice[] = ["auto", "none", "q8", "q4"];

export interface LoadOptions {
  quant?: QuantChoice;
  /** Device memory for experts (default from the driver, VKMOE_BUDGET_MB overrides). */
  budgetMB?: number;
  /** Where one-line notices go (CPU fallback, ignored options). Default stderr. */
  log?: (line: string) => void;
  /** Called as loading advances: stage name and fraction done in [0, 1]. */
  progress?: (stage: string, fraction: number) => void;
  env?: VkmoeEnv;
  /** Khronos synchronization validation too (with VKMOE_VALIDATION=1; slow: tests). */
  syncValidation?: boolean;
  /**
   * The context sessions will mostly use (default min(4096, the model's maximum)): its f16 KV
   * cache and the dense weights are kept out of the default expert budget.
   */
  ctx?: number;
}

/**
 * Where a model's tokens run: "resident", every op of a token on the GPU in one submit (every
 * expert resident); "per-layer", the experts on the GPU layer by layer (the expert cache and the
 * hybrid CPU share) with the dense ops on the GPU a layer a submit (the graph split) or on the CPU
 * decoder; "cpu", everything on the CPU.
 */
export type RunMode = "resident" | "per-layer" | "cpu";

export interface ModelSource {
  path: string;
  format: "gguf" | "safetensors";
}

export class Model implements Disposable {
  private disposed = false;
  private constructor(
    readonly source: ModelSource,
    readonly config: ModelConfig,
    readonly tokenizer: TextTokenizer,
    /** undefined when the model files carry no chat template (then only raw prompts work). */
    readonly chatTemplate: ChatTemplate | undefined,
    /** Sampling defaults the files carry: generation_config.json's fields, or GGUF general.sampling.* keys. */
    readonly generationDefaults: Readonly<Record<string, unknown>>,
    private readonly file: TensorFile,
    private readonly weights: ModelWeights | HybridWeights,
    private readonly experts: ExpertRunner,
    /** Seconds from load() to ready. */
    readonly loadSeconds: number,
    private deviceDecoder: DeviceDecoder | undefined,
    /** Why the model is not resident (empty when it is). */
    private whyNotResident: string,
    private readonly log: (line: string) => void,
  ) {}

  static async load(path: string, options: LoadOptions = {}): Promise<Model> {
    const t0 = performance.now();
    const log = options.log ?? ((line: string) => console.error(line));
    const progress = options.progress ?? (() => {});
    const quant = options.quant ?? "auto";
    if (!QUANT_CHOICES.includes(quant)) throw new InvalidArgumentError(`quant must be one of ${QUANT_CHOICES.join(", ")}, got ${String(quant)}`);
    const isDir = existsSync(path) && statSync(path).isDirectory();
    let hfConfig: ModelConfig | undefined;
    if (isDir) {
      const configPath = join(path, "config.json");
      if (!existsSync(configPath)) throw new ModelConfigError(`${path} has no config.json (a Hugging Face model directory needs config.json, model.safetensors and tokenizer.json)`);
      hfConfig = modelConfigFromHf(readJson(configPath), configPath);
    }
    progress("mapping", 0);
    const file = await openTensorFile(path);
    try {
      let config: ModelConfig, tokenizer: TextTokenizer, template: ChatTemplate | undefined, defaults: Record<string, unknown>;
      let plan: QuantPlan;
      if (file.format === "gguf") {
        const meta = (file as GgufFile).metadata as Record<string, unknown>;
        config = modelConfigFromGguf(meta, (n) => file.tensors.has(n), path);
        tokenizer = TextTokenizer.fromGgufMetadata(meta);
        template = typeof meta["tokenizer.chat_template"] === "string" ? ChatTemplate.fromGgufMetadata(meta) : undefined;
        defaults = Object.fromEntries(Object.entries(meta).filter(([k]) => k.startsWith("general.sampling.")));
        if (quant !== "auto") log(`vkmoe: --quant ${quant} ignored: a GGUF file's tensor types are kept as they are`);
        plan = { experts: "none", dense: "none" };
      } else {
        config = hfConfig ?? failNoConfig(path);
        tokenizer = TextTokenizer.fromHfDirectory(path);
        template = hasChatTemplate(path) ? ChatTemplate.fromHfDirectory(path) : undefined;
        const genPath = join(path, "generation_config.json");
        defaults = existsSync(genPath) ? readJson(genPath) : {};
        plan = quant === "auto" ? { experts: "q4", dense: "q8" } : { experts: quant, dense: quant };
      }
      if (tokenizer.vocabSize > config.vocab) throw new ModelConfigError(`${path}: the tokenizer has ${tokenizer.vocabSize} tokens but the model only ${config.vocab} embedding rows`);
      progress("weights", 0);
      const env = options.env ?? readConfig();
      // the graphs' prompt chunk is the device's to decide (prefill-plan.ts): the memory reserve counts "auto" at its longest
      const chunk = env.VKMOE_PREFILL_CHUNK === "auto" ? MATRIX_CORE_CHUNK : Number(env.VKMOE_PREFILL_CHUNK);
      if (config.architecture === "qwen3_5_moe") {
        // The hybrid graph (src/graph/hybrid-graph.ts): resident where every expert is, else split
        // (the dense ops on the GPU a layer a submit, the routed experts through the per-layer MoE
        // call); without it the CPU decoder runs the token, the routed experts where openExperts puts them.
        const weights = loadQwen35Weights(file, config, plan, path, log, (f) => progress("weights", f));
        const reserveBytes = hybridGraphReserveBytes(config, weights, options.ctx ?? Math.min(4096, config.maxPositions), 1, chunk);
        const experts = openExperts(config, weights, { log, budgetMB: options.budgetMB, env, syncValidation: options.syncValidation, reserveBytes, progress: (f) => progress("experts", f) });
        let deviceDecoder: DeviceDecoder | undefined, whyNot = "";
        const backend = experts.gpuBackend;
        if (env.VKMOE_GRAPH === "off") whyNot = "VKMOE_GRAPH=off";
        else if (!backend) whyNot = experts.why;
        else {
          progress("graph", 0);
          try {
            deviceDecoder = openHybridDecoder(config, weights, backend, env.VKMOE_GRAPH);
          } catch (e) {
            if (!(e instanceof GraphUnsupportedError || e instanceof VkmoeError)) {
              experts[Symbol.dispose]();
              throw e;
            }
            whyNot = e.message;
          }
        }
        if (deviceDecoder?.mode === "resident") log(`vkmoe: resident mode: ${deviceDecoder.why}`);
        else if (deviceDecoder) log(`vkmoe: per-layer mode: ${deviceDecoder.why}`);
        else log(`vkmoe: ${experts.mode === "gpu" ? "per-layer mode (the experts on the GPU, the rest of the token on the CPU decoder)" : "cpu mode"}: the whole-token GPU graph is not used: ${whyNot}`);
        progress("ready", 1);
        return new Model({ path, format: file.format }, config, tokenizer, template, defaults, file, weights, experts, (performance.now() - t0) / 1000, deviceDecoder, whyNot, log);
      }
      const weights = loadWeights(file, config, plan, path, (f) => progress("weights", f));
      const reserveBytes = graphReserveBytes(config, weights, options.ctx ?? Math.min(4096, config.maxPositions), chunk);
      const experts = openExperts(config, weights, { log, budgetMB: options.budgetMB, env, syncValidation: options.syncValidation, reserveBytes, progress: (f) => progress("experts", f) });
      let deviceDecoder: DeviceDecoder | undefined, whyNot = "";
      const backend = experts.gpuBackend;
      if (env.VKMOE_GRAPH === "off") whyNot = "VKMOE_GRAPH=off";
      else if (!backend) whyNot = experts.why;
      else {
        progress("graph", 0);
        try {
          deviceDecoder = openDeviceDecoder(config, weights, backend, env.VKMOE_GRAPH);
        } catch (e) {
          // out of device memory (or any other driver refusal) degrades to per-layer mode
          if (!(e instanceof GraphUnsupportedError || e instanceof VkmoeError)) {
            experts[Symbol.dispose]();
            throw e;
          }
          whyNot = e.message;
        }
      }
      if (deviceDecoder?.mode === "split") log(`vkmoe: per-layer mode: ${deviceDecoder.why}`);
      else if (backend && !deviceDecoder) log(`vkmoe: per-layer mode (the experts on the GPU, the rest of the token on the CPU): ${whyNot}`);
      progress("ready", 1);
      return new Model({ path, format: file.format }, config, tokenizer, template, defaults, file, weights, experts, (performance.now() - t0) / 1000, deviceDecoder, whyNot, log);
    } catch (e) {
      file[Symbol.dispose]();
      throw e;
    }
  }

  /**
   * Where tokens run and why, in one line: "resident" (the whole token on the GPU), "per-layer"
   * (the experts on the GPU), or "cpu". `experts` says where the routed experts run.
   */
  get device(): { mode: RunMode; why: string; experts: "gpu" | "cpu" } {
    const experts = this.experts.mode;
    if (this.deviceDecoder?.mode === "resident") return { mode: "resident", why: `${this.deviceDecoder.why}; experts: ${this.experts.why}`, experts };
    if (this.deviceDecoder) return { mode: "per-layer", why: `${this.deviceDecoder.why}; experts: ${this.experts.why}`, experts };
    if (experts === "gpu") return { mode: "per-layer", why: `${this.experts.why}; not resident: ${this.whyNotResident}`, experts };
    return { mode: "cpu", why: this.experts.why, experts };
  }

  /** The GPU expert cache's counters (hits, misses, evictions, uploads...), undefined on the CPU path. */
  expertCacheStats(): Record<string, number> | undefined {
    const cache = this.experts.gpuBackend?.stats().cache;
    return cache ? { ...cache } as unknown as Record<string, number> : undefined;
  }

  /** Validation-layer messages of the GPU path since the last call (VKMOE_VALIDATION=1), one line each. */
  takeValidationMessages(): string[] {
    return this.experts.takeValidationMessages();
  }

  /** Tests: the next GPU wait fails as if the device were lost (sessions continue on the CPU); `first` says whose wait. */
  simulateDeviceLoss(first: "graph" | "experts" = "graph"): void {
    // `first`: which user of the device sees the loss first (a per-layer split run can meet it in
    // either: in its own wait, or in the MoE layer's)
    this.experts.simulateDeviceLoss();
    if (first === "graph") this.deviceDecoder?.simulateDeviceLoss();
  }

  session(options: SessionOptions = {}): Session {
    this.checkLive();
    return new Session(this.cpuDecoder(), this.config, options, this.deviceDecoder, this.log, (why) => this.deviceLost(why), () => (this.experts.mode === "gpu" ? this.config.moeLayers.filter(Boolean).length : 0));
  }

  /** A CPU decoder of this model's architecture (one per session: it holds scratch buffers). */
  private cpuDecoder(): CpuDecoder {
    return this.config.architecture === "qwen3_5_moe"
      ? new HybridDecoder(this.config, this.weights as HybridWeights, this.experts)
      : new Decoder(this.config, this.weights as ModelWeights, this.experts);
  }

  /**
   * `slots` sequences of `ctx` tokens decoding together (a server's continuous batching): one
   * replay a step where the model runs resident, else a Session per slot (one line says why).
   */
  batch(options: { slots: number; ctx?: number }): SessionBatch {
    this.checkLive();
    const ctx = options.ctx ?? Math.min(4096, this.config.maxPositions);
    const decoder = this.deviceDecoder;
    let opened: { device?: DeviceBatch; why?: string } = { why: `the model runs ${this.device.mode}` };
    if (decoder?.mode === "resident") opened = openDeviceBatch(() => decoder.batch(options.slots, ctx));
    if (decoder?.mode === "resident" && opened.why) this.log(`vkmoe: the batch of ${options.slots} runs a session per slot: ${opened.why}`);
    return new SessionBatch(this.config, options.slots, ctx, opened.device, (c) => this.session({ ctx: c }), this.log, (why) => this.deviceLost(why));
  }

  /** A session lost the device: the graph and the experts' GPU path are dropped; sessions continue on the CPU. */
  private deviceLost(why: string): void {
    try {
      this.deviceDecoder?.[Symbol.dispose]();
    } catch {
      // nothing more to free on a lost device
    }
    this.deviceDecoder = undefined;
    this.whyNotResident = why;
    this.experts.abandonGpu(why);
  }

  private checkLive(): void {
    if (this.disposed) throw new InvalidArgumentError("the model is disposed");
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.deviceDecoder?.[Symbol.dispose]();
    this.deviceDecoder = undefined;
    this.experts[Symbol.dispose]();
    this.file[Symbol.dispose]();
  }
}

/** Device bytes the decode graph takes beside the experts: dense weights, norms, an f16 KV cache of ctx positions, and prompt chunks of `chunk` tokens. */
function graphReserveBytes(cfg: Qwen3MoeConfig, w: ModelWeights, ctx: number, chunk: number): number {
  let bytes = w.lmHead.bytes + 4 * cfg.hidden * (1 + 2 * cfg.layers);
  for (const l of w.layers) {
    const a = l.attention;
    bytes += a.q.bytes + a.k.bytes + a.v.bytes + a.o.bytes + (l.router?.bytes ?? 0) + 8 * cfg.headDim;
  }
  // the attention's partial records (decode: a record per 32 positions for 4 tokens; a prompt
  // chunk: 16 a row for 64 tokens), a chunk's activations (the residual, norms, q/k/v, attention,
  // router logits) and its experts' gate/up and down rows, and about 8 MiB of tables and scratch
  const record = 4 * cfg.heads * (cfg.headDim + 4);
  const partials = Math.max(4 * Math.ceil(ctx / 32), 64 * 16) * record;
  const D = cfg.hidden, qd = cfg.heads * cfg.headDim, kvd = cfg.kvHeads * cfg.headDim;
  const perToken = 4 * (6 * D + 2 * qd + 2 * kvd + cfg.experts + cfg.topK * (cfg.expertIntermediate + D));
  return bytes + 2 * cfg.layers * ctx * kvd * 2 + partials + chunk * perToken + 8 * 2 ** 20;
}

function readJson(path: string): Record<string, unknown> {
  try {
    const v = JSON.parse(readFileSync(path, "utf8"));
    if (v === null || typeof v !== "object" || Array.isArray(v)) throw new Error("not a JSON object");
    return v;
  } catch (e) {
    throw new ModelConfigError(`${path} is not a readable JSON object: ${(e as Error).message}`);
  }
}

function failNoConfig(path: string): never {
  throw new ModelConfigError(`${path}: a safetensors file needs its directory's config.json; give the directory`);
}

function hasChatTemplate(dir: string): boolean {
  if (existsSync(join(dir, "chat_template.jinja"))) return true;
  const p = join(dir, "tokenizer_config.json");
  return existsSync(p) && readJson(p).chat_template !== undefined;
}
