/**
 * Continuous batching in the server over the tiny Q8_0 fixture. Resident on Lavapipe (VKMOE_GRAPH
 * on: the slots are one SessionBatch on its "device-batch" path, one replay a round): 8 concurrent
 * streamed greedy requests with different prompts each get the text they get alone, the
 * round-robin stepper (--batching off, the reference) gives the same texts, and /metrics shows
 * fewer decode calls than tokens; a lost device moves the batch to the CPU path with one line
 * while the streams go on. The slot logic over a batch on its "sessions" path (the per-layer
 * model, whose tokens cost a sixth of a resident one's on Lavapipe): a slot keeps its prompt
 * cache; an engine error in a batched call fails every sequence of that call, empties their
 * slots, and the server goes on; a disconnect frees its slot.
 *
 * Resident tokens are slow on Lavapipe (about 0.45 s each, batched or not: two CPU cores run
 * the replay), so the resident requests are short: 2-token prompts, 3 tokens each.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { readConfig } from "../src/config.ts";
import { Model, promptIds } from "../src/engine/index.ts";
import { VkmoeError } from "../src/errors.ts";
import { startServer, type RunningServer, type SlotBatch } from "../src/host/index.ts";
import { eventually, loadHostModel, metricsOf, modelPath } from "./support/host.ts";

const CTX = 160;
const T = 60_000;
const MAX_TOKENS = 10;
const WORDS = [" one two", " the sky", " a cat", " why not", " red fox", " hello there", " big sea", " 1 2"];

/** Resident (the batch's device path); the last test loses its device. */
let model: Model;
const modelLines: string[] = [];
/** Per-layer: a batch over it runs on its sessions path. */
let perLayer: Model;

/** The fixture resident (the whole token on the GPU: the batch's device path); float atomics off so that sums are deterministic. */
function loadResident(lines: string[]): Promise<Model> {
  return Model.load(modelPath!, { env: { ...readConfig(), VKMOE_FLOAT_ATOMICS: "off", VKMOE_GRAPH: "on", VKMOE_IDP: "off" }, log: (l) => lines.push(l), ctx: 256 });
}

const servers: RunningServer[] = [];
function serve(m: Model, extra: Parameters<typeof startServer>[1] = {}, options: Parameters<typeof startServer>[2] = {}): { server: RunningServer; client: OpenAI } {
  const server = startServer(m, { port: 0, ctx: CTX, modelName: "tiny", ...extra }, options);
  servers.push(server);
  return { server, client: new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0, timeout: 30_000 }) };
}

beforeAll(async () => {
  if (!modelPath) return;
  model = await loadResident(modelLines);
  perLayer = await loadHostModel();
});
afterAll(async () => {
  for (const s of servers) await s.close();
  model?.[Symbol.dispose]();
  perLayer?.[Symbol.dispose]();
});

/** The slots as a batch of the per-layer model: its sessions path, stepped by the batched stepper all the same. */
const sessionsBatch = (m: Model) => ({ openBatch: (slots: number, ctx: number) => m.batch({ slots, ctx }) });

/** A streamed /v1/completions of token ids, greedy: its text. */
async function streamIds(server: RunningServer, prompt: number[], maxTokens: number): Promise<string> {
  const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true }) });
  expect(r.status).toBe(200);
  const events = (await r.text()).split("\n\n").filter(Boolean);
  expect(events.at(-1)).toBe("data: [DONE]");
  return events.slice(0, -1).map((e) => JSON.parse(e.slice("data: ".length))).map((c) => {
    if (c.error) throw new Error(c.error.message);
    return c.choices[0].text as string;
  }).join("");
}

const it = modelPath ? test : test.skip;

async function streamText(client: OpenAI, content: string, maxTokens = MAX_TOKENS): Promise<string> {
  const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content }], max_tokens: maxTokens, temperature: 0, stream: true });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content ?? "";
  return text;
}

const health = async (server: RunningServer) => (await fetch(`${server.url}/health`)).json() as Promise<any>;

