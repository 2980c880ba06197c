/**
 * The routed experts of every MoE layer behind one call, `forward(layer, x, routing, y)`: quantized
 * experts run through `MoeBackend` (the GPU, or its CPU path, with one line saying why), float
 * experts (`--quant none`, float GGUF experts) on the CPU in f32 with f64 sums.
 */
import { collectGarbage } from "../ffi/index.ts";
import { MoeBackend } from "../moe/backend.ts";
import type { ExpertWeights } from "../moe/reference.ts";
import type { Routing } from "../moe/routing.ts";
import type { QuantFormat } from "../quant/types.ts";
import type { VkmoeEnv } from "../config.ts";
import type { Qwen3MoeConfig } from "./config.ts";
import type { Linear } from "./linear.ts";
import { silu } from "./ops.ts";
import type { ExpertMatrices, ModelWeights } from "./weights.ts";

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
  readonly gpuBackend: MoeBackend | undefined;
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

export function openExperts(cfg: Qwen3MoeConfig, weights: ModelWeights, options: ExpertRunnerOptions = {}): ExpertRunner {
  const log = options.log ?? ((line: string) => console.error(line));
  const formats = new Set(weights.layers.map((l) => l.expertFormat).filter((f) => f !== undefined));
  const cacheBytes = options.cpuCacheBytes ?? 512 * 2 ** 20;
  const backends = new Map<QuantFormat, MoeBackend>();
  let float: FloatExperts | undefined;
  const E = cfg.experts;
  try {
    for (const f of formats) {
      if (f === "float") {
        float = new FloatExperts(cfg, weights);
        continue;
      }
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
  } catch (e) {
    for (const b of backends.values()) b[Symbol.dispose]();
    throw e;
  }
  // Upload every expert now, so that the first tokens do not wait on uploads.
  const moeLayers = weights.layers.flatMap((l, i) => (l.expertFormat !== undefined && l.expertFormat !== "float" ? [i] : []));
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
  const byLayer = weights.layers.map((l) => (l.expertFormat === undefined ? undefined : l.expertFormat === "float" ? float! : backends.get(l.expertFormat)!));
  if (float) log("vkmoe: float experts (--quant none or a float GGUF) run on the CPU; the GPU's MoE kernels take q4/q8 weights");
  const all = [...backends.values()];
  return {
    // Read each time: a lost device moves a backend to the CPU mid-generation.
    get mode() {
      return all.length > 0 && !float && all.every((b) => b.mode === "gpu") ? "gpu" : "cpu";
    },
    get why() {
      const parts = all.map((b) => b.why);
      if (float) parts.push("float experts on the CPU (the GPU's MoE kernels take q4/q8 weights)");
      return parts.join("; ") || "no MoE layers";
    },
    forward: (layer, x, r, y) => byLayer[layer]!.forward(layer, x, r, y),
    abandonGpu: (why) => all.forEach((b) => b.abandonGpu(why)),
    get gpuBackend() {
      return all.length === 1 && !float && all[0]!.mode === "gpu" ? all[0] : undefined;
    },
    takeValidationMessages: () => all.flatMap((b) => b.takeValidationMessages()),
    simulateDeviceLoss: () => all.forEach((b) => b.injectDeviceLost()),
    [Symbol.dispose]: () => {
      for (const b of all) b[Symbol.dispose]();
    },
  };
}

/** Float experts on the CPU: y = Σ w · down(silu(gate x) ⊙ up x). */
class FloatExperts {
  /** Views over the mapped file cost nothing to keep, so every expert's Linear objects are kept once made. */
  private readonly cache = new Map<number, Extract<ExpertMatrices, { kind: "float" }>>();
  private readonly g: Float32Array;
  private readonly u: Float32Array;
  private readonly out: Float32Array;

  constructor(readonly cfg: Qwen3MoeConfig, readonly weights: ModelWeights) {
    this.g = new Float32Array(cfg.expertIntermediate);
    this.u = new Float32Array(cfg.expertIntermediate);
    this.out = new Float32Array(cfg.hidden);
  }

  forward(layer: number, x: Float32Array, r: Routing, y: Float32Array): void {
    const D = this.cfg.hidden, E = this.cfg.experts, I = this.cfg.expertIntermediate;
    y.fill(0, 0, r.S * D);
    for (let s = 0; s < r.S; s++) {
      const xs = x.subarray(s * D, (s + 1) * D);
      for (let j = 0; j < r.k; j++) {
        const id = r.ids[s * r.k + j]!;
        const key = layer * E + id;
        let m = this.cache.get(key);
        if (!m) this.cache.set(key, (m = this.weights.expert(layer, id) as Extract<ExpertMatrices, { kind: "float" }>));
        m.gate.apply(xs, 1, this.g);
        m.up.apply(xs, 1, this.u);
        for (let i = 0; i < I; i++) this.g[i] = silu(this.g[i]!) * this.u[i]!;
        m.down.apply(this.g, 1, this.out);
        const w = r.weights[s * r.k + j]!;
        for (let d = 0; d < D; d++) y[s * D + d] = y[s * D + d]! + w * this.out[d]!;
      }
    }
  }

  [Symbol.dispose](): void {}
}

export type { Linear };
