/**
 * Qwen3.5 MoE's whole token on the GPU (src/graph/hybrid-graph.ts: Gated DeltaNet and gated
 * attention layers, the shared expert, one submit per token or prompt chunk) against the CPU
 * decoder (src/model/hybrid-decoder.ts) on the same weights, on the fixtures (Lavapipe, validation
 * layer on, VKMOE_GRAPH=on to run the graph on a CPU device). The CPU oracle rounds its KV cache to
 * f16 as the GPU's is (`cpuCache: "f16"`), so the two compute the same thing: NMSE <= 1e-6 on the
 * float path (the bound of the Qwen3 graph tests), the same router top-k and greedy ids. The CPU
 * decoder itself is checked against transformers in test/model-qwen35.test.ts.
 */
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { generate } from "../src/engine/generate.ts";
import { GRAPH_MAX_TOKENS } from "../src/graph/index.ts";
import type { DecoderObserver } from "../src/model/decoder.ts";
import { Model, type QuantChoice } from "../src/model/model.ts";
import type { Session } from "../src/model/session.ts";
import type { Qwen35MoeConfig } from "../src/model/qwen35-config.ts";
import { nmse } from "../src/quant/metrics.ts";
import { decodeTokenCommands, differingRows, expectSameBits, processEnv } from "./support/graph-switches.ts";
import { fixture } from "./support/fixtures.ts";

const env = (o: Partial<VkmoeEnv> = {}): VkmoeEnv => ({ ...readConfig(), VKMOE_VALIDATION: true, VKMOE_IDP: "off", VKMOE_GRAPH: "on", ...o });
const BOUND = 1e-6;
const STEPS = 16;

interface PromptReference {
  input_ids: number[];
  greedy_new_ids: number[];
}

function prompts(): number[][] | undefined {
  const json = fixture("qwen3.5-moe-tiny/reference.json");
  if (!json) return undefined;
  return (JSON.parse(readFileSync(json, "utf8")).prompts as PromptReference[]).map((p) => p.input_ids);
}

async function load(name: string, quant: QuantChoice, e: VkmoeEnv, log: (l: string) => void = () => {}): Promise<Model | undefined> {
  const path = fixture(name);
  return path ? Model.load(path, { quant, env: e, log }) : undefined;
}

