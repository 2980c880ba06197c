/**
 * What can fail on a user's machine while a model runs: the device lost mid-generation (the experts
 * continue on the CPU path, with one line, and the greedy ids stay the reference's), and a GPU
 * budget too small for the experts (they upload when routed to, evicting colder ones; same answer).
 * Lavapipe, validation layer on.
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig } from "../src/config.ts";
import { generate } from "../src/engine/generate.ts";
import { Model } from "../src/model/model.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";

const FILE = "qwen3-moe-tiny.Q8_0.gguf";

function referencePrompt(): { input_ids: number[]; greedy_new_ids: number[]; greedy_top1_margin: number[] } | undefined {
  const path = fixture(FILE.replace(/\.gguf$/, ".reference.json"));
  return path ? JSON.parse(readFileSync(path, "utf8")).prompts[0] : undefined;
}

const env = { ...readConfig(), VKMOE_VALIDATION: true, VKMOE_IDP: "off" as const, VKMOE_GRAPH: "on" as const };

// resident; per-layer on the CPU decoder (VKMOE_GRAPH=off); per-layer split (the dense ops on the GPU, a small
// budget), the loss met in the graph's wait or in the MoE layer's
for (const mode of ["resident", "per-layer", "per-layer split", "per-layer split, met by the MoE layer"] as const) {
  test(`${mode}: device lost at the 10th generated token: generation completes on the CPU with the reference's greedy ids, one line says why`, async () => {
    const p = referencePrompt();
    const path = fixture(FILE);
    if (!p || !path) return;
    const lines: string[] = [];
    const budgetMB = mode.startsWith("per-layer split") ? 0.3 : undefined;
    using model = await Model.load(path, { env: { ...env, VKMOE_GRAPH: mode === "per-layer" ? "off" : "on" }, budgetMB, log: (l) => lines.push(l) });
    expect(model.device.mode).toBe(mode === "resident" ? "resident" : "per-layer");
    const session = model.session({ ctx: 128 });
    const run = generate(model, session, p.input_ids, { maxTokens: 24, sampling: { temperature: 0 }, stopAtEos: false });
    let deltas = 0;
    for (let r = run.next(); ; r = run.next()) {
      if (r.done) {
        expect(r.value.ids).toEqual(p.greedy_new_ids); // no margin of this prompt is below 0.01
        break;
      }
      if (++deltas === 10) model.simulateDeviceLoss(mode.endsWith("MoE layer") ? "experts" : "graph");
    }
    expect(model.device.mode).toBe("cpu");
    expect(session.path).toBe("cpu-decoder");
    const lost = lines.filter((l) => /device lost/.test(l));
    expect(lost.length).toBe(1);
    expect(model.takeValidationMessages()).toEqual([]);
  }, 120_000);
}

test("a GPU budget that holds a few experts: they upload as routed, evicting colder ones, with the same logits", async () => {
  const p = referencePrompt();
  const path = fixture(FILE);
  if (!p || !path) return;
  const lines: string[] = [];
  // 0.1 MB holds 7 of the 48 experts (13.3 kB each).
  using small = await Model.load(path, { env, budgetMB: 0.1, log: (l) => lines.push(l) });
  using full = await Model.load(path, { env: { ...env, VKMOE_GPU: false }, log: () => {} });
  expect(small.device.mode).toBe("per-layer");
  expect(lines.some((l) => /of 48 experts fit the GPU budget/.test(l))).toBe(true);
  // per-layer mode runs the dense ops on the GPU with its f16 KV cache: the CPU oracle rounds its cache the same way
  const a = small.session({ ctx: 64 }).prefill(p.input_ids).slice();
  const b = full.session({ ctx: 64, cpuCache: "f16" }).prefill(p.input_ids);
  expect(nmse(b, a)).toBeLessThan(1e-6);
  expect(small.takeValidationMessages()).toEqual([]);
}, 120_000);
