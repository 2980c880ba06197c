/**
 * The routed experts of every MoE layer behind one call, `forward(layer, x, routing, y)`: q4/q8
 * experts run through `MoeBackend` (the GPU, or its CPU path, with one line saying why); GGML block
 * experts (Q4_K, Q5_K, Q6_K, Q5_0 ... of K-quant files) through `GgmlMoeBackend` (resident on the GPU
 * as the file holds them, or on the CPU with one line saying why); float experts (`--quant none`,
 * float GGUF experts) on the CPU, read in place from the file, f64 sums.
 */
import { collectGarbage } from "../ffi/index.ts";
import { MoeBackend } from "../moe/backend.ts";
import { GgmlMoeBackend } from "../moe/ggml-backend.ts";
import type { GgmlExpertTensors } from "../moe/ggml-experts.ts";
import type { ExpertWeights } from "../moe/reference.ts";
import type { Routing } from "../moe/routing.ts";
import type { QuantFormat } from "../quant/types.ts";
import type { VkmoeEnv } from "../config.ts";
import type { Qwen3MoeConfig } from "./config.ts";
import { GgmlBlockLinear, type Linear } from "./linear.ts";
import { silu } from "./ops.ts";
import type { ExpertMatrices, LayerWeights, ModelWeights } from "./weights.ts";

export interface ExpertRunner extends Disposable {
  /** "gpu" when every MoE layer runs on the GPU. */
  readonly mode: "gpu" | "cpu";
  /** One line: where the experts run and why. */
  readonly why: string;
  forward(layer: number, x: Float32Array, r: Routing, y: Float32Array): void;
  /** Validation-layer messages of the GPU path since the last call (VKMOE_VALIDATION=1). */
  takeValidationMessages(): string[];
  /** Tests: the next GPU call fails as if the device were lost. */
  simulateDeviceLoss(): void;
  /** The device was lost under the decode graph: every backend to the CPU, silently (the session says it in one line). */
  abandonGpu(why: string): void;
  /** The one GPU backend every MoE layer runs on, when there is one (the decode graph routes on its device). */
  readonly gpuBackend: MoeBackend | GgmlMoeBackend | undefined;
}

export interface ExpertRunnerOptions {
  log?: (line: string) => void;
  budgetMB?: number;
  env?: VkmoeEnv;
  /** Bytes of converted experts kept for the CPU paths (they would be converted again on every call). */
  cpuCacheBytes?: number;
  /** Fraction of the experts uploaded so far, while they upload. */
  progress?: (fraction: number) => void;
  /** Khronos synchronization validation too (with VKMOE_VALIDATION=1; tests). */
  syncValidation?: boolean;
  /** Bytes of device memory the default expert budget leaves for the decode graph. */
  reserveBytes?: number;
}

/** Converted experts, kept while they fit in a byte budget (oldest dropped first). */
class ExpertCache<T> {
  private readonly map = new Map<number, { value: T; bytes: number }>();
  private used = 0;
  constructor(private readonly limit: number) {}
  get(key: number, make: () => T, size: (v: T) => number): T {
    const hit = this.map.get(key);
    if (hit) return hit.value;
    const value = make();
    const bytes = size(value);
    if (bytes > this.limit) return value;
    while (this.used + bytes > this.limit) {
      const [k, v] = this.map.entries().next().value!;
      this.map.delete(k);
      this.used -= v.bytes;
    }
    this.map.set(key, { value, bytes });
    this.used += bytes;
    return value;
  }
}

const quantBytes = (e: ExpertWeights) => [e.gate, e.up, e.down].reduce((n, m) => n + m.weights.byteLength + m.scales.byteLength, 0);

/** What the experts need of a model's config and weights (Qwen3-MoE's, or Qwen3.5's: the routed experts are alike). */
export type ExpertConfig = Pick<Qwen3MoeConfig, "hidden" | "expertIntermediate" | "experts" | "topK" | "layers">;
export type ExpertSource = Pick<ModelWeights, "expert" | "releaseExperts"> & { layers: readonly Pick<LayerWeights, "expertFormat" | "expertTypes" | "expertBytes">[] };

