/**
 * The whole token on the GPU ("resident" mode, src/graph/) against the CPU decoder on the same
 * weights, on the fixtures (Lavapipe, validation layer on): logits of every position, the router's
 * top-k at every layer, greedy ids; replay over 500 positions; per-layer mode when the budget
 * cannot hold the experts. The CPU decoder's oracle rounds its KV cache to f16 as the GPU's cache
 * is (`cpuCache: "f16"`), so the two compute the same thing: NMSE <= 1e-6 on the float path.
 */
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { generate } from "../src/engine/generate.ts";
import { Model, type QuantChoice } from "../src/model/model.ts";
import type { DecoderObserver } from "../src/model/decoder.ts";
import type { Session } from "../src/model/session.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";
import { GRAPH_MAX_TOKENS } from "../src/graph/index.ts";
import { decodeTokenCommands, differingRows, expectSameBits, processEnv, type SwitchRun } from "./support/graph-switches.ts";

const baseEnv = (o: Partial<VkmoeEnv> = {}): VkmoeEnv => ({ ...readConfig(), VKMOE_VALIDATION: true, VKMOE_IDP: "off", VKMOE_GRAPH: "on", ...o });

function prompts(): number[][] | undefined {
  const json = fixture("qwen3-moe-tiny/reference.json");
  if (!json) return undefined;
  return (JSON.parse(readFileSync(json, "utf8")).prompts as { input_ids: number[] }[]).map((p) => p.input_ids);
}

async function load(name: string, env: VkmoeEnv, quant: QuantChoice = "auto", extra: { budgetMB?: number; syncValidation?: boolean } = {}): Promise<Model | undefined> {
  const path = fixture(name);
  if (!path) return undefined;
  return Model.load(path, { quant, env, log: () => {}, ...extra });
}

/**
 * An observer collecting the router's choices, [layer][position] as sorted sets: two near-equal
 * probabilities may come out in either order (the MoE sum does not depend on it).
 */
function routingTap(): { observer: DecoderObserver; routes: number[][][] } {
  const routes: number[][][] = [];
  const observer: DecoderObserver = {
    routing: (l, chosen, S, k) => {
      for (let t = 0; t < S; t++) (routes[l] ??= []).push([...chosen.subarray(t * k, (t + 1) * k)].sort((x, y) => x - y));
    },
  };
  return { observer, routes };
}

/** All logits of `ids` and the router's choices per (layer, position). */
function runAll(s: Session, ids: number[]): { logits: Float32Array; routes: number[][][] } {
  const tap = routingTap();
  s.observer = tap.observer;
  return { logits: s.prefillAll(ids), routes: tap.routes };
}

const sources: { name: string; quant?: QuantChoice }[] = [
  { name: "qwen3-moe-tiny.Q8_0.gguf" },
  { name: "qwen3-moe-tiny.Q4_0.gguf" },
  { name: "qwen3-moe-tiny", quant: "q8" },
  { name: "qwen3-moe-tiny", quant: "auto" },
];

