/**
 * Qwen3.5 MoE's split mode (src/graph/hybrid-graph.ts without a stage): where the experts do not
 * all fit the GPU, each layer's dense part (Gated DeltaNet or gated attention, the router, the
 * shared expert) runs on the GPU, one submit a layer, the routed experts through the host's
 * per-layer MoE call (uploading missing experts as they are routed to), and the head on the GPU.
 * A GPU budget of 0.1 MB (8 of the tiny fixture's 64 experts) forces it. Against the CPU decoder
 * with its KV cache rounded to f16 as the graph's (test/model-qwen35-graph.test.ts's oracle and
 * bound), Lavapipe, validation layer on (synchronization validation in the first test),
 * VKMOE_GRAPH=on to run the graph on a CPU device.
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { generate } from "../src/engine/generate.ts";
import { GRAPH_MAX_TOKENS } from "../src/graph/index.ts";
import type { DecoderObserver } from "../src/model/decoder.ts";
import { Model } from "../src/model/model.ts";
import type { Session } from "../src/model/session.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";

const FILE = "qwen3.5-moe-tiny.Q8_0.gguf";
const env = (o: Partial<VkmoeEnv> = {}): VkmoeEnv => ({ ...readConfig(), VKMOE_VALIDATION: true, VKMOE_IDP: "off", VKMOE_GRAPH: "on", ...o });
/** The resident graph's bound (test/model-qwen35-graph.test.ts). */
const BOUND = 1e-6;
const STEPS = 10;
/** Holds 8 of the 64 routed experts (13 kB each). */
const BUDGET_MB = 0.1;

function prompts(): number[][] | undefined {
  const json = fixture("qwen3.5-moe-tiny/reference.json");
  if (!json) return undefined;
  return (JSON.parse(readFileSync(json, "utf8")).prompts as { input_ids: number[] }[]).map((p) => p.input_ids);
}

/** The split model (small budget) and its CPU oracle, or undefined (fixture absent, reason printed). */
async function pair(lines: string[], syncValidation = false): Promise<{ gpu: Model; cpu: Model } | undefined> {
  const path = fixture(FILE);
  if (!path) return undefined;
  const gpu = await Model.load(path, { env: env(), budgetMB: BUDGET_MB, syncValidation, log: (l) => lines.push(l) });
  const cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
  return { gpu, cpu };
}

function routingTap(): { observer: DecoderObserver; routes: number[][][] } {
  const routes: number[][][] = [];
  const observer: DecoderObserver = {
    routing: (l, chosen, S, k) => {
      for (let t = 0; t < S; t++) (routes[l] ??= []).push([...chosen.subarray(t * k, (t + 1) * k)].sort((x, y) => x - y));
    },
  };
  return { observer, routes };
}

const argmax = (x: Float32Array) => {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
};

function greedy(m: Model, s: Session, ids: number[], n: number): number[] {
  const g = generate(m, s, ids, { maxTokens: n, sampling: { temperature: 0 }, stopAtEos: false });
  for (let r = g.next(); ; r = g.next()) if (r.done) return r.value.ids;
}

test(`split mode: a prompt in chunks (1 + 5 + rest) and ${STEPS} greedy steps equal the CPU decoder's (logits NMSE <= ${BOUND}, same router top-k, same greedy ids); a layer a submit; one line says why; synchronization validation clean`, async () => {
  const ps = prompts();
  const lines: string[] = [];
  // synchronization validation too: the host's copies in and out between the layers' submits
  const p = await pair(lines, true);
  if (!ps || !p) return;
  using gpu = p.gpu, cpu = p.cpu;
  const L = gpu.config.layers;
  expect(gpu.device.mode).toBe("per-layer");
  expect(gpu.device.experts).toBe("gpu");
  expect(gpu.device.why).toMatch(/dense ops on the GPU a layer a submit .*shared expert.*per-layer MoE call \(expert \d+ of layer \d+ is not resident\)/);
  expect(lines.filter((l) => /per-layer mode/.test(l))).toEqual([expect.stringMatching(/^vkmoe: per-layer mode: .*dense ops on the GPU a layer a submit/)]);
  const ids = ps[1]!;
  using a = gpu.session({ ctx: 96 });
  using b = cpu.session({ ctx: 96, cpuCache: "f16" });
  expect(a.path).toBe("device");
  expect(a.dispatchesPerToken).toBeGreaterThan(0);
  const ta = routingTap(), tb = routingTap();
  a.observer = ta.observer;
  b.observer = tb.observer;
  let worst = 0;
  const check = (what: object, x: Float32Array, y: Float32Array) => {
    const e = nmse(y, x);
    worst = Math.max(worst, e);
    expect({ ...what, ok: e <= BOUND }).toEqual({ ...what, ok: true });
  };
  // the prompt in three chunks, each chunk's last logits compared
  for (const [from, to] of [[0, 1], [1, 6], [6, ids.length]] as const) check({ chunk: from }, a.prefill(ids.slice(from, to)).slice(), b.prefill(ids.slice(from, to)).slice());
  // each split run: a submit per layer and the head, and one per MoE layer call
  expect(a.counts.submits).toBe(3 * (L + 1 + L));
  let x = a.step(ids[0]!).slice(), y = b.step(ids[0]!).slice();
  check({ step: -1 }, x, y);
  const idsA: number[] = [], idsB: number[] = [];
  for (let step = 0; step < STEPS; step++) {
    idsA.push(argmax(x));
    idsB.push(argmax(y));
    x = a.step(idsA[step]!).slice();
    y = b.step(idsA[step]!).slice();
    check({ step }, x, y);
  }
  expect(idsA).toEqual(idsB);
  expect(ta.routes).toEqual(tb.routes);
  expect(ta.routes.length).toBe(L);
  expect(ta.routes[0]!.length).toBe(ids.length + 1 + STEPS);
  expect(a.counts.tokens).toBe(ids.length + 1 + STEPS);
  // the misses uploaded, evicting colder experts
  expect(gpu.expertCacheStats()!.uploads).toBeGreaterThan(64);
  // greedy through generate(): the device's argmax (no logits read back)
  {
    using c = gpu.session({ ctx: 96 });
    using d = cpu.session({ ctx: 96, cpuCache: "f16" });
    expect(greedy(gpu, c, ps[0]!, STEPS)).toEqual(greedy(cpu, d, ps[0]!, STEPS));
  }
  console.log(`qwen3.5 split: worst NMSE ${worst.toExponential(1)} over 3 chunks and ${STEPS + 1} steps; ${a.dispatchesPerToken} dispatches and ${L + 1} graph submits a token`);
  expect(gpu.takeValidationMessages()).toEqual([]);
}, 120_000);

