/**
 * The host as an OpenAI client meets it (the official `openai` npm client against a server started
 * in-process on 127.0.0.1, port 0, over the tiny Q8_0 fixture on Lavapipe): chat and completions,
 * whole and streamed, stop strings, max_tokens, usage, seeds, logprobs, thinking's template switch,
 * greedy replies equal to the engine's generate(), 8 concurrent streams each equal to its reply
 * alone, a disconnect freeing its slot, and bad input answered with the right status while the
 * server goes on serving.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import type { Model } from "../src/engine/index.ts";
import { promptIds } from "../src/engine/index.ts";
import { startServer, type RunningServer } from "../src/host/index.ts";
import { engineReply, eventually, loadHostModel, metricsOf, modelPath } from "./support/host.ts";

const KEY = "sk-test-0123456789";
const CTX = 160;
const T = 30_000;

let model: Model;
let server: RunningServer;
let client: OpenAI;

beforeAll(async () => {
  if (!modelPath) return;
  model = await loadHostModel();
  server = startServer(model, { port: 0, apiKey: KEY, ctx: CTX, parallel: 4, maxBodyBytes: 64 * 1024, modelName: "tiny" });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 20_000 });
});

afterAll(async () => {
  await server?.close();
  model?.[Symbol.dispose]();
});

const it = modelPath ? test : test.skip;

async function post(path: string, body: string | object, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${server.url}${path}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${KEY}`, ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** The server still answers a small request after whatever came before. */
async function stillServes(): Promise<void> {
  const r = await client.completions.create({ model: "tiny", prompt: "ok", max_tokens: 1, temperature: 0 });
  expect(r.choices[0]!.finish_reason).toBe("length");
}

it("chat, non-streaming: the engine's greedy reply, finish_reason length, usage", async () => {
  const want = engineReply(model, "Hello", { maxTokens: 6, ctx: CTX });
  const r = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 6, temperature: 0 });
  expect(r.object).toBe("chat.completion");
  expect(r.choices[0]!.message.content).toBe(want.text);
  expect(r.choices[0]!.finish_reason).toBe("length");
  expect(r.usage).toEqual({ prompt_tokens: want.promptIds.length, completion_tokens: 6, total_tokens: want.promptIds.length + 6 });
}, T);

it("chat, streaming: chunks add up to the whole reply; include_usage ends with a usage chunk; [DONE] last", async () => {
  const want = engineReply(model, "Tell me", { maxTokens: 6, ctx: CTX });
  const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Tell me" }], max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = "";
  const finishes: (string | null)[] = [];
  let usage: OpenAI.CompletionUsage | null | undefined;
  let roleSeen = false;
  for await (const chunk of stream) {
    expect(chunk.object).toBe("chat.completion.chunk");
    if (chunk.choices.length === 0) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role === "assistant") roleSeen = true;
      text += c.delta.content ?? "";
      finishes.push(c.finish_reason);
    }
  }
  expect(roleSeen).toBe(true);
  expect(text).toBe(want.text);
  expect(finishes.filter((f) => f !== null)).toEqual(["length"]);
  expect(usage).toEqual({ prompt_tokens: want.promptIds.length, completion_tokens: 6, total_tokens: want.promptIds.length + 6 });
  // the raw stream ends with data: [DONE]
  const raw = await (await post("/v1/chat/completions", { messages: [{ role: "user", content: "x" }], max_tokens: 2, temperature: 0, stream: true })).text();
  expect(raw.trimEnd().endsWith("data: [DONE]")).toBe(true);
}, T);