describe("resident: the whole token on the GPU equals the CPU decoder", () => {
  for (const src of sources) {
    for (const path of ["float", "integer-dot"] as const) {
      // Float: every position (measured worst 1.2e-8 to 2.2e-7 across runs: an f16 rounding of k or
      // v flips where the GPU's f32 and the CPU's f64 sums differ in the last bits, and the fused
      // MoE call's float atomics add in any order). Integer-dot (the experts' input in int8): the
      // last position of each prompt, as against transformers.
      const bound = path === "float" ? 1e-6 : 5e-3;
      const what = path === "float" ? "every position's logits" : "last-position logits";
      test(`${src.name}${src.quant ? ` (--quant ${src.quant})` : ""}, ${path} path: ${what} NMSE <= ${bound}${path === "float" ? ", same router top-k, same greedy ids" : ""}`, async () => {
        const ps = prompts();
        using gpu = await load(src.name, baseEnv({ VKMOE_IDP: path === "float" ? "off" : "on" }), src.quant);
        using cpu = await load(src.name, baseEnv({ VKMOE_GPU: false }), src.quant);
        if (!ps || !gpu || !cpu) return;
        expect(gpu.device.mode).toBe("resident");
        const V = gpu.config.vocab;
        let worst = 0;
        for (const ids of ps) {
          using a = gpu.session({ ctx: 128 });
          using b = cpu.session({ ctx: 128, cpuCache: "f16" });
          expect(a.path).toBe("device");
          const ga = runAll(a, ids), cb = runAll(b, ids);
          for (let t = path === "float" ? 0 : ids.length - 1; t < ids.length; t++) {
            const e = nmse(cb.logits.subarray(t * V, (t + 1) * V), ga.logits.subarray(t * V, (t + 1) * V));
            worst = Math.max(worst, e);
            expect(e).toBeLessThanOrEqual(bound);
          }
          if (path === "float") expect(ga.routes).toEqual(cb.routes);
          expect(a.counts.submits).toBe(ids.length);
        }
        if (path === "float") {
          // greedy through generate(): the device's argmax (no logits read back) against the CPU's
          const ids = ps[0]!;
          using a = gpu.session({ ctx: 128 });
          using b = cpu.session({ ctx: 128, cpuCache: "f16" });
          const run = (m: Model, s: Session) => {
            const g = generate(m, s, ids, { maxTokens: 24, sampling: { temperature: 0 }, stopAtEos: false });
            for (let r = g.next(); ; r = g.next()) if (r.done) return r.value.ids;
          };
          expect(run(gpu, a)).toEqual(run(cpu, b));
        }
        console.log(`resident ${src.name}${src.quant ? ` --quant ${src.quant}` : ""} ${path}: worst position NMSE ${worst.toExponential(1)}; ${gpu.session({ ctx: 8 }).dispatchesPerToken} dispatches per token`);
        expect(gpu.takeValidationMessages()).toEqual([]);
      }, 240_000);
    }
  }
});

describe("prompt chunks of q4/q8 matrices on the integer-dot GEMM (VKMOE_QUANT_GEMM_IDP)", () => {
  test("on: the integer-dot GEMM; the chunk's logits differ from the float GEMM's (off), both within 5e-3 of the CPU decoder", async () => {
    const ps = prompts();
    using idpOn = processEnv("VKMOE_IDP", "on"); // the graphs' linear kernels take the integer-dot decision from the process env
    using gemmOn = processEnv("VKMOE_QUANT_GEMM_IDP", "on"); // and this switch
    using idp = await load("qwen3-moe-tiny.Q4_0.gguf", baseEnv({ VKMOE_IDP: "on", VKMOE_QUANT_GEMM_IDP: "on" }));
    using cpu = await load("qwen3-moe-tiny.Q4_0.gguf", baseEnv({ VKMOE_GPU: false }));
    if (!ps || !idp || !cpu) return;
    const ids = ps.find((p) => p.length >= 8)!;
    using a = idp.session({ ctx: 128 });
    using c = cpu.session({ ctx: 128, cpuCache: "f16" });
    const viaIdp = a.prefill(ids).slice(), ref = c.prefill(ids).slice();
    using restore = processEnv("VKMOE_QUANT_GEMM_IDP", "off");
    using float = await load("qwen3-moe-tiny.Q4_0.gguf", baseEnv({ VKMOE_IDP: "on", VKMOE_QUANT_GEMM_IDP: "off" }));
    using b = float!.session({ ctx: 128 });
    const viaFloat = b.prefill(ids).slice();
    expect(ids.length).toBeGreaterThanOrEqual(8);
    expect(differingRows([viaIdp], [viaFloat])).toEqual([0]); // another kernel, another rounding of x
    expect(nmse(ref, viaIdp)).toBeLessThanOrEqual(5e-3);
    expect(nmse(ref, viaFloat)).toBeLessThanOrEqual(5e-3);
    console.log(`quant GEMM idp: a ${ids.length}-token chunk's last logits NMSE ${nmse(ref, viaIdp).toExponential(1)} (integer-dot GEMM), ${nmse(ref, viaFloat).toExponential(1)} (float GEMM) against the CPU`);
    expect(idp.takeValidationMessages()).toEqual([]);
    expect(float!.takeValidationMessages()).toEqual([]);
  }, 240_000);
});

