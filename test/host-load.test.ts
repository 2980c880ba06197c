/**
 * A bounded load test of the server (`bun run serve` as a child process, over the tiny Q8_0
 * fixture on Lavapipe): 60 streamed chat requests fired at a fixed rate (one every 50 ms, 3 s) at
 * 2 slots and a queue of 4, with plain fetch (scripts/lib/chat-load.ts), in two identical waves
 * after a shorter warm-up one. The server runs apart so that its busy loop cannot stretch the
 * client's timers (in one process the rate would not hold) and so that RSS is the server's own.
 * Each request either completes (its stream ends with data: [DONE], finish_reason and usage
 * present) or gets the documented 429 with a Retry-After of whole seconds; nothing else.
 * Afterwards nothing is queued or active, the slots hold at most their 2 sessions, /metrics counts
 * what the clients saw, memory is flat (the server's RSS after the second wave within
 * RSS_TOLERANCE of after the first), and SIGTERM still closes it cleanly.
 *
 * The tolerance, 6 MiB: one of this model's sessions is about 1 MB (151936 f32 logits, 600 kB,
 * plus a 256-token KV cache, 390 kB) and each wave accepts 15 to 25 requests here, so a leak of
 * anything of logits size per request (a session, its logits, a Sequence holding them) grows RSS
 * by 9 MB or more a wave: keeping one 600 kB array per finished request moved it by 11.3 MiB and
 * failed. Without a leak the server's RSS moved by 1.1 to 1.5 MiB between the waves over six runs
 * (a heap not collected on demand, allocator arenas): 6 MiB is four times that noise and half the
 * smallest leak it must see.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { runWave, type ChatOutcome } from "../scripts/lib/chat-load.ts";
import { eventually, metricsOf, modelPath } from "./support/host.ts";
import { repoRoot } from "./support/paths.ts";

const REQUESTS = 60;
const INTERVAL_MS = 50;
const SLOTS = 2;
const QUEUE = 4;
const MAX_TOKENS = 4;
const RSS_TOLERANCE = 6 * 2 ** 20;
const PROMPTS = ["one", "two words", "three little words", "why?", "the sky", "tell me more"];

let child: ReturnType<typeof Bun.spawn> | undefined;
let url = "";

/** Starts `bun run serve` and waits for the line that names its URL. */
async function startChild(): Promise<void> {
  child = Bun.spawn({
    cmd: [process.execPath, `${repoRoot}scripts/serve.ts`, "--model", modelPath!, "--port", "0", "--ctx", "256", "--parallel", String(SLOTS), "--queue", String(QUEUE), "--timeout", "60", "--model-name", "tiny"],
    stdout: "ignore",
    stderr: "pipe",
    env: { ...process.env, VKMOE_API_KEY: "" },
  });
  const reader = (child.stderr as ReadableStream<Uint8Array>).getReader();
  let err = "";
  while (!/serve: http:\/\/\S+/.test(err)) {
    const { done, value } = await reader.read();
    if (done) throw new Error(`the server exited before listening: ${err}`);
    err += new TextDecoder().decode(value);
  }
  url = /serve: (http:\/\/\S+)/.exec(err)![1]!;
  reader.releaseLock();
}

beforeAll(async () => {
  if (modelPath) await startChild();
});
afterAll(() => {
  if (child && child.exitCode === null) child.kill("SIGKILL");
});

const it = modelPath ? test : test.skip;

function wave(requests = REQUESTS): Promise<{ outcomes: ChatOutcome[]; wallMs: number }> {
  return runWave(requests, (i) => ({ url, content: PROMPTS[i % PROMPTS.length]!, maxTokens: MAX_TOKENS }), INTERVAL_MS);
}

/** The server's resident memory (Linux: /proc; NaN elsewhere), once every request of the wave has ended. */
async function serverRss(): Promise<number> {
  await settled();
  if (!existsSync(`/proc/${child!.pid}/status`)) return NaN;
  const kb = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${child!.pid}/status`, "utf8"))?.[1];
  return Number(kb) * 1024;
}

/** Nothing queued or active on the server (its own gauges). */
async function settled(): Promise<boolean> {
  return eventually(async () => {
    const m = await metricsOf(url);
    return m.get("vkmoe_active_sequences") === 0 && m.get("vkmoe_queue_depth") === 0;
  }, 5000);
}

/** Every outcome is an answer or a documented 429; returns how many of each. */
function check(outcomes: ChatOutcome[]): { ok: number; busy: number } {
  const errors = outcomes.filter((o) => o.kind === "error");
  expect(errors).toEqual([]);
  let ok = 0, busy = 0;
  for (const o of outcomes) {
    if (o.kind === "ok") {
      ok++;
      expect(o.finishReason === "length" || o.finishReason === "stop").toBe(true);
      expect(o.completionTokens).toBeGreaterThanOrEqual(1);
      expect(o.completionTokens).toBeLessThanOrEqual(MAX_TOKENS);
    } else if (o.kind === "busy") {
      busy++;
      expect(o.retryAfter).toMatch(/^[1-9]\d*$/);
    }
  }
  return { ok, busy };
}

it(`${REQUESTS} requests at ${1000 / INTERVAL_MS}/s against ${SLOTS} slots and a queue of ${QUEUE}, twice: only answers and 429s with Retry-After, all accepted complete, memory flat, then a clean SIGTERM`, async () => {
  const t0 = performance.now();
  // a warm-up wave: sessions open, the runtime's JIT and heap settle
  check((await wave(REQUESTS / 2)).outcomes);
  await settled();
  const before = await metricsOf(url);
  const first = await wave();
  const a = check(first.outcomes);
  const rss1 = await serverRss();
  const second = await wave();
  const b = check(second.outcomes);
  const rss2 = await serverRss();
  const after = await metricsOf(url);
  console.log(`load: wave 1 ${a.ok} answered, ${a.busy} 429s in ${(first.wallMs / 1000).toFixed(1)} s; wave 2 ${b.ok} answered, ${b.busy} 429s in ${(second.wallMs / 1000).toFixed(1)} s; RSS ${(rss1 / 2 ** 20).toFixed(1)} -> ${(rss2 / 2 ** 20).toFixed(1)} MiB; ${((performance.now() - t0) / 1000).toFixed(1)} s in all`);
  // at least the slots and the queue take requests each wave
  expect(a.ok).toBeGreaterThanOrEqual(SLOTS + QUEUE);
  expect(b.ok).toBeGreaterThanOrEqual(SLOTS + QUEUE);
  // the server counted what the clients saw, and nothing is left running
  const count = (status: number) => (after.get(`vkmoe_requests_total{route="/v1/chat/completions",status="${status}"}`) ?? 0) - (before.get(`vkmoe_requests_total{route="/v1/chat/completions",status="${status}"}`) ?? 0);
  expect({ ok: count(200), busy: count(429) }).toEqual({ ok: a.ok + b.ok, busy: a.busy + b.busy });
  expect(await settled()).toBe(true);
  expect(after.get("vkmoe_sessions_open")).toBeLessThanOrEqual(SLOTS);
  expect(after.get("vkmoe_stream_errors_total")).toBe(0);
  if (!Number.isNaN(rss1)) expect(Math.abs(rss2 - rss1)).toBeLessThanOrEqual(RSS_TOLERANCE);
  child!.kill("SIGTERM");
  expect(await child!.exited).toBe(0);
}, 60_000);