export function openExperts(cfg: ExpertConfig, weights: ExpertSource, options: ExpertRunnerOptions = {}): ExpertRunner {
  const log = options.log ?? ((line: string) => console.error(line));
  const formats = new Set(weights.layers.map((l) => l.expertFormat).filter((f) => f !== undefined));
  const cacheBytes = options.cpuCacheBytes ?? 512 * 2 ** 20;
  const backends = new Map<QuantFormat, MoeBackend>();
  // Float and GGML block experts: Linears over the mapped file, run by the CPU.
  const cpu = formats.has("float") || formats.has("ggml") ? new CpuExperts(cfg, weights) : undefined;
  const E = cfg.experts;
  // GGML block layers the GPU kernels take: every matrix a GGML block type, gate and up alike.
  const ggmlLayers = weights.layers.flatMap((l, i) => (l.expertFormat === "ggml" ? [i] : []));
  const ggmlGpuLayers = ggmlLayers.filter((l) => ggmlTensors(weights, l, 0) !== undefined);
  let ggml: GgmlMoeBackend | undefined;
  try {
    for (const f of formats) {
      if (f === "float" || f === "ggml") continue;
      const cache = new ExpertCache<ExpertWeights>(cacheBytes);
      let backend: MoeBackend | undefined;
      const convert = (l: number, e: number): ExpertWeights => {
        const m = weights.expert(l, e) as Extract<ExpertMatrices, { kind: "quant" }>;
        return { gate: m.gate, up: m.up, down: m.down };
      };
      backend = MoeBackend.open({
        shape: { format: f, groupSize: 32, scaleType: "f16", hidden: cfg.hidden, intermediate: cfg.expertIntermediate },
        experts: E,
        topK: cfg.topK,
        layers: cfg.layers,
        // The GPU path asks once per upload; its CPU path asks on every call, so those are kept.
        weights: (l, e) => (backend?.mode === "cpu" ? cache.get(l * E + e, () => convert(l, e), quantBytes) : convert(l, e)),
        budgetMB: options.budgetMB,
        reserveBytes: Math.ceil(options.reserveBytes ?? 0),
        syncValidation: options.syncValidation ?? false,
        log,
      }, options.env);
      backends.set(f, backend);
    }
    if (ggmlGpuLayers.length > 0) {
      let done = 0;
      ggml = GgmlMoeBackend.open({
        hidden: cfg.hidden, intermediate: cfg.expertIntermediate, experts: E, topK: cfg.topK, layers: cfg.layers, moeLayers: ggmlGpuLayers,
        tensors: (l, e) => ggmlTensors(weights, l, e)!,
        cpu: cpu!,
        budgetMB: options.budgetMB,
        reserveBytes: Math.ceil(options.reserveBytes ?? 0),
        syncValidation: options.syncValidation ?? false,
        // each layer's upload copies its experts into one short-lived array: freed now, not late
        progress: () => {
          collectGarbage();
          options.progress?.(++done / ggmlGpuLayers.length);
        },
        log,
      }, options.env);
      if (ggml.mode === "gpu") for (const l of ggmlGpuLayers) weights.releaseExperts(l);
    }
  } catch (e) {
    for (const b of backends.values()) b[Symbol.dispose]();
    ggml?.[Symbol.dispose]();
    throw e;
  }
  // Upload every expert now, so that the first tokens do not wait on uploads.
  const moeLayers = weights.layers.flatMap((l, i) => (l.expertFormat === "q4" || l.expertFormat === "q8" ? [i] : []));
  let done = 0;
  for (const [f, backend] of backends) {
    const mine = moeLayers.filter((l) => weights.layers[l]!.expertFormat === f);
    const r = backend.preload(mine, () => {
      // Each layer's experts were converted into short-lived arrays (2.5 MB each for Qwen3-30B-A3B)
      // that Bun's collector frees late: without this, peak RSS grew by their whole size (16 GB).
      collectGarbage();
      options.progress?.(++done / moeLayers.length);
    });
    // On the GPU now: the file's copy need not stay in this process's memory.
    if (backend.mode === "gpu") for (const l of r.complete) weights.releaseExperts(l);
    if (r.skipped > 0) log(`vkmoe: ${r.loaded} of ${r.loaded + r.skipped} experts fit the GPU budget; the others upload when routed to, evicting colder ones`);
  }
  const onGgml = new Set(ggmlGpuLayers);
  const byLayer = weights.layers.map((l, i) => {
    const f = l.expertFormat;
    return f === undefined ? undefined : onGgml.has(i) ? ggml! : f === "float" || f === "ggml" ? cpu! : backends.get(f)!;
  });
  // The layers only the CPU runs (the GGML backend says its own line when it runs on the CPU).
  const cpuOnly = weights.layers.map((l, i) => (onGgml.has(i) ? {} : l));
  const cpuWhy = cpuExpertsWhy(cpuOnly);
  if (cpuWhy) log(`vkmoe: ${cpuWhy}`);
  const all: (MoeBackend | GgmlMoeBackend)[] = [...backends.values(), ...(ggml ? [ggml] : [])];
  const cpuLayers = cpuOnly.some((l) => l.expertFormat === "float" || l.expertFormat === "ggml");
  return {
    // Read each time: a lost device moves a backend to the CPU mid-generation.
    get mode() {
      return all.length > 0 && !cpuLayers && all.every((b) => b.mode === "gpu") ? "gpu" : "cpu";
    },
    get why() {
      const parts = all.map((b) => b.why);
      if (cpuWhy) parts.push(cpuWhy);
      return parts.join("; ") || "no MoE layers";
    },
    forward: (layer, x, r, y) => byLayer[layer]!.forward(layer, x, r, y),
    abandonGpu: (why) => all.forEach((b) => b.abandonGpu(why)),
    get gpuBackend() {
      return all.length === 1 && !cpuLayers && all[0]!.mode === "gpu" ? all[0] : undefined;
    },
    takeValidationMessages: () => all.flatMap((b) => b.takeValidationMessages()),
    simulateDeviceLoss: () => all.forEach((b) => b.injectDeviceLost()),
    [Symbol.dispose]: () => {
      for (const b of all) b[Symbol.dispose]();
    },
  };
}