it("8 concurrent streams: batched equals each alone and equals round-robin; fewer decode calls than tokens", async () => {
  expect(model.device.mode).toBe("resident");
  const prompts = WORDS.map((w) => model.tokenizer.encode(w, { addBos: false }).slice(0, 2));
  expect(new Set(prompts.map((p) => p.join())).size).toBe(8);
  const N = 3;
  const batched = serve(model, { parallel: 8 });
  expect(await health(batched.server)).toMatchObject({ stepper: "batched", batch: "device-batch" });
  const lone: string[] = [];
  for (const p of prompts) lone.push(await streamIds(batched.server, p, N));
  const before = await metricsOf(batched.server.url);
  const together = await Promise.all(prompts.map((p) => streamIds(batched.server, p, N)));
  const after = await metricsOf(batched.server.url);
  expect(together).toEqual(lone);
  const grew = (name: string) => after.get(name)! - before.get(name)!;
  const calls = grew("vkmoe_decode_calls_total"), steps = grew("vkmoe_decode_sequence_steps_total"), tokens = grew("vkmoe_completion_tokens_total");
  // the first token of each comes from its prefill; every other one from a decode step
  expect(tokens).toBe(8 * N);
  expect(steps).toBe(tokens - 8);
  expect(calls).toBeLessThan(steps);
  expect(after.get("vkmoe_decode_sequences_per_call")).toBeGreaterThan(1);
  expect(after.get(`vkmoe_decode_stepper{stepper="batched"}`)).toBe(1);
  console.log(`  batched: ${tokens} tokens of 8 streams, ${steps} sequence steps in ${calls} decode calls`);

  const roundRobin = serve(model, { parallel: 8, batching: "off" });
  expect(await health(roundRobin.server)).toMatchObject({ stepper: "round-robin", batch: "device-batch" });
  const rrBefore = await metricsOf(roundRobin.server.url);
  expect(await Promise.all(prompts.map((p) => streamIds(roundRobin.server, p, N)))).toEqual(lone);
  const rrAfter = await metricsOf(roundRobin.server.url);
  const rrGrew = (name: string) => rrAfter.get(name)! - rrBefore.get(name)!;
  expect(rrGrew("vkmoe_decode_calls_total")).toBe(rrGrew("vkmoe_decode_sequence_steps_total"));
  await Promise.all([batched.server.close(), roundRobin.server.close()]);
}, T);