it("completions, whole and streamed: the engine's greedy text for the raw prompt", async () => {
  const want = engineReply(model, "The sky is", { raw: true, maxTokens: 5, ctx: CTX });
  const r = await client.completions.create({ model: "tiny", prompt: "The sky is", max_tokens: 5, temperature: 0 });
  expect(r.object).toBe("text_completion");
  expect(r.choices[0]!.text).toBe(want.text);
  expect(r.usage).toEqual({ prompt_tokens: want.promptIds.length, completion_tokens: 5, total_tokens: want.promptIds.length + 5 });
  const stream = await client.completions.create({ model: "tiny", prompt: "The sky is", max_tokens: 5, temperature: 0, stream: true });
  let text = "";
  let finish: string | null = null;
  for await (const chunk of stream) for (const c of chunk.choices) {
    text += c.text;
    finish = c.finish_reason ?? finish;
  }
  expect(text).toBe(want.text);
  expect(finish).toBe("length");
  // token ids as the prompt give the same text
  const byIds = await client.completions.create({ model: "tiny", prompt: want.promptIds, max_tokens: 5, temperature: 0 });
  expect(byIds.choices[0]!.text).toBe(want.text);
}, T);

it("stop strings (a string and an array): the text before the stop, finish_reason stop, streamed too", async () => {
  const full = engineReply(model, "Once upon", { raw: true, maxTokens: 10, ctx: CTX }).text;
  const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 2);
  const expected = full.slice(0, full.indexOf(stop));
  const want = engineReply(model, "Once upon", { raw: true, maxTokens: 10, ctx: CTX, stop: [stop] });
  expect(want.text).toBe(expected);
  const r = await client.completions.create({ model: "tiny", prompt: "Once upon", max_tokens: 10, temperature: 0, stop });
  expect(r.choices[0]!.text).toBe(expected);
  expect(r.choices[0]!.finish_reason).toBe("stop");
  const stream = await client.completions.create({ model: "tiny", prompt: "Once upon", max_tokens: 10, temperature: 0, stop: ["\u0000never", stop], stream: true });
  let text = "";
  let finish: string | null = null;
  for await (const chunk of stream) for (const c of chunk.choices) {
    text += c.text;
    finish = c.finish_reason ?? finish;
  }
  expect(text).toBe(expected);
  expect(finish).toBe("stop");
}, T);

it("seed: the same seed at temperature 0.9 gives the same text, another seed another", async () => {
  const ask = (seed: number) => client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Pick" }], max_tokens: 8, temperature: 0.9, top_p: 0.95, seed });
  const [a, b, c] = [await ask(7), await ask(7), await ask(8)];
  expect(a.choices[0]!.message.content).toBe(b.choices[0]!.message.content!);
  expect(c.choices[0]!.message.content).not.toBe(a.choices[0]!.message.content!);
  const want = engineReply(model, "Pick", { maxTokens: 8, ctx: CTX, sampling: { temperature: 0.9, topP: 0.95, seed: 7 } });
  expect(a.choices[0]!.message.content).toBe(want.text);
}, T);

it("logprobs: one entry per token, top_logprobs alternatives, the chosen token's logprob listed first when greedy", async () => {
  const r = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = r.choices[0]!.logprobs!.content!;
  expect(content.length).toBe(3);
  for (const e of content) {
    expect(e.top_logprobs.length).toBe(2);
    expect(e.logprob).toBeLessThanOrEqual(0);
    expect(e.top_logprobs[0]!.logprob).toBeCloseTo(e.logprob, 9);
    expect(e.top_logprobs[0]!.token).toBe(e.token);
  }
  expect(content.map((e) => e.token).join("")).toBe(r.choices[0]!.message.content!);
}, T);

it("chat_template_kwargs.enable_thinking goes to the template (Qwen3's empty think block when false)", async () => {
  const on = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 1, temperature: 0 });
  const off = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 1, temperature: 0, chat_template_kwargs: { enable_thinking: false } } as any);
  expect(on.usage!.prompt_tokens).toBe(promptIds(model, "Hi").length);
  expect(off.usage!.prompt_tokens).toBe(promptIds(model, "Hi", { enableThinking: false }).length);
  expect(off.usage!.prompt_tokens).toBeGreaterThan(on.usage!.prompt_tokens);
  // system and earlier turns go through the template too
  const sys = await client.chat.completions.create({ model: "tiny", messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "a" }, { role: "assistant", content: "b" }, { role: "user", content: "c" }], max_tokens: 1, temperature: 0 });
  expect(sys.usage!.prompt_tokens).toBe(promptIds(model, "c", { system: "Be brief." }, [{ role: "user", content: "a" }, { role: "assistant", content: "b" }]).length);
}, T);