const MiB = 2 ** 20;

const GGML_GPU_TYPES = "Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

/**
 * Layer l's expert e as GGML block tensors the GPU kernels take (every matrix a GGML block type,
 * gate and up of one type), or undefined (a Q8_0 or Q4_0 matrix beside K-quants: llama-quantize's
 * fallback where a row is not a whole number of 256-element blocks).
 */
function ggmlTensors(weights: ExpertSource, l: number, e: number): GgmlExpertTensors | undefined {
  const m = weights.expert(l, e);
  if (m.kind !== "linear" || !(m.gate instanceof GgmlBlockLinear) || !(m.up instanceof GgmlBlockLinear) || !(m.down instanceof GgmlBlockLinear)) return undefined;
  if (m.gate.tensor.type !== m.up.tensor.type) return undefined;
  return { gate: m.gate.tensor, up: m.up.tensor, down: m.down.tensor };
}

/**
 * Why some experts run on the CPU, one clause ("" when none do): GGML block experts the GPU kernels
 * do not take ("Q5_0/Q8_0 experts run on the CPU: ... (read in place: 3.6 MiB of the mapped file)"),
 * and/or the float experts'.
 */
function cpuExpertsWhy(layers: ExpertSource["layers"]): string {
  const parts: string[] = [];
  for (const format of ["ggml", "float"] as const) {
    const mine = layers.filter((l) => l.expertFormat === format);
    if (mine.length === 0) continue;
    const types = [...new Set(mine.flatMap((l) => l.expertTypes ?? []))].join("/");
    const bytes = mine.reduce((n, l) => n + (l.expertBytes ?? 0), 0);
    const where = `read in place: ${(bytes / MiB).toFixed(1)} MiB of the mapped file`;
    parts.push(format === "ggml"
      ? `${types} experts run on the CPU: the GPU's GGML MoE kernels take ${GGML_GPU_TYPES} with gate and up alike (${where})`
      : `${types} experts run on the CPU as floats (--quant none or a float GGUF; the GPU's MoE kernels take q4/q8 weights; ${where})`);
  }
  return parts.join("; ");
}

