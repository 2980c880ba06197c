/**
 * The server runs Qwen3.5 sequences together (issue 15): the tiny Qwen3.5 Q8_0 fixture resident on
 * Lavapipe (VKMOE_GRAPH=on), its slots one SessionBatch on the "device-batch" path (a HybridBatch:
 * one replay a decode round, prompts packed). 4 concurrent greedy streams with different prompts
 * each get the text they get alone, with fewer decode calls than sequence steps and fewer prompt
 * calls than requests; a slot reused for a prompt that extends what it holds (the pool's prefix
 * reuse, which for recurrent states resets the slot and runs the kept tokens again) gives the
 * text a fresh server gives. Float atomics off: greedy texts compared across runs must not differ
 * by a rounding-level flip.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readConfig } from "../src/config.ts";
import { Model } from "../src/engine/index.ts";
import { startServer, type RunningServer } from "../src/host/index.ts";
import { fixture } from "./support/fixtures.ts";
import { metricsOf } from "./support/host.ts";

const CTX = 128;
const T = 120_000;
const path = fixture("qwen3.5-moe-tiny.Q8_0.gguf");
const it = path ? test : test.skip;

let model: Model;
const servers: RunningServer[] = [];

beforeAll(async () => {
  if (!path) return;
  model = await Model.load(path, { env: { ...readConfig(), VKMOE_VALIDATION: true, VKMOE_FLOAT_ATOMICS: "off", VKMOE_GRAPH: "on", VKMOE_IDP: "off" }, log: () => {}, ctx: CTX });
});
afterAll(async () => {
  for (const s of servers) await s.close();
  model?.[Symbol.dispose]();
});

function serve(parallel: number): RunningServer {
  const server = startServer(model, { port: 0, ctx: CTX, modelName: "tiny35", parallel });
  servers.push(server);
  return server;
}

const health = async (server: RunningServer) => (await fetch(`${server.url}/health`)).json() as Promise<any>;

/** A /v1/completions of token ids, greedy, streamed or not: its text. */
async function complete(server: RunningServer, prompt: number[], maxTokens: number, stream = true): Promise<string> {
  const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream }) });
  expect(r.status).toBe(200);
  if (!stream) return ((await r.json()) as any).choices[0].text as string;
  const events = (await r.text()).split("\n\n").filter(Boolean);
  expect(events.at(-1)).toBe("data: [DONE]");
  return events.slice(0, -1).map((e) => JSON.parse(e.slice("data: ".length))).map((c) => {
    if (c.error) throw new Error(c.error.message);
    return c.choices[0].text as string;
  }).join("");
}

it("4 concurrent streams on Qwen3.5: one replay a round (device-batch), each text equals the request alone; fewer decode and prompt calls than steps and requests", async () => {
  expect(model.device.mode).toBe("resident");
  const server = serve(4);
  expect(await health(server)).toMatchObject({ stepper: "batched", batch: "device-batch" });
  const prompts = [" one two", " the sky", " a cat", " red fox"].map((w) => model.tokenizer.encode(w, { addBos: false }).slice(0, 2));
  expect(new Set(prompts.map((p) => p.join())).size).toBe(4);
  const N = 4;
  const lone: string[] = [];
  for (const p of prompts) lone.push(await complete(server, p, N));
  const before = await metricsOf(server.url);
  const together = await Promise.all(prompts.map((p) => complete(server, p, N)));
  const after = await metricsOf(server.url);
  expect(together).toEqual(lone);
  const grew = (name: string) => after.get(name)! - before.get(name)!;
  const calls = grew("vkmoe_decode_calls_total"), steps = grew("vkmoe_decode_sequence_steps_total"), tokens = grew("vkmoe_completion_tokens_total");
  const prefillCalls = grew("vkmoe_prefill_calls_total");
  expect(tokens).toBe(4 * N);
  expect(steps).toBe(tokens - 4);
  expect(calls).toBeLessThan(steps);
  expect(prefillCalls).toBeLessThan(4);
  expect(after.get("vkmoe_decode_sequences_per_call")).toBeGreaterThan(1);
  console.log(`  qwen3.5 batched: ${tokens} tokens of 4 streams, ${steps} sequence steps in ${calls} decode calls, 4 prompts in ${prefillCalls} prompt calls`);
  expect(model.takeValidationMessages()).toEqual([]);
}, T);

it("a slot's prefix reused on Qwen3.5 (its states reset, the kept tokens run again): the same text as a fresh server", async () => {
  const server = serve(2);
  const first = model.tokenizer.encode(" The sky is", { addBos: false });
  const reply = await complete(server, first, 3, false);
  expect(reply.length).toBeGreaterThan(0);
  // the slot holds first + the reply; the next prompt shares only its first 2 tokens: the slot keeps 2 of them
  const second = [...first.slice(0, 2), ...model.tokenizer.encode(" ocean was blue", { addBos: false })];
  const before = await metricsOf(server.url);
  const text = await complete(server, second, 3, false);
  const after = await metricsOf(server.url);
  expect(after.get("vkmoe_prompt_tokens_reused_total")! - before.get("vkmoe_prompt_tokens_reused_total")!).toBe(2);
  const fresh = serve(1);
  expect(await complete(fresh, second, 3, false)).toBe(text);
  expect(model.takeValidationMessages()).toEqual([]);
}, T);
