/**
 * The host under faults and limits: the engine throwing for one request (in its prefill or at a
 * decode step, streamed or not) fails that request alone, with a JSON error or a final SSE error
 * event, while the others go on; the per-request time limit; a full queue's 429 with Retry-After;
 * shutting down with a stream open; every session opened is disposed. And the start-up rules:
 * a non-loopback bind without a key refuses to start (in-process and as `bun run serve`), and
 * VKMOE_API_KEY is honoured by the script.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { VkmoeError } from "../src/errors.ts";
import { promptIds, type Model } from "../src/engine/index.ts";
import { HostConfigError, startServer, type ReusableSession, type RunningServer } from "../src/host/index.ts";
import { engineReply, eventually, loadHostModel, metricsOf, modelPath } from "./support/host.ts";
import { repoRoot } from "./support/paths.ts";

const CTX = 200;
const T = 30_000;
let model: Model;

/**
 * What a session does wrong: throw at its prefill, or at its n-th decode step. `prompt` picks the
 * session by its prompt's ids, held and prefilled together (concurrent requests take sessions in
 * no fixed order); without it, the next session that prefills.
 */
let nextFault: { at: "prefill" | number; error: () => Error; prompt?: number[] } | undefined;
const counts = { opened: 0, disposed: 0 };

function faultySession(ctx: number): ReusableSession {
  const s = model.session({ ctx });
  counts.opened++;
  let fault: typeof nextFault;
  let steps = 0;
  const check = (at: "prefill" | "step") => {
    if (!fault) return;
    if (at === "prefill" ? fault.at === "prefill" : ++steps === fault.at) throw fault.error();
  };
  return {
    get ctx() { return s.ctx; },
    get length() { return s.length; },
    get tokens() { return s.tokens; },
    truncate: (keep) => s.truncate(keep),
    prefill: (ids) => {
      if (nextFault && (!nextFault.prompt || JSON.stringify([...s.tokens, ...Array.from(ids)]) === JSON.stringify(nextFault.prompt))) {
        fault = nextFault;
        nextFault = undefined;
      }
      check("prefill");
      return s.prefill(ids);
    },
    step: (id) => (check("step"), s.step(id)),
    stepGreedy: (id) => (check("step"), s.stepGreedy(id)),
    [Symbol.dispose]: () => {
      counts.disposed++;
      s[Symbol.dispose]();
    },
  };
}

const servers: RunningServer[] = [];
function serve(extra: Parameters<typeof startServer>[1] = {}): { server: RunningServer; client: OpenAI } {
  const server = startServer(model, { port: 0, ctx: CTX, modelName: "tiny", ...extra }, { openSession: faultySession });
  servers.push(server);
  return { server, client: new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0, timeout: 20_000 }) };
}

beforeAll(async () => {
  if (modelPath) model = await loadHostModel();
});
afterAll(async () => {
  for (const s of servers) await s.close();
  model?.[Symbol.dispose]();
});

const it = modelPath ? test : test.skip;
const deviceLost = () => new VkmoeError("DEVICE_LOST", "device lost (simulated)");

async function streamText(client: OpenAI, content: string, maxTokens: number): Promise<string> {
  const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content }], max_tokens: maxTokens, temperature: 0, stream: true });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content ?? "";
  return text;
}

it("the engine throwing mid-stream ends that stream with an SSE error event; a concurrent stream is untouched", async () => {
  const { server, client } = serve();
  const before = await metricsOf(server.url);
  nextFault = { at: 2, error: deviceLost, prompt: promptIds(model, "first") };
  const failing = streamText(client, "first", 8).then(() => undefined, (e: unknown) => e);
  const healthy = streamText(client, "second", 6);
  const [error, text] = await Promise.all([failing, healthy]);
  expect(error).toBeInstanceOf(OpenAI.APIError);
  expect(String((error as Error).message)).toContain("the engine failed: device lost (simulated)");
  expect(text).toBe(engineReply(model, "second", { maxTokens: 6, ctx: CTX }).text);
  const after = await metricsOf(server.url);
  expect(after.get("vkmoe_stream_errors_total")! - before.get("vkmoe_stream_errors_total")!).toBe(1);
  expect(after.get("vkmoe_active_sequences")).toBe(0);
}, T);

it("the engine throwing for a whole reply: 503 for an engine error, 500 for anything else, at prefill or a step; then it still serves", async () => {
  const { server } = serve();
  const ask = () => fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 4, temperature: 0 }) });
  nextFault = { at: 1, error: deviceLost };
  let r = await ask();
  expect(r.status).toBe(503);
  expect((await r.json() as any).error).toMatchObject({ type: "service_unavailable_error", code: "device_lost" });
  nextFault = { at: "prefill", error: () => new Error("boom") };
  r = await ask();
  expect(r.status).toBe(500);
  const body = await r.json() as any;
  expect(body.error).toMatchObject({ type: "server_error", message: "internal error: boom" });
  expect(JSON.stringify(body)).not.toContain("    at "); // no stack trace
  r = await ask();
  expect(r.status).toBe(200);
  expect((await r.json() as any).choices[0].finish_reason).toBe("length");
}, T);

