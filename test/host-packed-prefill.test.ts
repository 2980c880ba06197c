/**
 * Prompts admitted together prefill together (the server's admission, issue 16), over the tiny
 * Q8_0 fixture on Lavapipe. SessionBatch.prefillMany packs several slots' prompts (one of 1
 * token, one after a held prefix, one longer than a 64-token replay) into shared replays: each
 * item's last logits equal a Session of its own prefilled with the same tokens (NMSE <= 1e-6, the
 * bound of the other batch tests) and the batch prefilled one prompt at a time, and greedy decoding
 * from both batches gives the same ids; the per-session fallback (cpu mode) gives its sessions'
 * logits exactly. That a replay holding several tokens of several slots computes what separate
 * prefills compute is the proof that a token's attention sees its own slot's earlier tokens of
 * the same replay (the cache appends of every token run before attention). In the server, N
 * concurrent greedy streams each get the text they get alone, with fewer prompt model calls
 * (vkmoe_prefill_calls_total) than requests (their prompts packed, and run in a decode round's
 * replay where that saves one). The scheduler over a stand-in batch: the prompts admitted in one
 * gap are one prefillMany call, shared with the round of the requests decoding where that saves a
 * call; an engine error in it fails exactly its jobs and the loop goes on; a sink that throws
 * fails only its own job.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { Model, Sequence } from "../src/engine/index.ts";
import { VkmoeError } from "../src/errors.ts";
import { BatchedStepper } from "../src/host/decode-stepper.ts";
import { BatchSlots, startServer, type SlotBatch } from "../src/host/index.ts";
import { SlotScheduler, type JobSink } from "../src/host/scheduler.ts";
import type { BatchPath, BatchStep, PrefillItem, SessionBatch } from "../src/model/session-batch.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";
import { metricsOf } from "./support/host.ts";

const BOUND = 1e-6;
const T = 90_000;
const modelPath = fixture("qwen3-moe-tiny.Q8_0.gguf");
const env = (o: Partial<VkmoeEnv> = {}): VkmoeEnv => ({ ...readConfig(), VKMOE_VALIDATION: true, VKMOE_FLOAT_ATOMICS: "off", VKMOE_IDP: "off", VKMOE_GRAPH: "on", ...o });

/** Resident on Lavapipe: model.batch runs on its device path. */
let gpu: Model | undefined;
let ps: number[][] = [];

beforeAll(async () => {
  const json = fixture("qwen3-moe-tiny/reference.json");
  if (!modelPath || !json) return;
  ps = (JSON.parse(readFileSync(json, "utf8")).prompts as { input_ids: number[] }[]).map((p) => p.input_ids);
  gpu = await Model.load(modelPath, { env: env(), log: () => {}, ctx: 256 });
});
afterAll(() => gpu?.[Symbol.dispose]());

const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);

/**
 * Four prompts of different lengths, slot 2 after a held prefix of 3 tokens, the 70-token one
 * last so that the first replay holds tokens of all four slots (10 + 5 + 1 + 48) and the long one
 * spans two replays.
 */
function items(): { held: number[]; items: PrefillItem[] } {
  const long = [...ps.flat(), ...ps.flat()].slice(0, 70);
  return {
    held: ps[1]!.slice(0, 3),
    items: [
      { slot: 3, ids: ps[0]!.slice(0, 10) },
      { slot: 2, ids: ps[1]!.slice(3, 8) },
      { slot: 1, ids: [ps[1]![10]!] },
      { slot: 0, ids: long },
    ],
  };
}

/**
 * Prefills the items packed on `packed` and one at a time on `alone` (and on a Session of its
 * own each), compares the last logits, then decodes `steps` greedy tokens of every slot on both
 * batches. Returns the worst NMSEs (against the batch one at a time, and against the Sessions), the
 * packed call's replays and both batches' ids.
 */
