/**
 * A loaded model: `Model.load(path)` takes a Hugging Face directory or a GGUF file and returns the
 * decoder with its tokenizer, chat template and generation defaults; `model.session({ ctx })` opens
 * a sequence. Model code knows no Vulkan type: the experts' device lives behind ExpertRunner.
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { VkmoeEnv } from "../config.ts";
import { InvalidArgumentError } from "../errors.ts";
import { openTensorFile } from "../formats/index.ts";
import type { GgufFile, TensorFile } from "../formats/tensor.ts";
import { ChatTemplate } from "../tokenizer/chat-template.ts";
import { TextTokenizer } from "../tokenizer/tokenizer.ts";
import { configFromGguf, configFromHf, type Qwen3MoeConfig } from "./config.ts";
import { Decoder } from "./decoder.ts";
import { ModelConfigError } from "./errors.ts";
import { openExperts, type ExpertRunner } from "./experts.ts";
import { Session, type SessionOptions } from "./session.ts";
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
}

export interface ModelSource {
  path: string;
  format: "gguf" | "safetensors";
}

export class Model implements Disposable {
  private disposed = false;
  private constructor(
    readonly source: ModelSource,
    readonly config: Qwen3MoeConfig,
    readonly tokenizer: TextTokenizer,
    /** undefined when the model files carry no chat template (then only raw prompts work). */
    readonly chatTemplate: ChatTemplate | undefined,
    /** Sampling defaults the files carry: generation_config.json's fields, or GGUF general.sampling.* keys. */
    readonly generationDefaults: Readonly<Record<string, unknown>>,
    private readonly file: TensorFile,
    private readonly weights: ModelWeights,
    private readonly experts: ExpertRunner,
    /** Seconds from load() to ready. */
    readonly loadSeconds: number,
  ) {}

  static async load(path: string, options: LoadOptions = {}): Promise<Model> {
    const t0 = performance.now();
    const log = options.log ?? ((line: string) => console.error(line));
    const progress = options.progress ?? (() => {});
    const quant = options.quant ?? "auto";
    if (!QUANT_CHOICES.includes(quant)) throw new InvalidArgumentError(`quant must be one of ${QUANT_CHOICES.join(", ")}, got ${String(quant)}`);
    const isDir = existsSync(path) && statSync(path).isDirectory();
    let hfConfig: Qwen3MoeConfig | undefined;
    if (isDir) {
      const configPath = join(path, "config.json");
      if (!existsSync(configPath)) throw new ModelConfigError(`${path} has no config.json (a Hugging Face model directory needs config.json, model.safetensors and tokenizer.json)`);
      hfConfig = configFromHf(readJson(configPath), configPath);
    }
    progress("mapping", 0);
    const file = await openTensorFile(path);
    try {
      let config: Qwen3MoeConfig, tokenizer: TextTokenizer, template: ChatTemplate | undefined, defaults: Record<string, unknown>;
      let plan: QuantPlan;
      if (file.format === "gguf") {
        const meta = (file as GgufFile).metadata as Record<string, unknown>;
        config = configFromGguf(meta, (n) => file.tensors.has(n), path);
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
      const weights = loadWeights(file, config, plan, path, (f) => progress("weights", f));
      const experts = openExperts(config, weights, { log, budgetMB: options.budgetMB, env: options.env, progress: (f) => progress("experts", f) });
      progress("ready", 1);
      return new Model({ path, format: file.format }, config, tokenizer, template, defaults, file, weights, experts, (performance.now() - t0) / 1000);
    } catch (e) {
      file[Symbol.dispose]();
      throw e;
    }
  }

  /** Where the routed experts run ("gpu" or "cpu") and why, in one line. */
  get device(): { mode: "gpu" | "cpu"; why: string } {
    return { mode: this.experts.mode, why: this.experts.why };
  }

  /** Validation-layer messages of the GPU path since the last call (VKMOE_VALIDATION=1), one line each. */
  takeValidationMessages(): string[] {
    return this.experts.takeValidationMessages();
  }

  /** Tests: the next GPU call of the experts fails as if the device were lost (they continue on the CPU). */
  simulateDeviceLoss(): void {
    this.experts.simulateDeviceLoss();
  }

  session(options: SessionOptions = {}): Session {
    this.checkLive();
    return new Session(new Decoder(this.config, this.weights, this.experts), this.config, options);
  }

  private checkLive(): void {
    if (this.disposed) throw new InvalidArgumentError("the model is disposed");
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.experts[Symbol.dispose]();
    this.file[Symbol.dispose]();
  }
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