/**
 * Float and GGML block experts on the CPU: y = Σ w · down(silu(gate x) ⊙ up x), each matrix a Linear
 * over the mapped file (no converted copy; GgmlBlockLinear decodes one block at a time).
 */
class CpuExperts {
  /** Views over the mapped file cost nothing to keep, so every expert's Linear objects are kept once made. */
  private readonly cache = new Map<number, Extract<ExpertMatrices, { kind: "linear" }>>();
  /** Scratch, grown to the largest call: gathered inputs, gate, up, expert outputs, and each (token, slot) pair's output. */
  private xs = new Float32Array(0);
  private g = new Float32Array(0);
  private u = new Float32Array(0);
  private o = new Float32Array(0);
  private pairOut = new Float32Array(0);

  constructor(readonly cfg: ExpertConfig, readonly weights: ExpertSource) {}

  private expert(layer: number, id: number): Extract<ExpertMatrices, { kind: "linear" }> {
    const key = layer * this.cfg.experts + id;
    let m = this.cache.get(key);
    // Made on first use: a GGML expert's scales are checked then (NonFiniteValueError naming tensor, expert, row, block).
    if (!m) this.cache.set(key, (m = this.weights.expert(layer, id) as Extract<ExpertMatrices, { kind: "linear" }>));
    return m;
  }

  forward(layer: number, x: Float32Array, r: Routing, y: Float32Array): void {
    const D = this.cfg.hidden, I = this.cfg.expertIntermediate, pairs = r.S * r.k;
    if (this.pairOut.length < pairs * D) {
      this.xs = new Float32Array(pairs * D);
      this.g = new Float32Array(pairs * I);
      this.u = new Float32Array(pairs * I);
      this.o = new Float32Array(pairs * D);
      this.pairOut = new Float32Array(pairs * D);
    }
    // Each expert once for all its tokens of the call: a block's weights are decoded once, not once a token.
    const byExpert = new Map<number, number[]>();
    for (let p = 0; p < pairs; p++) {
      const id = r.ids[p]!;
      const list = byExpert.get(id);
      if (list) list.push(p);
      else byExpert.set(id, [p]);
    }
    for (const [id, list] of byExpert) {
      const m = this.expert(layer, id), n = list.length;
      list.forEach((p, t) => this.xs.set(x.subarray(Math.floor(p / r.k) * D, (Math.floor(p / r.k) + 1) * D), t * D));
      m.gate.apply(this.xs, n, this.g);
      m.up.apply(this.xs, n, this.u);
      for (let i = 0; i < n * I; i++) this.g[i] = silu(this.g[i]!) * this.u[i]!;
      m.down.apply(this.g, n, this.o);
      list.forEach((p, t) => this.pairOut.set(this.o.subarray(t * D, (t + 1) * D), p * D));
    }
    // Summed in routing order, as one token at a time would.
    y.fill(0, 0, r.S * D);
    for (let p = 0; p < pairs; p++) {
      const w = r.weights[p]!, s = Math.floor(p / r.k);
      for (let d = 0; d < D; d++) y[s * D + d] = y[s * D + d]! + w * this.pairOut[p * D + d]!;
    }
  }

  [Symbol.dispose](): void {}
}

export type { Linear };
