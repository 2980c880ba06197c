/**
 * The slots' sessions kept between requests (the server's prompt cache), over the tiny Q8_0
 * fixture on Lavapipe: a request whose prompt extends what a slot holds prefills only the new
 * tokens (the session's own token count and /metrics say so) and gives the same greedy text as a
 * fresh session; different prompts in a row on one slot equal fresh runs (nothing left over); a
 * session the engine failed in is disposed, not reused. And the pool on its own, over fake
 * sessions: the longest shared prefix wins, sessions open lazily up to the slots, a lost device's
 * sessions are not reused, all are disposed at the end.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { VkmoeError } from "../src/errors.ts";
import { generate, promptIds, Sequence, type Model } from "../src/engine/index.ts";
import { SessionPool, startServer, type ReusableSession, type RunningServer } from "../src/host/index.ts";
import { samplingFromModel } from "../src/sampling/defaults.ts";
import { loadHostModel, metricsOf, modelPath } from "./support/host.ts";

const CTX = 200;
const T = 30_000;
let model: Model;

/** Every session the servers open, counted, with the prompt tokens they run; `failAtStep` arms the next prefill's session to throw at that step. */
const counts = { opened: 0, disposed: 0, prefilledTokens: 0 };
let failAtStep: number | undefined;

function countedSession(ctx: number): ReusableSession {
  const s = model.session({ ctx });
  counts.opened++;
  let fault: number | undefined;
  let steps = 0;
  const check = () => {
    if (fault !== undefined && ++steps === fault) {
      fault = undefined;
      throw new VkmoeError("DEVICE_LOST", "device lost (simulated)");
    }
  };
  return {
    get ctx() { return s.ctx; },
    get length() { return s.length; },
    get tokens() { return s.tokens; },
    truncate: (keep) => s.truncate(keep),
    prefill: (ids) => {
      if (failAtStep !== undefined) [fault, failAtStep, steps] = [failAtStep, undefined, 0];
      counts.prefilledTokens += ids.length;
      return s.prefill(ids);
    },
    step: (id) => (check(), s.step(id)),
    stepGreedy: (id) => (check(), s.stepGreedy(id)),
    [Symbol.dispose]: () => {
      counts.disposed++;
      s[Symbol.dispose]();
    },
  };
}

const servers: RunningServer[] = [];
function serve(parallel = 1): RunningServer {
  const server = startServer(model, { port: 0, ctx: CTX, modelName: "tiny", parallel }, { openSession: countedSession });
  servers.push(server);
  return server;
}

beforeAll(async () => {
  if (modelPath) model = await loadHostModel();
});
afterAll(async () => {
  for (const s of servers) await s.close();
  model?.[Symbol.dispose]();
});

const it = modelPath ? test : test.skip;

/** The engine's greedy ids and text for `ids` on a fresh session: the oracle. */
function fresh(ids: number[], maxTokens: number): { ids: number[]; text: string } {
  using session = model.session({ ctx: CTX });
  const run = generate(model, session, ids, { maxTokens, sampling: samplingFromModel(model.generationDefaults, { temperature: 0 }) });
  let r = run.next();
  while (!r.done) r = run.next();
  return { ids: r.value.ids, text: r.value.text };
}

async function complete(server: RunningServer, prompt: number[], maxTokens: number): Promise<string> {
  const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }) });
  const body = await r.json() as any;
  if (r.status !== 200) throw new Error(`${r.status}: ${JSON.stringify(body)}`);
  return body.choices[0].text;
}