function packedAgainstAlone(model: Model, packed: SessionBatch, alone: SessionBatch, steps: number) {
  const { held, items: list } = items();
  packed.prefill(2, held);
  alone.prefill(2, held);
  const runs = packed.counts.runs;
  const got = packed.prefillMany(list);
  const packedRuns = packed.counts.runs - runs;
  const worst = { alone: 0, session: 0 };
  const wants = list.map((item, i) => {
    const want = alone.prefill(item.slot, item.ids);
    using own = model.session({ ctx: packed.ctx });
    const session = own.prefill(item.slot === 2 ? [...held, ...Array.from(item.ids)] : item.ids).slice();
    worst.alone = Math.max(worst.alone, nmse(want, got[i]!));
    worst.session = Math.max(worst.session, nmse(session, got[i]!));
    expect(packed.tokens(item.slot)).toEqual(alone.tokens(item.slot));
    return want;
  });
  /** Greedy ids of every slot, `steps` rounds, from the prompts' logits. */
  const decode = (b: SessionBatch, first: Float32Array[]) => {
    const out: number[][] = [];
    let next = first.map(argmax);
    for (let s = 0; s < steps; s++) {
      out.push(next);
      next = b.step(list.map((item, i) => ({ slot: item.slot, id: next[i]! }))).map(argmax);
    }
    return out;
  };
  const ids = { packed: decode(packed, got), alone: decode(alone, wants) };
  return { worst, packedRuns, ids };
}

describe("SessionBatch.prefillMany: several slots' prompts packed into shared replays", () => {
  test("resident: each item's logits equal its own prefill's (a Session's and the batch's one at a time); greedy decoding the same; fewer replays", () => {
    if (!gpu) return console.log("skipping prefillMany (resident): the fixture model is missing");
    expect(gpu.device.mode).toBe("resident");
    using packed = gpu.batch({ slots: 4, ctx: 160 });
    using alone = gpu.batch({ slots: 4, ctx: 160 });
    expect(packed.path).toBe("device-batch");
    expect(items().items.map((i) => i.ids.length)).toEqual([10, 5, 1, 70]);
    const aloneRuns = alone.counts.runs;
    const r = packedAgainstAlone(gpu, packed, alone, 4);
    const aloneReplays = alone.counts.runs - aloneRuns - 1 - 4; // less the held prefix's replay and the decode steps
    console.log(`  prefillMany: worst NMSE ${r.worst.alone.toExponential(2)} against the batch one prompt at a time, ${r.worst.session.toExponential(2)} against Sessions; 86 tokens of 4 prompts in ${r.packedRuns} replays (one at a time: ${aloneReplays})`);
    expect(Math.max(r.worst.alone, r.worst.session)).toBeLessThanOrEqual(BOUND);
    expect(r.packedRuns).toBe(2);
    expect(aloneReplays).toBe(5);
    expect(r.ids.packed).toEqual(r.ids.alone);
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, T);

  test("cpu mode (the sessions path): each slot's session in turn, the same logits exactly", async () => {
    if (!gpu) return console.log("skipping prefillMany (cpu): the fixture model is missing");
    using cpu = await Model.load(modelPath!, { env: env({ VKMOE_GPU: false }), log: () => {}, ctx: 256 });
    using packed = cpu.batch({ slots: 4, ctx: 160 });
    using alone = cpu.batch({ slots: 4, ctx: 160 });
    expect(packed.path).toBe("sessions");
    const r = packedAgainstAlone(cpu, packed, alone, 2);
    expect(Math.max(r.worst.alone, r.worst.session)).toBeLessThanOrEqual(1e-10);
    expect(r.ids.packed).toEqual(r.ids.alone);
  }, T);

  test("bad calls are refused whole, before any model call: nothing is held", () => {
    if (!gpu) return console.log("skipping: the fixture model is missing");
    using b = gpu.batch({ slots: 2, ctx: 8 });
    const refused = (f: () => unknown, why: RegExp) => {
      expect(f).toThrow(why);
      expect([b.tokens(0).length, b.tokens(1).length, b.counts.runs]).toEqual([0, 0, 0]);
    };
    refused(() => b.prefillMany([]), /at least one item/);
    refused(() => b.prefillMany([{ slot: 0, ids: [1] }, { slot: 0, ids: [2] }]), /slot 0 appears twice/);
    refused(() => b.prefillMany([{ slot: 0, ids: [1] }, { slot: 1, ids: [] }]), /at least one token/);
    refused(() => b.prefillMany([{ slot: 0, ids: [1] }, { slot: 1, ids: [1, 2, 3, 4, 5, 6, 7, 8, 9] }]), /do not fit the context of 8/);
    refused(() => b.prefillMany([{ slot: 0, ids: [1] }, { slot: 1, ids: [-1] }]), /outside the vocabulary/);
    refused(() => b.prefillMany([{ slot: 2, ids: [1] }]), /slot 2 is outside 0..1/);
  });
});

/** A streamed /v1/completions of token ids, greedy: its text. */
async function streamIds(url: string, prompt: number[], maxTokens: number): Promise<string> {
  const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true }) });
  expect(r.status).toBe(200);
  const events = (await r.text()).split("\n\n").filter(Boolean);
  expect(events.at(-1)).toBe("data: [DONE]");
  return events.slice(0, -1).map((e) => JSON.parse(e.slice("data: ".length))).map((c) => {
    if (c.error) throw new Error(c.error.message);
    return c.choices[0].text as string;
  }).join("");
}