describe("decode attention folding the RoPE step (VKMOE_ROPE_FOLD)", () => {
  // float atomics off: the fused MoE call adds in any order, which would hide a difference or make one
  test("off: the separate dec_rope_kv step, one dispatch more a layer, the same logits bit for bit", async () => {
    const ps = prompts();
    using folded = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv({ VKMOE_FLOAT_ATOMICS: "off" }));
    if (!ps || !folded) return;
    const ids = ps[0]!;
    using a = folded.session({ ctx: 128 });
    expect(a.path).toBe("device");
    const foldedLogits = runAll(a, ids).logits, foldedDispatches = a.dispatchesPerToken;
    using restore = processEnv("VKMOE_ROPE_FOLD", "off"); // the graphs read it from the process env when they are made
    using separate = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv({ VKMOE_ROPE_FOLD: "off", VKMOE_FLOAT_ATOMICS: "off" }));
    using b = separate!.session({ ctx: 128 });
    const separateLogits = runAll(b, ids).logits;
    expect(b.dispatchesPerToken - foldedDispatches).toBe(folded.config.layers);
    expect(foldedLogits).toEqual(separateLogits);
    expect(folded.takeValidationMessages()).toEqual([]);
    expect(separate!.takeValidationMessages()).toEqual([]);
  }, 240_000);
});

/** A decode token's dispatches and barriers; the logits of a 6-token prompt chunk (S > 4: two steps either way), decode steps, a batch's decode rounds. */
function run(m: Model, ps: number[][]) {
  const { dispatches, barriers } = decodeTokenCommands(m);
  const logits: Float32Array[] = [];
  using a = m.session({ ctx: 96 });
  expect(a.path).toBe("device");
  logits.push(a.prefill(ps[1]!.slice(0, 6)).slice(), a.prefill(ps[1]!.slice(6, 9)).slice());
  for (const id of ps[0]!.slice(0, 6)) logits.push(a.step(id).slice());
  using batch = m.batch({ slots: 3, ctx: 64 });
  logits.push(...batch.prefillMany([{ slot: 0, ids: ps[0]!.slice(0, 4) }, { slot: 1, ids: ps[1]!.slice(0, 3) }, { slot: 2, ids: ps[0]!.slice(2, 9) }]).map((x) => x.slice()));
  for (let r = 0; r < 3; r++) logits.push(...batch.step([{ slot: 2, id: ps[1]![r]! }, { slot: 0, id: ps[0]![r]! }, { slot: 1, id: 7 + r }]).map((x) => x.slice()));
  return { logits, dispatches, barriers };
}

/**
 * A warm switch (VKMOE_NORM_WARM, VKMOE_ROUTER_WARM) on (the default) and off on one fixture: a decode
 * token's commands and the logits rows of `run` each way. The warm model runs under synchronization
 * validation (its dispatch runs beside another step with no barrier between); both must log nothing.
 */
async function warmSwitchRuns(name: string, variable: "VKMOE_NORM_WARM" | "VKMOE_ROUTER_WARM", extra: Partial<VkmoeEnv>) {
  const ps = prompts();
  const path = fixture(name);
  const env = (warm: "on" | "off") => baseEnv({ ...extra, [variable]: warm });
  using warm = path ? await Model.load(path, { quant: "auto", env: env("on"), syncValidation: true, log: () => {} }) : undefined;
  if (!ps || !warm) return undefined;
  const on = run(warm, ps), again = run(warm, ps);
  using restore = processEnv(variable, "off"); // the graph reads it from the process env when it is made
  using cold = await load(name, env("off"));
  const off = run(cold!, ps);
  expect(warm.takeValidationMessages()).toEqual([]);
  expect(cold!.takeValidationMessages()).toEqual([]);
  return { on, again, off, layers: warm.config.layers, why: warm.device.why };
}