async function chat(server: RunningServer, messages: { role: string; content: string }[], maxTokens: number): Promise<{ status: number; text: string }> {
  const r = await fetch(`${server.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ messages, max_tokens: maxTokens, temperature: 0 }) });
  const body = await r.json() as any;
  return { status: r.status, text: r.status === 200 ? body.choices[0].message.content : body.error?.message };
}

/** The prompt-token counters' growth over `f`. */
async function promptCounters<T>(server: RunningServer, f: () => Promise<T>): Promise<{ value: T; reused: number; prefilled: number; total: number }> {
  const names = ["vkmoe_prompt_tokens_reused_total", "vkmoe_prompt_tokens_prefilled_total", "vkmoe_prompt_tokens_total"];
  const before = await metricsOf(server.url);
  const value = await f();
  const after = await metricsOf(server.url);
  const [reused, prefilled, total] = names.map((n) => after.get(n)! - before.get(n)!);
  return { value, reused: reused!, prefilled: prefilled!, total: total! };
}

it("a prompt that extends what the slot holds prefills only the new tokens, and gives a fresh session's greedy text", async () => {
  const server = serve(1);
  const first = promptIds(model, "The sky is", { raw: true });
  const reply = fresh(first, 4);
  expect(await complete(server, first, 4)).toBe(reply.text);
  // the slot now holds the prompt and every reply token but the last (never run)
  const held = [...first, ...reply.ids.slice(0, -1)];
  const second = [...first, ...reply.ids, ...model.tokenizer.encode(" and then the rain came", { addBos: false })];
  const prefilledBefore = counts.prefilledTokens;
  const opened = counts.opened;
  const c = await promptCounters(server, () => complete(server, second, 6));
  expect(c.value).toBe(fresh(second, 6).text);
  expect({ reused: c.reused, prefilled: c.prefilled, total: c.total }).toEqual({ reused: held.length, prefilled: second.length - held.length, total: second.length });
  expect(counts.prefilledTokens - prefilledBefore).toBe(second.length - held.length);
  expect(counts.opened).toBe(opened); // the same session
}, T);

it("a multi-turn chat re-sends the conversation: turn 2 reuses at least turn 1's prompt and equals a fresh run", async () => {
  const server = serve(1);
  const turn1 = [{ role: "user", content: "Hello there" }];
  const r1 = await chat(server, turn1, 6);
  expect(r1.status).toBe(200);
  const turn2 = [...turn1, { role: "assistant", content: r1.text }, { role: "user", content: "And then?" }];
  const ids1 = promptIds(model, "Hello there");
  const ids2 = promptIds(model, "And then?", {}, [{ role: "user", content: "Hello there" }, { role: "assistant", content: r1.text }]);
  const c = await promptCounters(server, () => chat(server, turn2, 6));
  expect(c.value).toEqual({ status: 200, text: fresh(ids2, 6).text });
  expect(c.reused).toBeGreaterThanOrEqual(ids1.length);
  expect(c.reused + c.prefilled).toBe(ids2.length);
}, T);

it("different prompts in a row on one slot equal fresh runs: nothing of the last request is left", async () => {
  const server = serve(1);
  const opened = counts.opened;
  const raw = ["The sky is", "Once upon a time", "The sky is"].map((p) => promptIds(model, p, { raw: true }));
  for (const ids of raw) expect(await complete(server, ids, 6)).toBe(fresh(ids, 6).text);
  // chat prompts share the template's opening: those tokens are reused, the rest differs
  for (const content of ["one", "two words", "one"]) {
    const c = await promptCounters(server, () => chat(server, [{ role: "user", content }], 6));
    expect(c.value).toEqual({ status: 200, text: fresh(promptIds(model, content), 6).text });
  }
  expect(counts.opened - opened).toBe(1);
}, 60_000);

it("a session the engine failed in is disposed, not reused: the next request opens another and equals a fresh run", async () => {
  const server = serve(1);
  const ids = promptIds(model, "Tell me", { raw: true });
  expect(await complete(server, ids, 3)).toBe(fresh(ids, 3).text);
  const [opened, disposed] = [counts.opened, counts.disposed];
  // the same prompt again reuses the slot's session, which now fails at its second step
  failAtStep = 2;
  const c1 = await promptCounters(server, async () => {
    const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: ids, max_tokens: 5, temperature: 0 }) });
    await r.body?.cancel();
    return r.status;
  });
  expect(c1.value).toBe(503);
  expect(c1.reused).toBe(ids.length - 1);
  expect(counts.opened - opened).toBe(0);
  expect(counts.disposed - disposed).toBe(1); // disposed at once, not kept
  const m = await metricsOf(server.url);
  expect(m.get("vkmoe_sessions_discarded_total")).toBe(1);
  expect(m.get("vkmoe_sessions_open")).toBe(0);
  const c2 = await promptCounters(server, () => complete(server, ids, 3));
  expect(c2.value).toBe(fresh(ids, 3).text);
  expect(c2.reused).toBe(0); // a new session
  expect(counts.opened - opened).toBe(1);
}, T);

it("closing a server disposes every session its slots kept", async () => {
  const server = serve(2);
  const [opened, disposed] = [counts.opened, counts.disposed];
  await Promise.all(["a b c", "d e f"].map((p) => complete(server, promptIds(model, p, { raw: true }), 3)));
  expect(counts.opened - opened).toBe(2);
  expect(counts.disposed - disposed).toBe(0); // kept between requests
  await server.close();
  expect(counts.disposed - disposed).toBe(2);
}, T);

it("a Sequence over a session holding the prompt's start runs only the rest; a session holding anything else is refused", () => {
  const ids = promptIds(model, "Hello there my good friend, how are you today", { raw: true });
  const want = fresh(ids, 5);
  using session = model.session({ ctx: CTX });
  session.prefill(ids.slice(0, 3));
  const sampling = samplingFromModel(model.generationDefaults, { temperature: 0 });
  const seq = new Sequence(model.tokenizer, session, ids, { maxTokens: 5, sampling, heldPrefix: 3 });
  const before = session.counts.tokens;
  seq.prefill();
  expect(session.counts.tokens - before).toBe(ids.length - 3);
  while (!seq.done) seq.step();
  expect({ ids: seq.ids, text: seq.text }).toEqual(want);
  // a held prefix that is not the prompt's, or the whole prompt held: refused before any model call
  using other = model.session({ ctx: CTX });
  other.prefill([ids[1]!, ids[0]!]);
  expect(() => new Sequence(model.tokenizer, other, ids, { maxTokens: 1, heldPrefix: 2 }).prefill()).toThrow(/not the prompt's first 2/);
  expect(() => new Sequence(model.tokenizer, other, ids.slice(0, 2), { maxTokens: 1, heldPrefix: 2 })).toThrow(/heldPrefix/);
  expect(() => new Sequence(model.tokenizer, other, ids, { maxTokens: 1, heldPrefix: 1 }).prefill()).toThrow(/holds 2 tokens/);
});

/** A stand-in session: it only keeps ids (the pool never runs a model call). */
function fakeSession(log: string[], name: string): ReusableSession {
  const tokens: number[] = [];
  return {
    ctx: 100,
    get length() { return tokens.length; },
    tokens,
    truncate: (keep) => void (tokens.length = keep),
    prefill: (ids) => (tokens.push(...Array.from(ids)), new Float32Array(1)),
    step: (id) => (tokens.push(id), new Float32Array(1)),
    stepGreedy: (id) => (tokens.push(id), { id: 0, value: 0 }),
    [Symbol.dispose]: () => void log.push(`dispose ${name}`),
  };
}

test("session pool: opens lazily up to its size, the longest shared prefix wins, a lost device's sessions are not reused, all disposed at the end", () => {
  const log: string[] = [];
  let n = 0;
  let epoch = "per-layer";
  const names = new Map<ReusableSession, string>();
  const pool = new SessionPool(2, () => {
    const name = `s${n++}`;
    log.push(`open ${name}`);
    const s = fakeSession(log, name);
    names.set(s, name);
    return s;
  }, () => epoch);
  const run = (prompt: number[]) => {
    const lease = pool.acquire(prompt);
    lease.session.prefill(prompt.slice(lease.heldPrefix));
    pool.release(lease.session, { reusable: true });
    return { name: names.get(lease.session), heldPrefix: lease.heldPrefix };
  };
  expect(run([1, 2, 3])).toEqual({ name: "s0", heldPrefix: 0 });
  expect(run([7, 8])).toEqual({ name: "s1", heldPrefix: 0 }); // nothing shared: a second session, s0's cache kept
  expect(run([1, 2, 3, 4])).toEqual({ name: "s0", heldPrefix: 3 });
  expect(run([7, 8, 9])).toEqual({ name: "s1", heldPrefix: 2 });
  expect(run([1, 2, 3, 4])).toEqual({ name: "s0", heldPrefix: 3 }); // the whole prompt held: its last id runs again
  expect(run([5])).toEqual({ name: "s1", heldPrefix: 0 }); // full: nothing shared takes the least recently used
  expect(pool.stats()).toEqual({ open: 2, opened: 2, discarded: 0 });
  // both taken: a third is refused (the scheduler never asks then)
  const a = pool.acquire([1]);
  const b = pool.acquire([1]);
  expect(() => pool.acquire([1])).toThrow(RangeError);
  pool.release(a.session, { reusable: false }); // the engine failed in it
  expect(log.at(-1)).toBe(`dispose ${names.get(a.session)}`);
  epoch = "cpu"; // the device was lost
  pool.release(b.session, { reusable: true });
  expect(log.at(-1)).toBe(`dispose ${names.get(b.session)}`);
  expect(run([1, 2])).toEqual({ name: "s2", heldPrefix: 0 });
  expect(pool.stats()).toEqual({ open: 1, opened: 3, discarded: 2 });
  const c = pool.acquire([1, 2, 3]);
  pool[Symbol.dispose]();
  expect(log.filter((l) => l.startsWith("dispose"))).toHaveLength(2); // the taken one waits for its request
  pool.release(c.session, { reusable: true }); // given back after the end: disposed
  expect(log.filter((l) => l.startsWith("dispose")).sort()).toEqual(["dispose s0", "dispose s1", "dispose s2"]);
});
