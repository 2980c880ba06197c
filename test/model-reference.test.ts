/**
 * The decoder against transformers' own outputs (../shared/fixtures, README there): the Hugging
 * Face directory in float (`quant: "none"`), and each GGUF against the reference transformers
 * computed over that file's dequantized tensors, on the GPU (Lavapipe in CI, validation layer on)
 * and the CPU path, float and integer-dot GEMV paths. Bounds: the issue's (logits NMSE 1e-5 float,
 * 5e-3 integer-dot) are loose for an exact float path, so the float checks hold 1e-8 (measured
 * ~1e-12): a wrong RoPE precision (6.7e-6) or a skipped op fails them.
 */
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { Model, type QuantChoice } from "../src/model/model.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";

interface PromptReference {
  kind: string;
  input_ids: number[];
  top16_ids: number[][];
  top16_logits: number[][];
  router_topk_per_layer?: number[][][];
  hidden_states_rms?: number[][];
  greedy_new_ids: number[];
  greedy_top1_margin: number[];
}

function reference(name: string): { prompts: PromptReference[]; logits: Float32Array } | undefined {
  const base = name.endsWith(".gguf") ? name.replace(/\.gguf$/, ".reference") : `${name}/reference`;
  const json = fixture(`${base}.json`);
  const bin = fixture(`${base}-logits.f32`);
  if (!json || !bin) return undefined;
  const bytes = readFileSync(bin);
  return { prompts: JSON.parse(readFileSync(json, "utf8")).prompts, logits: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4) };
}

const argmax = (x: Float32Array) => {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
};

/** Greedy ids equal to the reference's for every step before the first whose top-1 margin is below `margin`. */
function checkGreedy(model: Model, p: PromptReference, margin: number): { compared: number } {
  const session = model.session({ ctx: p.input_ids.length + p.greedy_new_ids.length + 1 });
  let logits = session.prefill(p.input_ids);
  let compared = 0;
  for (let step = 0; step < p.greedy_new_ids.length; step++) {
    if (p.greedy_top1_margin[step]! < margin) break;
    const id = argmax(logits);
    expect({ step, id }).toEqual({ step, id: p.greedy_new_ids[step]! });
    compared++;
    logits = session.step(id);
  }
  return { compared };
}

function env(overrides: Partial<VkmoeEnv>): VkmoeEnv {
  return { ...readConfig(), VKMOE_VALIDATION: true, ...overrides };
}

async function load(name: string, e: VkmoeEnv, quant: QuantChoice = "auto"): Promise<Model | undefined> {
  const path = fixture(name);
  if (!path) return undefined;
  return Model.load(path, { quant, env: e, log: () => {} });
}

function checkLogits(model: Model, ref: { prompts: PromptReference[]; logits: Float32Array }, bound: number): number[] {
  const V = model.config.vocab;
  return ref.prompts.map((p, i) => {
    const logits = model.session({ ctx: 128 }).prefill(p.input_ids);
    const e = nmse(ref.logits.subarray(i * V, (i + 1) * V), logits);
    expect(e).toBeLessThanOrEqual(bound);
    return e;
  });
}

describe("Hugging Face directory, float (quant none)", () => {
  test("logits, every position's top-16, hidden-state RMS and router top-k per layer, greedy ids", async () => {
    const ref = reference("qwen3-moe-tiny");
    using model = (await load("qwen3-moe-tiny", env({}), "none"))!;
    if (!ref || !model) return;
    console.log(`HF float: experts ${model.device.why}; logits NMSE ${checkLogits(model, ref, 1e-8).map((e) => e.toExponential(1)).join(", ")}`);
    const V = model.config.vocab, L = model.config.layers;
    for (const p of ref.prompts) {
      const session = model.session({ ctx: 128 });
      const routes: number[][][] = Array.from({ length: L }, () => []);
      const rms: number[][] = [];
      session.observer = {
        routing: (l, ids, S, k) => {
          for (let t = 0; t < S; t++) routes[l]!.push(Array.from(ids.subarray(t * k, (t + 1) * k)));
        },
        // transformers' hidden_states: the embedding, each layer's output but the last, then the final norm.
        hidden: (l, h, S) => {
          if (l === L - 1) return;
          const D = model.config.hidden;
          rms.push(Array.from({ length: S }, (_, t) => Math.sqrt(h.subarray(t * D, (t + 1) * D).reduce((s, v) => s + v * v, 0) / D)));
        },
      };
      const all = session.prefillAll(p.input_ids);
      expect(routes).toEqual(p.router_topk_per_layer!);
      expect(rms.length).toBe(p.hidden_states_rms!.length);
      for (let l = 0; l < rms.length; l++) for (let t = 0; t < p.input_ids.length; t++) expect(Math.abs(rms[l]![t]! / p.hidden_states_rms![l]![t]! - 1)).toBeLessThan(1e-5);
      for (let t = 0; t < p.input_ids.length; t++) {
        const got = p.top16_ids[t]!.map((id) => all[t * V + id]!);
        for (let j = 0; j < 16; j++) expect(Math.abs(got[j]! - p.top16_logits[t]![j]!)).toBeLessThan(1e-3);
      }
      const { compared } = checkGreedy(model, p, 0.01);
      expect(compared).toBeGreaterThan(0);
    }
  }, 120_000);
});