describe("warmed pipelines: one dispatch more a layer, no barrier more, the same logits (VKMOE_NORM_WARM, VKMOE_ROUTER_WARM)", () => {
  // float atomics off: the experts in steps, so the logits compare bit for bit. Q8_0 without the
  // integer-dot path: the plain norm; Q4_0 with it: the quantizing norm
  const cases = [
    { variable: "VKMOE_NORM_WARM", what: "the next norm beside the experts' first step" },
    { variable: "VKMOE_ROUTER_WARM", what: "the post norm + router + route step beside the attention" },
  ] as const;
  for (const w of cases) {
    for (const c of [{ name: "qwen3-moe-tiny.Q8_0.gguf", idp: "off" }, { name: "qwen3-moe-tiny.Q4_0.gguf", idp: "on" }] as const) {
      test(`${w.variable} (${w.what}), ${c.name}, integer dot ${c.idp}: on (the default) records one dispatch more a layer than off, with no barrier more, and the same logits bit for bit (prompt chunks, decode steps, a batch); no synchronization hazard`, async () => {
        using idp = processEnv("VKMOE_IDP", c.idp); // the graphs' linear kernels take the integer-dot decision from the process env
        const r = await warmSwitchRuns(c.name, w.variable, { VKMOE_IDP: c.idp, VKMOE_FLOAT_ATOMICS: "off" });
        if (!r) return;
        console.log(`${w.variable} (${c.name}): ${r.on.dispatches} dispatches and ${r.on.barriers} barriers a decode token, ${r.off.dispatches} and ${r.off.barriers} without (${r.layers} layers); ${r.on.logits.length} logits rows compared`);
        expectSameBits(r.on, r.off, { dispatches: r.layers, barriers: 0 });
      }, 360_000);
    }
  }

  test("VKMOE_NORM_WARM where the experts are one fused step (float atomics on: decode tokens), beside the router's step: one dispatch more a layer, no barrier more; logits within NMSE 1e-7 a row of off's (the fused call adds in any order: two runs of one model differ by ~1e-9)", async () => {
    const name = "qwen3-moe-tiny.Q8_0.gguf";
    const r = await warmSwitchRuns(name, "VKMOE_NORM_WARM", {});
    if (!r) return;
    expect(r.why).toContain("fused MoE call");
    const worst = (x: SwitchRun, y: SwitchRun) => Math.max(...x.logits.map((row, i) => nmse(y.logits[i]!, row)));
    console.log(`VKMOE_NORM_WARM beside the router (${name}, fused experts): ${r.on.dispatches} dispatches and ${r.on.barriers} barriers a decode token, ${r.off.dispatches} and ${r.off.barriers} without (${r.layers} layers); worst logits NMSE a row ${worst(r.on, r.off).toExponential(2)} over ${r.on.logits.length} rows (the same model run again: ${worst(r.on, r.again).toExponential(2)})`);
    expect(r.on.dispatches - r.off.dispatches).toBe(r.layers);
    expect(r.on.barriers).toBe(r.off.barriers);
    expect(r.on.logits.length).toBe(r.off.logits.length);
    expect(worst(r.on, r.off)).toBeLessThanOrEqual(1e-7);
  }, 360_000);
});