it("a request past the time limit ends with a 503 timeout (whole) or an error event (streamed) and frees its slot", async () => {
  const { server, client } = serve({ timeoutSeconds: 0.5 });
  const t0 = performance.now();
  const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 150, temperature: 0 }) });
  expect(r.status).toBe(503);
  expect((await r.json() as any).error.code).toBe("timeout");
  expect(performance.now() - t0).toBeLessThan(5000);
  const error = await streamText(client, "y", 150).then(() => undefined, (e: unknown) => e);
  expect(String((error as Error).message)).toContain("time limit");
  const m = await metricsOf(server.url);
  expect(m.get("vkmoe_request_timeouts_total")).toBe(2);
  expect(m.get("vkmoe_active_sequences")).toBe(0);
}, T);

it("a full queue answers 429 with Retry-After; cancelling the running request lets the waiting one run", async () => {
  const { server, client } = serve({ parallel: 1, queue: 1 });
  const running = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "a" }], max_tokens: 150, temperature: 0, stream: true });
  const runningChunks = running[Symbol.asyncIterator]();
  await runningChunks.next();
  const waiting = streamText(client, "b", 3);
  expect(await eventually(async () => server.host.scheduler.stats().queued === 1, 3000)).toBe(true);
  const r = await fetch(`${server.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ messages: [{ role: "user", content: "c" }], max_tokens: 1 }) });
  expect(r.status).toBe(429);
  expect(Number(r.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
  expect((await r.json() as any).error).toMatchObject({ type: "rate_limit_error", code: "queue_full" });
  await runningChunks.return!(); // disconnect
  expect(await waiting).toBe(engineReply(model, "b", { maxTokens: 3, ctx: CTX }).text);
}, T);

it("closing the server ends an open stream with an error event and disposes every session it opened", async () => {
  const { server, client } = serve();
  // the other servers' slots keep their sessions until those close: count this one's
  const before = { ...counts };
  const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "a" }], max_tokens: 150, temperature: 0, stream: true });
  const it = stream[Symbol.asyncIterator]();
  await it.next();
  const rest = (async () => {
    for (let r = await it.next(); !r.done; r = await it.next());
  })().then(() => undefined, (e: unknown) => e);
  await server.close();
  expect(String(((await rest) as Error)?.message)).toContain("shutting down");
  expect(counts.opened - before.opened).toBeGreaterThan(0);
  expect(counts.disposed - before.disposed).toBe(counts.opened - before.opened);
}, T);

it("a non-loopback bind without an API key refuses to start: in-process, and `bun run serve` in one line before loading", async () => {
  expect(() => startServer(model, { host: "0.0.0.0", port: 0, ctx: CTX })).toThrow(HostConfigError);
  expect(() => startServer(model, { host: "0.0.0.0", port: 0, ctx: CTX })).toThrow(/refusing to listen on 0\.0\.0\.0 without an API key/);
  const child = Bun.spawn({ cmd: [`${repoRoot}node_modules/.bin/bun`, `${repoRoot}scripts/serve.ts`, "--model", modelPath!, "--host", "0.0.0.0"], stdout: "pipe", stderr: "pipe", env: { ...process.env, VKMOE_API_KEY: "" } });
  const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
  const [stdout, stderr] = await Promise.all([new Response(child.stdout).text(), new Response(child.stderr).text()]);
  await child.exited;
  clearTimeout(timer);
  expect(child.exitCode).toBe(1);
  expect(stdout).toBe("");
  expect(stderr.split("\n").filter(Boolean)).toEqual(["serve: refusing to listen on 0.0.0.0 without an API key: a non-loopback address needs --api-key KEY or VKMOE_API_KEY (or bind 127.0.0.1)"]);
}, T);

it("`bun run serve` starts with VKMOE_API_KEY from the environment, prints its URL in one line, and checks the key", async () => {
  const child = Bun.spawn({ cmd: [`${repoRoot}node_modules/.bin/bun`, `${repoRoot}scripts/serve.ts`, "--model", modelPath!, "--port", "0", "--ctx", "128", "--model-name", "tiny"], stdout: "pipe", stderr: "pipe", env: { ...process.env, VKMOE_API_KEY: "env-key-12345" } });
  const timer = setTimeout(() => child.kill("SIGKILL"), 25_000);
  try {
    const reader = child.stderr.getReader();
    let err = "";
    while (!/serve: (http:\S+)/.test(err)) {
      const { done, value } = await reader.read();
      if (done) break;
      err += new TextDecoder().decode(value);
    }
    const url = /serve: (http:\/\/\S+)/.exec(err)?.[1];
    expect(url, err).toBeDefined();
    expect(err).toContain("API key required");
    const ask = (key?: string) => fetch(`${url}/v1/models`, { headers: key ? { Authorization: `Bearer ${key}` } : {} });
    expect((await ask()).status).toBe(401);
    expect((await ask("env-key-12345")).status).toBe(200);
  } finally {
    child.kill("SIGTERM");
    await child.exited;
    clearTimeout(timer);
  }
  expect(child.exitCode).toBe(0); // SIGTERM closes it cleanly
}, T);