test("server: concurrent greedy streams each equal their text alone, their prompts in fewer model calls than requests", async () => {
  if (!gpu) return console.log("skipping the packed server test: the fixture model is missing");
  const N = 6;
  // different lengths (2..12 tokens) and different first tokens: no slot reuses another's prefix
  const prompts = Array.from({ length: N }, (_, i) => ps[i % 2]!.slice(i, i + 2 + 2 * i));
  expect(new Set(prompts.map((p) => p[0])).size).toBe(N);
  const server = startServer(gpu, { port: 0, ctx: 160, modelName: "tiny", parallel: N });
  try {
    const calls = async () => (await metricsOf(server.url)).get("vkmoe_prefill_calls_total")!;
    const lone: string[] = [];
    const c0 = await calls();
    for (const p of prompts) lone.push(await streamIds(server.url, p, 3));
    const c1 = await calls();
    expect(c1 - c0).toBe(N); // alone: one replay each
    const together = await Promise.all(prompts.map((p) => streamIds(server.url, p, 3)));
    const c2 = await calls();
    expect(together).toEqual(lone);
    console.log(`  server: ${N} concurrent prompts in ${c2 - c1} prefill calls (alone: ${c1 - c0})`);
    expect(c2 - c1).toBeLessThan(N);
    expect(gpu.takeValidationMessages()).toEqual([]);
  } finally {
    await server.close();
  }
}, T);

/**
 * A stand-in batch: no model; each slot's logits put its next id at 100 + slot. `log` has a line
 * per call ("prefillMany slot:tokens ..." or "step slot ..."); `fail` arms the next prefillMany to throw.
 */
function fakeBatch(slots: number) {
  const held: number[][] = Array.from({ length: slots }, () => []);
  const V = 200;
  const row = (slot: number) => {
    const r = new Float32Array(V);
    r[100 + slot] = 1;
    return r;
  };
  const state = { log: [] as string[], fail: false };
  const batch: SlotBatch = {
    slots,
    ctx: 64,
    path: "device-batch" as BatchPath,
    prefill: (slot, ids) => batch.prefillMany([{ slot, ids }])[0]!,
    prefillMany: (items) => {
      state.log.push(`prefillMany ${items.map((i) => `${i.slot}:${i.ids.length}`).join(" ")}`);
      if (state.fail) {
        state.fail = false;
        throw new VkmoeError("DEVICE_LOST", "device lost (simulated)");
      }
      for (const i of items) held[i.slot]!.push(...Array.from(i.ids));
      return items.map((i) => row(i.slot));
    },
    step: (steps: readonly BatchStep[]) => {
      state.log.push(`step ${steps.map((s) => s.slot).join(" ")}`);
      return steps.map((s) => (held[s.slot]!.push(s.id), row(s.slot)));
    },
    tokens: (slot) => held[slot]!,
    truncate: (slot, keep) => void (held[slot]!.length = keep),
    [Symbol.dispose]: () => {},
  };
  return { batch, state };
}