const ggufCases: { file: string; path: string; env: Partial<VkmoeEnv>; bound: number; margin: number }[] = [];
for (const file of ["qwen3-moe-tiny.Q8_0.gguf", "qwen3-moe-tiny.Q4_0.gguf"]) {
  // The whole token on the GPU keeps its KV cache in f16 (transformers: f32): 4.8e-7 and 1.2e-6 on
  // the Q8_0 file, and on the Q4_0 file's chat prompt 9.2e-4, where the rounded keys move a router
  // choice of this random model (test/model-graph.test.ts holds it to the CPU decoder rounding
  // its cache the same way, at 1e-6). Its bound here is 2e-3; the greedy ids are checked as for
  // the others. The experts per layer (f32 cache on the host) are held to 1e-8.
  ggufCases.push({ file, path: "GPU float", env: { VKMOE_IDP: "off", VKMOE_GRAPH: "on" }, bound: 2e-3, margin: 0.01 });
  ggufCases.push({ file, path: "GPU float per-layer", env: { VKMOE_IDP: "off", VKMOE_GRAPH: "off" }, bound: 1e-8, margin: 0.01 });
  ggufCases.push({ file, path: "CPU", env: { VKMOE_GPU: false }, bound: 1e-8, margin: 0.01 });
  ggufCases.push({ file, path: "GPU integer-dot", env: { VKMOE_IDP: "on", VKMOE_GRAPH: "on" }, bound: 5e-3, margin: 0.1 });
}

describe("GGUF against transformers over the file's own tensors", () => {
  for (const c of ggufCases) {
    test(`${c.file}, ${c.path}: logits NMSE <= ${c.bound}, greedy ids while margins >= ${c.margin}`, async () => {
      const ref = reference(c.file);
      using model = (await load(c.file, env(c.env)))!;
      if (!ref || !model) return;
      expect(model.device.mode).toBe(c.path === "CPU" ? "cpu" : c.path.endsWith("per-layer") ? "per-layer" : "resident");
      if (c.path !== "CPU") expect(model.device.why).toContain(c.path.startsWith("GPU float") ? "float path" : "integer-dot path");
      const errors = checkLogits(model, ref, c.bound);
      const steps = ref.prompts.map((p) => checkGreedy(model, p, c.margin).compared);
      console.log(`${c.file} ${c.path}: logits NMSE ${errors.map((e) => e.toExponential(1)).join(", ")}; greedy ids equal for ${steps.join(" and ")} steps`);
      expect(model.takeValidationMessages()).toEqual([]);
    }, 180_000);
  }
});

describe("Hugging Face directory quantized on load (experts q4, dense q8)", () => {
  test("the GPU and the CPU path agree on the same quantized weights", async () => {
    const ref = reference("qwen3-moe-tiny");
    using gpu = (await load("qwen3-moe-tiny", env({ VKMOE_IDP: "off", VKMOE_GRAPH: "on" })))!;
    using cpu = (await load("qwen3-moe-tiny", env({ VKMOE_GPU: false })))!;
    if (!ref || !gpu || !cpu) return;
    expect(gpu.device.mode).toBe("resident");
    const V = cpu.config.vocab;
    ref.prompts.forEach((p, i) => {
      // the CPU decoder rounds its KV cache to f16 as the GPU's is: the same computation
      const a = gpu.session({ ctx: 64 }).prefill(p.input_ids).slice();
      const b = cpu.session({ ctx: 64, cpuCache: "f16" }).prefill(p.input_ids);
      expect(nmse(b, a)).toBeLessThan(1e-6); // as test/model-graph.test.ts: f16 roundings flip where f32 and f64 sums differ
      // 4-bit experts move this random model far from the float reference (NMSE 0.06-0.08); still the same model.
      expect(nmse(ref.logits.subarray(i * V, (i + 1) * V), b)).toBeLessThan(0.3);
    });
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, 120_000);
});