describe("the router GEMV routing in its last workgroup, and the post norm in each (VKMOE_ROUTE_FOLD)", () => {
  // float atomics off: the fused MoE call adds in any order, which would hide a difference or make one
  test("route: the norm its own step; off: the separate dec_route step too; each one barrier and one dispatch more a layer. route and off: the same logits bit for bit; auto (the norm folded in) within NMSE 1e-10 a row (prompt chunks, decode steps, a batch)", async () => {
    const ps = prompts();
    const name = "qwen3-moe-tiny.Q8_0.gguf"; // a GGUF router is F32: the fold applies
    const path = fixture(name);
    // the warm of the folded step (its own test above) off in all three: the counts here are the steps'
    using noWarm = processEnv("VKMOE_ROUTER_WARM", "off");
    // synchronization validation on the folded run: the route reads the other workgroups' logits with no barrier of its own,
    // and the last workgroup writes the residual the others read
    using folded = path ? await Model.load(path, { quant: "auto", env: baseEnv({ VKMOE_FLOAT_ATOMICS: "off" }), syncValidation: true, log: () => {} }) : undefined;
    if (!ps || !folded) return;
    const a = run(folded, ps);
    const runWith = async (fold: "route" | "off") => {
      using restore = processEnv("VKMOE_ROUTE_FOLD", fold); // the graph reads it from the process env when it is made
      using m = await load(name, baseEnv({ VKMOE_ROUTE_FOLD: fold, VKMOE_FLOAT_ATOMICS: "off" }));
      const r = run(m!, ps);
      expect(m!.takeValidationMessages()).toEqual([]);
      return r;
    };
    const b = await runWith("route"), c = await runWith("off");
    const layers = folded.config.layers;
    console.log(`route fold: ${a.barriers} barriers and ${a.dispatches} dispatches a decode token with the norm folded in, ${b.barriers} and ${b.dispatches} routing only, ${c.barriers} and ${c.dispatches} separate (${layers} layers); ${a.logits.length} logits rows compared`);
    for (const [more, fewer] of [[c, b], [b, a]] as const) {
      expect(more.barriers - fewer.barriers).toBe(layers);
      expect(more.dispatches - fewer.dispatches).toBe(layers);
      expect(more.logits.length).toBe(fewer.logits.length);
    }
    expect(differingRows(b.logits, c.logits)).toEqual([]);
    const worst = Math.max(...a.logits.map((row, i) => nmse(b.logits[i]!, row)));
    console.log(`  norm folded in: worst logits NMSE a row against the separate norm ${worst.toExponential(2)}`);
    expect(worst).toBeLessThanOrEqual(1e-10);
    expect(folded.takeValidationMessages()).toEqual([]);
  }, 360_000);
});

describe("negative controls", () => {
  test("the oracle's f16 cache matters: the same GPU run against an f32-cache CPU decoder differs by more than the run-to-run noise", async () => {
    const ps = prompts();
    using gpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv());
    using cpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv({ VKMOE_GPU: false }));
    if (!ps || !gpu || !cpu) return;
    const ids = ps[1]!;
    using a = gpu.session({ ctx: 128 });
    using a2 = gpu.session({ ctx: 128 });
    using b = cpu.session({ ctx: 128 });
    const x = a.prefill(ids).slice(), x2 = a2.prefill(ids).slice(), y = b.prefill(ids);
    const noise = nmse(x, x2), cacheGap = nmse(y, x);
    console.log(`GPU run to run ${noise.toExponential(1)}; against an f32 cache ${cacheGap.toExponential(1)}`);
    expect(cacheGap).toBeGreaterThan(100 * noise);
    expect(cacheGap).toBeGreaterThan(1e-8);
  }, 120_000);

  test("a replay at the wrong position is detected: the same token run at position p+1 differs from position p", async () => {
    const ps = prompts();
    using gpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv());
    using cpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv({ VKMOE_GPU: false }));
    if (!ps || !gpu || !cpu) return;
    const ids = ps[0]!;
    using a = gpu.session({ ctx: 128 });
    using b = cpu.session({ ctx: 128, cpuCache: "f16" });
    const x = a.prefill(ids).slice();
    b.prefill([ids[0]!, ...ids]); // one position later: RoPE and the context differ
    const y = b.prefill([ids[0]!]);
    expect(nmse(y, x)).toBeGreaterThan(1e-4);
  }, 120_000);
});