it("a slot of the batch keeps its prompt cache: a prompt extending what it holds prefills only the new tokens, same text as on a fresh slot", async () => {
  const { server } = serve(perLayer, { parallel: 2 }, sessionsBatch(perLayer));
  const complete = async (prompt: number[], maxTokens: number) => {
    const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }) });
    const body = await r.json() as any;
    expect(r.status).toBe(200);
    return body.choices[0].text as string;
  };
  const first = promptIds(perLayer, "The sky is", { raw: true });
  const reply = await complete(first, 4);
  const second = [...first, ...perLayer.tokenizer.encode(reply + " and then the rain came", { addBos: false })];
  const before = await metricsOf(server.url);
  const text = await complete(second, 6);
  const after = await metricsOf(server.url);
  const reused = after.get("vkmoe_prompt_tokens_reused_total")! - before.get("vkmoe_prompt_tokens_reused_total")!;
  expect(reused).toBeGreaterThanOrEqual(first.length);
  // the reference: the same prompt on a server whose slots hold nothing
  const { server: fresh } = serve(perLayer, { parallel: 1 }, sessionsBatch(perLayer));
  const r = await fetch(`${fresh.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: second, max_tokens: 6, temperature: 0 }) });
  expect(((await r.json()) as any).choices[0].text).toBe(text);
}, T);

it("an engine error in a batched call fails every stream of that call, empties their slots, and the server goes on", async () => {
  /** Armed: the next step call of two sequences throws. */
  let armed = false;
  const emptied: number[] = [];
  const openBatch = (slots: number, ctx: number): SlotBatch => {
    const b = perLayer.batch({ slots, ctx });
    return {
      get slots() { return b.slots; },
      get ctx() { return b.ctx; },
      get path() { return b.path; },
      prefill: (slot, ids) => b.prefill(slot, ids),
      prefillMany: (items) => b.prefillMany(items),
      step: (s) => {
        if (armed && s.length === 2) {
          armed = false;
          throw new VkmoeError("DEVICE_LOST", "device lost (simulated)");
        }
        return b.step(s);
      },
      tokens: (slot) => b.tokens(slot),
      truncate: (slot, keep) => {
        if (keep === 0 && b.tokens(slot).length > 0) emptied.push(slot);
        b.truncate(slot, keep);
      },
      [Symbol.dispose]: () => b[Symbol.dispose](),
    };
  };
  const { server, client } = serve(perLayer, { parallel: 2 }, { openBatch });
  const want = await streamText(client, "first");
  emptied.length = 0;
  armed = true;
  const outcomes = await Promise.all(["first", "second"].map((p) => streamText(client, p).then(() => undefined, (e: unknown) => e)));
  for (const e of outcomes) expect(String((e as Error)?.message)).toContain("the engine failed: device lost (simulated)");
  expect(emptied.sort()).toEqual([0, 1]);
  const m = await metricsOf(server.url);
  expect(m.get("vkmoe_stream_errors_total")).toBe(2);
  expect(m.get("vkmoe_active_sequences")).toBe(0);
  // nothing of the failed requests is reused: the prompt prefills in full, and gives its text
  const before = await metricsOf(server.url);
  expect(await streamText(client, "first")).toBe(want);
  const after = await metricsOf(server.url);
  expect(after.get("vkmoe_prompt_tokens_reused_total")).toBe(before.get("vkmoe_prompt_tokens_reused_total")!);
}, T);

it("a client disconnecting mid-stream frees its slot at once; the next request runs on it", async () => {
  const { server, client } = serve(perLayer, { parallel: 1 }, sessionsBatch(perLayer));
  expect(await health(server)).toMatchObject({ stepper: "batched", batch: "sessions" });
  const want = await streamText(client, "b", 3);
  const running = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "a" }], max_tokens: 150, temperature: 0, stream: true });
  const chunks = running[Symbol.asyncIterator]();
  await chunks.next();
  await chunks.next();
  await chunks.return!(); // disconnect
  expect(await eventually(async () => (await metricsOf(server.url)).get("vkmoe_active_sequences") === 0, 5000)).toBe(true);
  expect((await metricsOf(server.url)).get("vkmoe_requests_cancelled_total")).toBe(1);
  expect(await streamText(client, "b", 3)).toBe(want);
}, T);

// last: it loses the resident model's device for good
it("a lost device mid-stream: the batch goes on on the CPU path with one line, the streams finish, the server keeps serving", async () => {
  const { server } = serve(model, { parallel: 2 });
  expect((await health(server)).batch).toBe("device-batch");
  const prompts = WORDS.slice(0, 2).map((w) => model.tokenizer.encode(w, { addBos: false }).slice(0, 2));
  const opened = prompts.map((prompt) => fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: 6, temperature: 0, stream: true }) }));
  const responses = await Promise.all(opened);
  const readers = responses.map((r) => r.body!.getReader());
  const decoder = new TextDecoder();
  // each stream's first token (its prefill, on the device)
  const texts = await Promise.all(readers.map(async (r) => decoder.decode((await r.read()).value)));
  modelLines.length = 0;
  model.simulateDeviceLoss();
  await Promise.all(readers.map(async (r, i) => {
    for (let x = await r.read(); !x.done; x = await r.read()) texts[i] += decoder.decode(x.value);
  }));
  for (const t of texts) {
    expect(t).not.toContain("error");
    expect(t.trimEnd().endsWith("data: [DONE]")).toBe(true);
  }
  expect(await health(server)).toMatchObject({ batch: "sessions", mode: "cpu" });
  expect(modelLines.filter((l) => /device lost; the batch continues on the CPU path/.test(l))).toHaveLength(1);
  expect((await streamIds(server, prompts[0]!, 2)).length).toBeGreaterThan(0);
  const m = await metricsOf(server.url);
  expect(m.get("vkmoe_stream_errors_total")).toBe(0);
  expect(m.get("vkmoe_active_sequences")).toBe(0);
}, T);