/** The GPU model (resident) and its CPU oracle, or undefined (fixture absent, reason printed). */
async function pair(name: string, quant: QuantChoice, lines: string[] = []): Promise<{ gpu: Model; cpu: Model } | undefined> {
  const gpu = await load(name, quant, env(), (l) => lines.push(l));
  const cpu = await load(name, quant, env({ VKMOE_GPU: false }));
  if (!gpu || !cpu) return undefined;
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

const sources: { name: string; quant: QuantChoice }[] = [
  { name: "qwen3.5-moe-tiny", quant: "q8" },
  { name: "qwen3.5-moe-tiny.Q8_0.gguf", quant: "auto" },
];

describe("resident Qwen3.5: the whole token on the GPU equals the CPU decoder", () => {
  for (const src of sources) {
    test(`${src.name}${src.name.endsWith(".gguf") ? "" : ` (--quant ${src.quant})`}: every prompt position and ${STEPS} greedy steps, logits NMSE <= ${BOUND}, same router top-k, same greedy ids; one submit a token`, async () => {
      const ps = prompts();
      const lines: string[] = [];
      const p = await pair(src.name, src.quant, lines);
      if (!ps || !p) return;
      using gpu = p.gpu, cpu = p.cpu;
      expect(gpu.device.mode).toBe("resident");
      expect(lines.filter((l) => /resident mode/.test(l))).toHaveLength(1);
      const V = gpu.config.vocab;
      let worst = 0;
      // the chat prompt position by position (37 replays, the CPU decoder's Lavapipe-bound time
      // dominates the test), then greedy steps; the raw prompt through generate() below
      for (const ids of [ps[1]!]) {
        using a = gpu.session({ ctx: 96 });
        using b = cpu.session({ ctx: 96, cpuCache: "f16" });
        expect(a.path).toBe("device");
        const ta = routingTap(), tb = routingTap();
        a.observer = ta.observer;
        b.observer = tb.observer;
        // every prompt position (one replay each), then greedy steps on the GPU's logits
        const la = a.prefillAll(ids), lb = b.prefillAll(ids);
        for (let t = 0; t < ids.length; t++) {
          const e = nmse(lb.subarray(t * V, (t + 1) * V), la.subarray(t * V, (t + 1) * V));
          worst = Math.max(worst, e);
          expect({ t, ok: e <= BOUND }).toEqual({ t, ok: true });
        }
        let x = la.slice((ids.length - 1) * V), y = lb.slice((ids.length - 1) * V);
        const idsA: number[] = [], idsB: number[] = [];
        for (let step = 0; step < STEPS; step++) {
          idsA.push(argmax(x));
          idsB.push(argmax(y));
          x = a.step(idsA[step]!).slice();
          y = b.step(idsA[step]!).slice();
          const e = nmse(y, x);
          worst = Math.max(worst, e);
          expect({ step, ok: e <= BOUND }).toEqual({ step, ok: true });
        }
        expect(idsA).toEqual(idsB);
        expect(ta.routes).toEqual(tb.routes);
        expect(a.counts.submits).toBe(ids.length + STEPS);
      }
      // greedy through generate(): the device's argmax (no logits read back) against the CPU's logits
      {
        using a = gpu.session({ ctx: 96 });
        using b = cpu.session({ ctx: 96, cpuCache: "f16" });
        expect(greedy(gpu, a, ps[0]!, STEPS)).toEqual(greedy(cpu, b, ps[0]!, STEPS));
      }
      using probe = gpu.session({ ctx: 8 });
      console.log(`qwen3.5 resident ${src.name}: worst NMSE ${worst.toExponential(1)} over ${ps[1]!.length + STEPS} positions; ${probe.dispatchesPerToken} dispatches per token`);
      expect(gpu.takeValidationMessages()).toEqual([]);
    }, 240_000);
  }
});

/** For the fold switches: a session's and a batch's logits (decode steps, a 5-token chunk, a prompt chunk that runs chunked), and a decode token's dispatches and barriers. */
function foldRun(m: Model, ps: number[][]) {
  const { dispatches, barriers } = decodeTokenCommands(m);
  const logits: Float32Array[] = [];
  using a = m.session({ ctx: 96 });
  expect(a.path).toBe("device");
  logits.push(a.prefill(ps[1]!.slice(0, 5)).slice(), a.prefill(ps[1]!.slice(5)).slice());
  for (const id of ps[0]!.slice(0, 6)) logits.push(a.step(id).slice());
  // runs: three sequences packed into one replay, then decode rounds of one token each
  using batch = m.batch({ slots: 3, ctx: 64 });
  expect(batch.path).toBe("device-batch");
  logits.push(...batch.prefillMany([{ slot: 0, ids: ps[0]!.slice(0, 4) }, { slot: 1, ids: ps[1]!.slice(0, 3) }, { slot: 2, ids: ps[0]!.slice(2, 9) }]).map((x) => x.slice()));
  for (let r = 0; r < 3; r++) logits.push(...batch.step([{ slot: 2, id: ps[1]![r]! }, { slot: 0, id: ps[0]![r]! }, { slot: 1, id: 7 + r }]).map((x) => x.slice()));
  return { logits, dispatches, barriers };
}

describe("the delta rule folding the conv1d (VKMOE_CONV_FOLD)", () => {
  // float atomics off: the fused MoE call adds in any order, which would hide a difference or make one
  test("off: the separate dec_conv1d step (the conv state moved on in it), one barrier more a linear layer and as many dispatches, the same logits bit for bit (a session, a batch)", async () => {
    const ps = prompts();
    const name = "qwen3.5-moe-tiny.Q8_0.gguf";
    // synchronization validation on the folded run: the conv state advance shares out_proj's step, no barrier of its own
    const path = fixture(name);
    using folded = path ? await Model.load(path, { quant: "auto", env: env({ VKMOE_FLOAT_ATOMICS: "off" }), syncValidation: true, log: () => {} }) : undefined;
    if (!ps || !folded) return;
    const linearLayers = (folded.config as Qwen35MoeConfig).layerTypes.filter((t) => t === "linear").length;
    expect(linearLayers).toBeGreaterThan(0);
    const a = foldRun(folded, ps);
    using restore = processEnv("VKMOE_CONV_FOLD", "off"); // the graph reads it from the process env when it is made
    using separate = await load(name, "auto", env({ VKMOE_CONV_FOLD: "off", VKMOE_FLOAT_ATOMICS: "off" }));
    const b = foldRun(separate!, ps);
    console.log(`conv fold: ${a.barriers} barriers and ${a.dispatches} dispatches a decode token folded, ${b.barriers} and ${b.dispatches} separate (${linearLayers} linear layers); ${a.logits.length} logits rows compared`);
    expect(b.barriers - a.barriers).toBe(linearLayers);
    expect(b.dispatches).toBe(a.dispatches);
    expect(b.logits.length).toBe(a.logits.length);
    expect(differingRows(a.logits, b.logits)).toEqual([]);
    expect(folded.takeValidationMessages()).toEqual([]);
    expect(separate!.takeValidationMessages()).toEqual([]);
  }, 240_000);
});

describe("the next norm's pipeline warmed on stand-ins beside the experts (VKMOE_NORM_WARM)", () => {
  // float atomics off: the MoE call runs in steps (with them, decode's one fused step takes no warm dispatch)
  test("on (the default): one dispatch more a layer than off, no barrier more, the same logits bit for bit (a session, a batch); no synchronization hazard", async () => {
    const ps = prompts();
    const name = "qwen3.5-moe-tiny.Q8_0.gguf";
    const path = fixture(name);
    // synchronization validation: the warm dispatch runs beside the experts with no barrier between
    using warm = path ? await Model.load(path, { quant: "auto", env: env({ VKMOE_FLOAT_ATOMICS: "off" }), syncValidation: true, log: () => {} }) : undefined;
    if (!ps || !warm) return;
    const a = foldRun(warm, ps);
    using restore = processEnv("VKMOE_NORM_WARM", "off"); // the graph reads it from the process env when it is made
    using cold = await load(name, "auto", env({ VKMOE_NORM_WARM: "off", VKMOE_FLOAT_ATOMICS: "off" }));
    const b = foldRun(cold!, ps);
    const layers = warm.config.layers;
    console.log(`norm warm: ${a.dispatches} dispatches and ${a.barriers} barriers a decode token, ${b.dispatches} and ${b.barriers} without (${layers} layers); ${a.logits.length} logits rows compared`);
    expectSameBits(a, b, { dispatches: layers, barriers: 0 });
    expect(warm.takeValidationMessages()).toEqual([]);
    expect(cold!.takeValidationMessages()).toEqual([]);
  }, 240_000);
});

describe("the route in the router GEMV beside the shared expert's own GEMVs (VKMOE_ROUTE_FOLD=route)", () => {
  // float atomics off: the fused MoE call adds in any order, which would hide a difference or make one
  test("route: the route in the router GEMV, the shared gate/up fused with the SwiGLU, one barrier and three dispatches a layer fewer than off (router, gate, up, route, SwiGLU against router + route, gate/up), the same logits bit for bit; auto without the shared slot (this file's shared expert is wider than its experts): off's commands and bits (a session, a batch)", async () => {
    const ps = prompts();
    const name = "qwen3.5-moe-tiny.Q8_0.gguf"; // a GGUF router is F32, its shared gate and up Q8_0: the fold applies
    const path = fixture(name);
    const runWith = async (fold: "auto" | "route" | "off") => {
      using restore = processEnv("VKMOE_ROUTE_FOLD", fold); // the graph reads it from the process env when it is made
      // synchronization validation on the folded run: the route reads the other workgroups' logits with no barrier of its own
      using m = path ? await Model.load(path, { quant: "auto", env: env({ VKMOE_ROUTE_FOLD: fold, VKMOE_FLOAT_ATOMICS: "off" }), syncValidation: fold === "route", log: () => {} }) : undefined;
      if (!ps || !m) return undefined;
      const r = foldRun(m, ps);
      expect(m.takeValidationMessages()).toEqual([]);
      return { ...r, layers: m.config.layers };
    };
    const a = await runWith("route");
    if (!a) return;
    const b = (await runWith("off"))!, c = (await runWith("auto"))!;
    const layers = a.layers;
    console.log(`route fold: ${a.barriers} barriers and ${a.dispatches} dispatches a decode token folded, ${b.barriers} and ${b.dispatches} separate, ${c.barriers} and ${c.dispatches} auto (${layers} layers); ${a.logits.length} logits rows compared`);
    expect(b.barriers - a.barriers).toBe(layers);
    expect(b.dispatches - a.dispatches).toBe(3 * layers);
    expect([c.barriers, c.dispatches]).toEqual([b.barriers, b.dispatches]);
    expect(b.logits.length).toBe(a.logits.length);
    expect(differingRows(a.logits, b.logits)).toEqual([]);
    expect(differingRows(c.logits, b.logits)).toEqual([]);
  }, 360_000);
});

describe("the sequence state on the device", () => {
  test(`a prompt prefilled in chunks (1 + 5 + rest) equals one prefill and the CPU decoder's; a prompt past ${GRAPH_MAX_TOKENS} tokens runs as two replays`, async () => {
    const ps = prompts();
    const p = await pair("qwen3.5-moe-tiny.Q8_0.gguf", "auto");
    if (!ps || !p) return;
    using gpu = p.gpu, cpu = p.cpu;
    const ids = [...ps[1]!, ...ps[0]!, ...ps[1]!].slice(0, 70);
    expect(ids.length).toBe(70);
    using whole = gpu.session({ ctx: 96 });
    using chunked = gpu.session({ ctx: 96 });
    using oracle = cpu.session({ ctx: 96, cpuCache: "f16" });
    const x = whole.prefill(ids).slice();
    expect(whole.counts.submits).toBe(2);
    chunked.prefill(ids.slice(0, 1));
    chunked.prefill(ids.slice(1, 6));
    const y = chunked.prefill(ids.slice(6)).slice();
    expect(chunked.counts.submits).toBe(3);
    const z = oracle.prefill(ids).slice();
    console.log(`chunks: whole vs 1+5+64 ${nmse(x, y).toExponential(1)}, vs the CPU decoder ${nmse(z, x).toExponential(1)}`);
    expect(nmse(x, y)).toBeLessThanOrEqual(BOUND);
    expect(nmse(z, x)).toBeLessThanOrEqual(BOUND);
    // and the step after, from both states
    expect(nmse(oracle.step(ids[0]!), whole.step(ids[0]!).slice())).toBeLessThanOrEqual(BOUND);
    const afterWhole = whole.step(ids[1]!).slice();
    chunked.step(ids[0]!);
    expect(nmse(afterWhole, chunked.step(ids[1]!))).toBeLessThanOrEqual(BOUND);
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, 180_000);

  test("two prompts in a row (truncate(0)) equal fresh runs; truncate(keep) re-runs the kept tokens (the recurrent state cannot rewind) and equals a fresh prefill of them", async () => {
    const ps = prompts();
    const p = await pair("qwen3.5-moe-tiny", "q8");
    if (!ps || !p) return;
    using gpu = p.gpu, cpu = p.cpu;
    const [p0, p1] = [ps[0]!, ps[1]!];
    using reused = gpu.session({ ctx: 96 });
    const first = reused.prefill(p0).slice();
    reused.truncate(0);
    expect(reused.length).toBe(0);
    const second = reused.prefill(p1).slice();
    using fresh0 = gpu.session({ ctx: 96 });
    using fresh1 = gpu.session({ ctx: 96 });
    const e0 = nmse(fresh0.prefill(p0), first), e1 = nmse(fresh1.prefill(p1).slice(), second);
    // keep a prefix: its tokens run again from zeroed states, then the session continues
    const keep = 11;
    reused.truncate(keep);
    expect(reused.tokens).toEqual(p1.slice(0, keep));
    expect(reused.path).toBe("device");
    const cont = reused.prefill(p0).slice();
    using oracle = cpu.session({ ctx: 96, cpuCache: "f16" });
    const ek = nmse(oracle.prefill([...p1.slice(0, keep), ...p0]), cont);
    console.log(`truncate: second prompt vs fresh ${e1.toExponential(1)} (first ${e0.toExponential(1)}); kept ${keep} + a prompt vs the CPU decoder ${ek.toExponential(1)}`);
    expect(e0).toBeLessThanOrEqual(BOUND);
    expect(e1).toBeLessThanOrEqual(BOUND);
    expect(ek).toBeLessThanOrEqual(BOUND);
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, 180_000);
});

test("a device lost mid-generation: the session continues on the CPU path with one line, the same greedy ids", async () => {
  const ps = prompts();
  const lines: string[] = [];
  const p = await pair("qwen3.5-moe-tiny.Q8_0.gguf", "auto", lines);
  if (!ps || !p) return;
  using gpu = p.gpu, cpu = p.cpu;
  expect(gpu.device.mode).toBe("resident");
  const ids = ps[0]!;
  using b = cpu.session({ ctx: 96, cpuCache: "f16" });
  const expected = greedy(cpu, b, ids, STEPS);
  const session = gpu.session({ ctx: 96 });
  expect(session.path).toBe("device");
  const run = generate(gpu, session, ids, { maxTokens: STEPS, sampling: { temperature: 0 }, stopAtEos: false });
  let deltas = 0, got: number[] = [];
  for (let r = run.next(); ; r = run.next()) {
    if (r.done) {
      got = r.value.ids;
      break;
    }
    if (++deltas === 6) gpu.simulateDeviceLoss("graph");
  }
  expect(got).toEqual(expected);
  expect(session.path).toBe("cpu-decoder");
  expect(gpu.device.mode).toBe("cpu");
  expect(lines.filter((l) => /device lost/.test(l))).toHaveLength(1);
  expect(gpu.takeValidationMessages()).toEqual([]);
}, 120_000);

test("Model.batch on the resident Qwen3.5 model runs on the device (a HybridBatch, no fallback line); a lost device moves it to the CPU path with one line, the same logits", async () => {
  const ps = prompts();
  const lines: string[] = [];
  const p = await pair("qwen3.5-moe-tiny.Q8_0.gguf", "auto", lines);
  if (!ps || !p) return;
  using gpu = p.gpu, cpu = p.cpu;
  using batch = gpu.batch({ slots: 2, ctx: 64 });
  expect(batch.path).toBe("device-batch");
  expect(lines.filter((l) => /session per slot/.test(l))).toEqual([]);
  using a = cpu.session({ ctx: 64, cpuCache: "f16" });
  using b = cpu.session({ ctx: 64, cpuCache: "f16" });
  const [x0, x1] = batch.prefillMany([{ slot: 0, ids: ps[0]! }, { slot: 1, ids: ps[1]!.slice(0, 9) }]);
  expect(nmse(a.prefill(ps[0]!), x0!)).toBeLessThanOrEqual(BOUND);
  expect(nmse(b.prefill(ps[1]!.slice(0, 9)), x1!)).toBeLessThanOrEqual(BOUND);
  gpu.simulateDeviceLoss("graph");
  // the lost replay's step runs again on the slots' CPU sessions (their tokens prefilled there first)
  const [y0, y1] = batch.step([{ slot: 0, id: 5 }, { slot: 1, id: 6 }]).map((r) => r.slice());
  expect(batch.path).toBe("sessions");
  expect(lines.filter((l) => /device lost; the batch continues on the CPU path/.test(l))).toHaveLength(1);
  expect(nmse(a.step(5), y0!)).toBeLessThanOrEqual(BOUND);
  expect(nmse(b.step(6), y1!)).toBeLessThanOrEqual(BOUND);
  expect(gpu.takeValidationMessages()).toEqual([]);
}, 120_000);