test(`split mode: a prompt past ${GRAPH_MAX_TOKENS} tokens runs as two chunks and equals the CPU decoder's; truncate(keep) re-runs the kept tokens; Model.batch runs a session per slot`, async () => {
  const ps = prompts();
  const lines: string[] = [];
  const p = await pair(lines);
  if (!ps || !p) return;
  using gpu = p.gpu, cpu = p.cpu;
  const L = gpu.config.layers;
  const ids = [...ps[1]!, ...ps[0]!, ...ps[1]!].slice(0, 70);
  using a = gpu.session({ ctx: 96 });
  using b = cpu.session({ ctx: 96, cpuCache: "f16" });
  expect(nmse(b.prefill(ids), a.prefill(ids).slice())).toBeLessThanOrEqual(BOUND);
  expect(a.counts.submits).toBe(2 * (L + 1 + L));
  expect(nmse(b.step(ids[0]!), a.step(ids[0]!).slice())).toBeLessThanOrEqual(BOUND);
  // the recurrent states cannot rewind: the kept tokens run again from zeroed states, still split
  const keep = 11;
  a.truncate(keep);
  expect(a.path).toBe("device");
  using oracle = cpu.session({ ctx: 96, cpuCache: "f16" });
  expect(nmse(oracle.prefill([...ids.slice(0, keep), ...ps[0]!]), a.prefill(ps[0]!).slice())).toBeLessThanOrEqual(BOUND);
  // a device batch needs every expert resident: the batch is a session per slot, each split
  using batch = gpu.batch({ slots: 2, ctx: 64 });
  expect(batch.path).toBe("sessions");
  using s0 = cpu.session({ ctx: 64, cpuCache: "f16" });
  using s1 = cpu.session({ ctx: 64, cpuCache: "f16" });
  const [x0, x1] = batch.prefillMany([{ slot: 0, ids: ps[0]! }, { slot: 1, ids: ps[1]!.slice(0, 9) }]);
  expect(nmse(s0.prefill(ps[0]!), x0!)).toBeLessThanOrEqual(BOUND);
  expect(nmse(s1.prefill(ps[1]!.slice(0, 9)), x1!)).toBeLessThanOrEqual(BOUND);
  expect(gpu.takeValidationMessages()).toEqual([]);
}, 120_000);

for (const first of ["graph", "experts"] as const) {
  test(`split mode: a device lost mid-generation (met in the ${first === "graph" ? "graph's wait" : "MoE layer's"}) continues on the CPU path with one line, the same greedy ids`, async () => {
    const ps = prompts();
    const lines: string[] = [];
    const p = await pair(lines);
    if (!ps || !p) return;
    using gpu = p.gpu, cpu = p.cpu;
    expect(gpu.device.mode).toBe("per-layer");
    const ids = ps[0]!;
    using b = cpu.session({ ctx: 96, cpuCache: "f16" });
    const expected = greedy(cpu, b, ids, STEPS);
    using session = gpu.session({ ctx: 96 });
    expect(session.path).toBe("device");
    const run = generate(gpu, session, ids, { maxTokens: STEPS, sampling: { temperature: 0 }, stopAtEos: false });
    let deltas = 0, got: number[] = [];
    for (let r = run.next(); ; r = run.next()) {
      if (r.done) {
        got = r.value.ids;
        break;
      }
      if (++deltas === 5) gpu.simulateDeviceLoss(first);
    }
    expect(got).toEqual(expected);
    expect(session.path).toBe("cpu-decoder");
    expect(gpu.device.mode).toBe("cpu");
    expect(lines.filter((l) => /device lost/.test(l))).toHaveLength(1);
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, 120_000);
}
