/**
 * The host's tests share one loaded fixture model (the Q8_0 GGUF on Lavapipe, per-layer mode) and
 * start servers over it in-process on 127.0.0.1, port 0. Float atomics are off so that the MoE
 * layer's sums are deterministic (fused calls add in whatever order the GPU runs them): greedy
 * texts compared across runs must not differ by a rounding-level flip.
 */
import { readConfig } from "../../src/config.ts";
import { generate, Model, promptIds, type PromptOptions } from "../../src/engine/index.ts";
import { samplingFromModel } from "../../src/sampling/defaults.ts";
import { fixture } from "./fixtures.ts";

export const modelPath = fixture("qwen3-moe-tiny.Q8_0.gguf");

export function loadHostModel(): Promise<Model> {
  return Model.load(modelPath!, { env: { ...readConfig(), VKMOE_FLOAT_ATOMICS: "off" }, log: () => {}, ctx: 256 });
}

/** What the engine's own generate() gives: the oracle for the server's greedy replies. */
export function engineReply(model: Model, prompt: string, options: { raw?: boolean; maxTokens: number; stop?: string[]; ctx: number; enableThinking?: boolean; sampling?: Record<string, number> }) {
  const ids = promptIds(model, prompt, { raw: options.raw, enableThinking: options.enableThinking } satisfies PromptOptions);
  using session = model.session({ ctx: options.ctx });
  const run = generate(model, session, ids, { maxTokens: options.maxTokens, stop: options.stop, sampling: samplingFromModel(model.generationDefaults, options.sampling ?? { temperature: 0 }) });
  let r = run.next();
  while (!r.done) r = run.next();
  return { ...r.value, promptIds: ids };
}

/** GET /metrics as name{labels} → value. */
export async function metricsOf(url: string, apiKey?: string): Promise<Map<string, number>> {
  const r = await fetch(`${url}/metrics`, { headers: apiKey ? { Authorization: `Bearer ${apiKey}` } : {} });
  const text = await r.text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** Polls `check` until it is true or `ms` pass; returns whether it became true. */
export async function eventually(check: () => Promise<boolean>, ms = 5000): Promise<boolean> {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return check();
}