test("scheduler: jobs admitted in one gap are one prefillMany, shared with the round where that saves a call; an engine error there fails exactly its jobs; a throwing sink fails only its own", async () => {
  if (!gpu) return console.log("skipping the scheduler test: the fixture model's tokenizer is missing");
  const tokenizer = gpu.tokenizer;
  const { batch, state } = fakeBatch(4);
  const slots = new BatchSlots(batch);
  await using scheduler = new SlotScheduler({ slots: 4, queueLimit: 8, openSession: () => slots.open(), stepper: new BatchedStepper(batch) });
  type Outcome = { ids: number[] } | { error: string };
  const submit = (prompt: number[], o: { throwing?: boolean; maxTokens?: number; onFirst?: () => void } = {}): Promise<Outcome> => new Promise((resolve) => {
    let first = true;
    const sink: JobSink = {
      delta: () => {
        if (o.throwing) throw new Error("the sink broke");
        if (first) o.onFirst?.();
        first = false;
      },
      finished: (seq) => resolve({ ids: seq.ids }),
      failed: (e) => resolve({ error: String((e as Error).message) }),
    };
    scheduler.submit({
      promptIds: prompt,
      start: (session, heldPrefix) => new Sequence(tokenizer, session, prompt, { maxTokens: o.maxTokens ?? 3, heldPrefix, stopAtEos: false, sampling: { temperature: 0 } }),
      deadline: performance.now() + 30_000,
      timeoutSeconds: 30,
    }, sink);
  });
  // submitted in one tick: the loop admits all three in the same gap
  const first = await Promise.all([submit([1, 2, 3]), submit([4, 5], { throwing: true }), submit([6])]);
  expect(state.log[0]).toBe("prefillMany 0:3 1:2 2:1");
  expect(first).toEqual([{ ids: [100, 100, 100] }, { error: "the sink broke" }, { ids: [102, 102, 102] }]);

  state.log.length = 0;
  state.fail = true;
  const failed = await Promise.all([submit([7, 8]), submit([9])]);
  expect(failed).toEqual([{ error: "device lost (simulated)" }, { error: "device lost (simulated)" }]);
  expect(state.log).toHaveLength(1);
  // their sessions are disposed (their slots emptied), not reused; the loop goes on
  expect(scheduler.stats().sessions.discarded).toBe(2);

  // prompts arriving while another request decodes share its round's call: one prefillMany, its first item that request's token
  state.log.length = 0;
  const later: Promise<Outcome>[] = [];
  const running = await submit([10, 11, 12], { maxTokens: 4, onFirst: () => later.push(submit([13, 14]), submit([15])) });
  const all = [running, ...(await Promise.all(later))];
  expect(all.map((o) => "ids" in o && o.ids.length)).toEqual([4, 3, 3]);
  const [alone, round, shared] = state.log;
  expect(alone).toMatch(/^prefillMany \d:3$/);
  const slot = alone!.split(" ")[1]!.split(":")[0];
  expect(round).toBe(`step ${slot}`);
  expect(shared).toMatch(new RegExp(`^prefillMany ${slot}:1 \\d:2 \\d:1$`));
  expect(state.log.slice(3).every((l) => l.startsWith("step"))).toBe(true);
});