it("8 concurrent greedy streams, different prompts, 4 slots: each gets exactly its reply alone", async () => {
  const prompts = ["one", "two words", "three little words", "4", "five?", "six six", "seven.", "eight is last"];
  const alone = prompts.map((p) => engineReply(model, p, { maxTokens: 6, ctx: CTX }).text);
  const peak = { active: 0, queued: 0 };
  const sampler = setInterval(() => {
    const st = server.host.scheduler.stats();
    peak.active = Math.max(peak.active, st.active);
    peak.queued = Math.max(peak.queued, st.queued);
  }, 2);
  const texts = await Promise.all(prompts.map(async (p) => {
    const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: p }], max_tokens: 6, temperature: 0, stream: true });
    let text = "";
    for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content ?? "";
    return text;
  }));
  clearInterval(sampler);
  expect(texts).toEqual(alone);
  expect(peak.active).toBe(4);
  expect(peak.queued).toBeGreaterThan(0);
}, 60_000);

it("a client that disconnects mid-stream frees its slot at once (metrics: active 0, cancelled +1)", async () => {
  const before = await metricsOf(server.url, KEY);
  const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "long" }], max_tokens: 120, temperature: 0, stream: true });
  let chunks = 0;
  for await (const _ of stream) if (++chunks === 3) break; // break aborts the client's fetch
  const freed = await eventually(async () => {
    const m = await metricsOf(server.url, KEY);
    return m.get("vkmoe_active_sequences") === 0 && m.get("vkmoe_requests_cancelled_total") === before.get("vkmoe_requests_cancelled_total")! + 1;
  }, 3000);
  expect(freed).toBe(true);
  const after = await metricsOf(server.url, KEY);
  // far fewer than 120 tokens were made for it
  expect(after.get("vkmoe_completion_tokens_total")! - before.get("vkmoe_completion_tokens_total")!).toBeLessThan(60);
  // a non-streamed request whose client gives up is cancelled too
  const abort = new AbortController();
  const pending = fetch(`${server.url}/v1/completions`, { method: "POST", signal: abort.signal, headers: { Authorization: `Bearer ${KEY}`, "Content-Type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 120, temperature: 0 }) });
  await eventually(async () => (await metricsOf(server.url, KEY)).get("vkmoe_active_sequences") === 1, 3000);
  abort.abort();
  await pending.catch(() => {});
  const freedAgain = await eventually(async () => {
    const m = await metricsOf(server.url, KEY);
    return m.get("vkmoe_active_sequences") === 0 && m.get("vkmoe_requests_cancelled_total") === before.get("vkmoe_requests_cancelled_total")! + 2;
  }, 3000);
  expect(freedAgain).toBe(true);
  await stillServes();
}, T);

/** An OpenAI error body with this status, type and (when given) param. */
async function expectError(r: Response, status: number, param?: string | null, messagePart?: string): Promise<void> {
  const body = await r.json() as any;
  expect({ status: r.status, param: param === undefined ? body.error?.param : body.error.param }).toEqual({ status, param: param === undefined ? body.error?.param : param });
  expect(typeof body.error.message).toBe("string");
  expect(typeof body.error.type).toBe("string");
  expect("code" in body.error).toBe(true);
  if (messagePart) expect(body.error.message).toContain(messagePart);
}

it("bad input: 413, 400 (JSON, types, unknown field, max_tokens, context, n, unsupported), 401, 404; still serves after each", async () => {
  const chat = (extra: object) => ({ model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 1, ...extra });
  await expectError(await post("/v1/chat/completions", { ...chat({}), pad: "x".repeat(70 * 1024) }), 413, null, "limit");
  await stillServes();
  await expectError(await post("/v1/chat/completions", '{"messages": [}'), 400, null, "parse");
  await expectError(await post("/v1/chat/completions", "[1, 2]"), 400, null, "JSON object");
  await expectError(await post("/v1/chat/completions", chat({ temperature: "hot" })), 400, "temperature");
  await expectError(await post("/v1/chat/completions", chat({ messages: [{ role: "user", content: 5 }] })), 400, "messages[0].content");
  await expectError(await post("/v1/chat/completions", chat({ messages: [] })), 400, "messages");
  await expectError(await post("/v1/chat/completions", { max_tokens: 1 }), 400, "messages", "required");
  await stillServes();
  await expectError(await post("/v1/chat/completions", chat({ frobnicate: true })), 400, "frobnicate", "Unrecognized request argument supplied: frobnicate");
  await expectError(await post("/v1/chat/completions", chat({ messages: [{ role: "user", content: "hi", path: "/etc/passwd" }] })), 400, "messages[0].path");
  await expectError(await post("/v1/completions", { prompt: "x", chat_template_kwargs: {} }), 400, "chat_template_kwargs");
  await expectError(await post("/v1/chat/completions", chat({ max_tokens: 1_000_000 })), 400, "max_tokens", "at most 160");
  await expectError(await post("/v1/chat/completions", chat({ messages: [{ role: "user", content: "word ".repeat(300) }] })), 400, "messages", "maximum context length is 160");
  await expectError(await post("/v1/completions", { prompt: "word ".repeat(300), max_tokens: 1 }), 400, "prompt", "maximum context length");
  await expectError(await post("/v1/chat/completions", chat({ n: 2 })), 400, "n");
  await expectError(await post("/v1/chat/completions", chat({ tools: [{ type: "function", function: { name: "f" } }] })), 400, "tools", "not supported yet");
  await expectError(await post("/v1/completions", { prompt: "x", echo: true }), 400, "echo", "not supported yet");
  await stillServes();
  await expectError(await post("/v1/chat/completions", chat({}), { Authorization: "" }), 401);
  await expectError(await post("/v1/chat/completions", chat({}), { Authorization: "Bearer wrong-key-123" }), 401);
  await expectError(await fetch(`${server.url}/metrics`), 401);
  expect((await fetch(`${server.url}/health`)).status).toBe(200); // health and the page need no key
  await expectError(await post("/v1/chat/completions", chat({ model: "gpt-4o" })), 404, "model");
  await expectError(await post("/v1/nothing", {}), 404);
  await stillServes();
  // the openai client sees them as its typed errors
  const typed = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 10_000 }).then(() => undefined, (e: unknown) => e);
  expect(typed).toBeInstanceOf(OpenAI.BadRequestError);
  expect((typed as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("max_tokens");
  const m = await metricsOf(server.url, KEY);
  expect(m.get('vkmoe_requests_total{route="/v1/chat/completions",status="413"}')).toBe(1);
  expect(m.get('vkmoe_requests_total{route="/v1/chat/completions",status="401"}')).toBe(2);
}, T);

it("GET /v1/models, /health (model, device, mode) and /metrics (Prometheus text)", async () => {
  const models = await client.models.list();
  expect(models.data.map((m) => m.id)).toEqual(["tiny"]);
  const h = await (await fetch(`${server.url}/health`)).json() as any;
  expect(h).toMatchObject({ status: "ok", model: "tiny", mode: model.device.mode, device: model.device.why, slots: 4 });
  const text = await (await fetch(`${server.url}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } })).text();
  for (const name of ["vkmoe_requests_total", "vkmoe_prompt_tokens_total", "vkmoe_completion_tokens_total", "vkmoe_decode_tokens_per_second", "vkmoe_queue_depth", "vkmoe_active_sequences"]) {
    expect(text).toContain(`# TYPE ${name} `);
  }
  expect(text).toMatch(/^vkmoe_requests_total\{route="\/v1\/chat\/completions",status="200"\} \d+$/m);
}, T);