test("replay: 500 greedy tokens at changing positions give the logits of a fresh CPU run at sampled steps; synchronization validation clean", async () => {
  const ps = prompts();
  using gpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv(), "auto", { syncValidation: true });
  using cpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv({ VKMOE_GPU: false }));
  if (!ps || !gpu || !cpu) return;
  const prompt = ps[0]!;
  const steps = 500;
  const sampled = new Set([0, 1, 63, 64, 65, 200, 333, steps - 1]);
  using a = gpu.session({ ctx: prompt.length + steps });
  const seen = new Map<number, Float32Array>();
  const fed = [...prompt];
  // Steps whose logits are compared read them back (the "logits" recording); the others take the
  // device's argmax (the "argmax" recording): both recordings replay at every position.
  let logits: Float32Array | undefined = a.prefill(prompt);
  let pending: number | undefined;
  for (let step = 0; step < steps; step++) {
    if (sampled.has(step)) seen.set(step, logits!.slice());
    const token = pending ?? argmaxOf(logits!);
    if (step + 1 === steps) break;
    fed.push(token);
    if (sampled.has(step + 1)) {
      logits = a.step(token);
      pending = undefined;
    } else {
      pending = a.stepGreedy(token).id;
      logits = undefined;
    }
  }
  using b = cpu.session({ ctx: fed.length, cpuCache: "f16" });
  const V = gpu.config.vocab;
  const all = b.prefillAll(fed);
  const errors = [...sampled].map((step) => {
    const t = prompt.length - 1 + step;
    return { step, e: nmse(all.subarray(t * V, (t + 1) * V), seen.get(step)!) };
  });
  console.log(`replay: NMSE at steps ${errors.map((x) => `${x.step}: ${x.e.toExponential(1)}`).join(", ")}`);
  for (const x of errors) expect(x).toEqual({ step: x.step, e: expect.any(Number) });
  expect(errors.filter((x) => !(x.e <= 1e-6))).toEqual([]);
  expect(gpu.takeValidationMessages()).toEqual([]);
}, 300_000);

function argmaxOf(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
}

test("per-layer mode: a budget below the experts runs the dense ops on the GPU a layer a submit and the experts through the per-layer call (misses upload), says why in one line, same logits", async () => {
  const ps = prompts();
  const lines: string[] = [];
  const path = fixture("qwen3-moe-tiny.Q8_0.gguf");
  if (!ps || !path) return;
  // 0.1 MB holds 7 of the 48 experts
  using small = await Model.load(path, { env: baseEnv(), budgetMB: 0.1, log: (l) => lines.push(l) });
  using cpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv({ VKMOE_GPU: false }));
  expect(small.device.mode).toBe("per-layer");
  expect(lines.filter((l) => /per-layer mode/.test(l)).length).toBe(1);
  expect(small.device.why).toMatch(/dense ops on the GPU a layer a submit/);
  using a = small.session({ ctx: 64 });
  using b = cpu!.session({ ctx: 64, cpuCache: "f16" });
  expect(a.path).toBe("device");
  const tapA = routingTap(), tapB = routingTap();
  a.observer = tapA.observer;
  b.observer = tapB.observer;
  const ids = ps[1]!;
  expect(nmse(b.prefill(ids).slice(), a.prefill(ids).slice())).toBeLessThanOrEqual(1e-6);
  for (let i = 0; i < 4; i++) expect(nmse(b.step(ids[i]!).slice(), a.step(ids[i]!).slice())).toBeLessThanOrEqual(1e-6);
  expect(tapA.routes).toEqual(tapB.routes);
  expect(tapA.routes.length).toBe(small.config.layers);
  const stats = small.expertCacheStats()!;
  expect(stats.uploads).toBeGreaterThan(48); // misses uploaded, evicting colder experts
  expect(small.takeValidationMessages()).toEqual([]);
}, 120_000);

test(`prefill in chunks of up to ${GRAPH_MAX_TOKENS} tokens a replay: prompts of 1..150 tokens and the step after them equal the CPU decoder's, one submit per chunk`, async () => {
  const ps = prompts();
  using gpu = await load("qwen3-moe-tiny.Q4_0.gguf", baseEnv());
  using cpu = await load("qwen3-moe-tiny.Q4_0.gguf", baseEnv({ VKMOE_GPU: false }));
  if (!ps || !gpu || !cpu) return;
  // the fixture's prompts end to end: a context past two chunks
  const ids = ps.flat().concat(ps.flat(), ps.flat(), ps.flat()).slice(0, 151);
  expect(ids.length).toBe(151);
  // 1..4: the decode call paths (fused); 5+: the MoE call regrouped by expert; 64, 65, 150: several chunks
  for (const n of [1, 4, 5, 13, 64, 65, 150]) {
    using a = gpu.session({ ctx: 256 });
    using b = cpu.session({ ctx: 256, cpuCache: "f16" });
    const tapA = routingTap(), tapB = routingTap();
    a.observer = tapA.observer;
    b.observer = tapB.observer;
    const x = a.prefill(ids.slice(0, n)).slice(), y = b.prefill(ids.slice(0, n)).slice();
    expect({ n, e: nmse(y, x) <= 1e-6 }).toEqual({ n, e: true });
    expect(a.counts.submits).toBe(Math.ceil(n / GRAPH_MAX_TOKENS));
    expect(tapA.routes).toEqual(tapB.routes);
    expect({ n, e: nmse(b.step(ids[n]!), a.step(ids[n]!)) <= 1e-6 }).toEqual({ n, e: true });
  }
  expect(gpu.takeValidationMessages()).toEqual([]);
}, 300_000);

test("a timed session sums its replays' GPU time (counts.gpuUs, bench:generate's prefill figure); an untimed one keeps 0", async () => {
  const ps = prompts();
  using gpu = await load("qwen3-moe-tiny.Q4_0.gguf", baseEnv());
  if (!ps || !gpu) return;
  const ids = ps.flat().concat(ps.flat(), ps.flat(), ps.flat()).slice(0, 150);
  // one replay a call: their lastGpuUs summed
  using timed = gpu.session({ ctx: 256, timing: true });
  let sum = 0;
  for (const part of [ids.slice(0, GRAPH_MAX_TOKENS), ids.slice(GRAPH_MAX_TOKENS, 2 * GRAPH_MAX_TOKENS), ids.slice(2 * GRAPH_MAX_TOKENS)]) {
    timed.prefill(part);
    expect(timed.lastGpuUs).toBeGreaterThan(0);
    sum += timed.lastGpuUs;
  }
  expect(timed.counts.gpuUs).toBeCloseTo(sum, 6);
  // a prompt of three replays in one call: every replay counted, not only the last
  using again = gpu.session({ ctx: 256, timing: true });
  again.prefill(ids);
  expect(again.counts.submits).toBe(3);
  expect(again.counts.gpuUs).toBeGreaterThan(again.lastGpuUs);
  using plain = gpu.session({ ctx: 256 });
  plain.prefill(ids);
  expect(plain.counts.gpuUs).toBe(0);
  expect(gpu.takeValidationMessages()).toEqual([]);
}, 120_000);

describe("resident on every addressing and MoE call path", () => {
  const variants: { name: string; env: Partial<VkmoeEnv>; bound: number; mode: RegExp }[] = [
    { name: "descriptor addressing, fused call", env: { VKMOE_BDA: "off" }, bound: 1e-6, mode: /fused MoE call.*descriptor addressing/ },
    { name: "BDA, grouped call (no float atomics)", env: { VKMOE_FLOAT_ATOMICS: "off" }, bound: 1e-6, mode: /grouped MoE call.*bda addressing/ },
    { name: "descriptor addressing, grouped call", env: { VKMOE_BDA: "off", VKMOE_FLOAT_ATOMICS: "off" }, bound: 1e-6, mode: /grouped MoE call.*descriptor addressing/ },
    { name: "grouped integer-dot call (quantize_act first)", env: { VKMOE_FLOAT_ATOMICS: "off", VKMOE_IDP: "on" }, bound: 5e-3, mode: /grouped MoE call.*integer-dot path/ },
  ];
  for (const v of variants) {
    test(`${v.name}: a prompt and 4 steps equal the CPU decoder's (NMSE <= ${v.bound})`, async () => {
      const ps = prompts();
      using gpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv(v.env));
      using cpu = await load("qwen3-moe-tiny.Q8_0.gguf", baseEnv({ VKMOE_GPU: false }));
      if (!ps || !gpu || !cpu) return;
      expect(gpu.device.mode).toBe("resident");
      expect(gpu.device.why).toMatch(v.mode);
      const ids = ps[1]!;
      using a = gpu.session({ ctx: 64 });
      using b = cpu.session({ ctx: 64, cpuCache: "f16" });
      expect(nmse(b.prefill(ids).slice(), a.prefill(ids).slice())).toBeLessThanOrEqual(v.bound);
      for (let i = 0; i < 4; i++) expect(nmse(b.step(ids[i]!).slice(), a.step(ids[i]!).slice())).toBeLessThanOrEqual(v.bound);
      expect(gpu.takeValidationMessages()).toEqual([]);
    }, 120_000);
  }
});
