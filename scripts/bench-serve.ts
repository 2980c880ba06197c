// `bun run bench:serve --model DIR|FILE.gguf [flags]`: the OpenAI-compatible server under concurrent
// streaming chat requests. Thin over the library: the server runs in-process on 127.0.0.1 (any
// free port; src/host's startServer), the load is plain fetch (scripts/lib/chat-load.ts). For each
// --concurrency N (default 1,4,16,64) it sends N requests at once, --rounds times in a row, each a
// fixed prompt (the i-th of a fixed list) at temperature 0 with --max-tokens, and prints one row:
// aggregate completion tok/s (tokens of the answered requests ÷ the level's wall time), median and
// p95 latency of the first content token and of the whole reply, 429s, other errors, and the
// prompt tokens prefilled and reused from the slots' sessions, and the decode rounds' sequences per
// model call (/metrics: > 1 where batching steps them together); then the peak RSS. The first
// line names the stepper (--batching on: batched where the model runs resident; off: round-robin).
// One warm-up request runs first (it opens a session and pages the weights in). Then, with our model
// freed, llama.cpp's llama-batched-bench on the same file when its binary is found (--llama-batched
// PATH; default /tmp/llama/llama-vk/llama-batched-bench; --no-llama skips it): the same parallel
// counts, prompts of our median prompt length, --max-tokens generated each, and the ratios.
//   bun scripts/bench-serve.ts --model FILE [--concurrency 1,4,16,64] [--rounds 2] [--max-tokens 8]
//     [--parallel 4] [--batching on|off] [--queue 32] [--ctx 512] [--quant auto|none|q8|q4]
//     [--llama-batched PATH | --no-llama] [--json FILE]
import { writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { Model, peakRssBytes, QUANT_CHOICES } from "../src/engine/index.ts";
import { VkmoeError } from "../src/errors.ts";
import { startServer, type RunningServer } from "../src/host/index.ts";
import { runWave, streamChat, type ChatOutcome } from "./lib/chat-load.ts";
import { args, exit, fail, oneLine, runtimeName, writeStderr } from "./lib/cli.ts";
import { findLlamaBatched, runLlamaBatched, type BatchedResult } from "./lib/llama-batched.ts";
import { formatBytes } from "./lib/progress.ts";
import { fmt, formatTable, median, percentile } from "./lib/table.ts";

const SCRIPT = "bench-serve";
const USAGE = "usage: bun scripts/bench-serve.ts --model DIR|FILE.gguf [--concurrency 1,4,16,64] [--rounds 2] [--max-tokens 8] [--parallel 4] [--batching on|off] [--queue 32] [--ctx 512] [--quant auto|none|q8|q4] [--llama-batched PATH | --no-llama] [--json FILE]";

/** Fixed prompts: request i asks PROMPTS[i % length] (runs are comparable; the chat template's opening is shared, as in real traffic). */
const PROMPTS = [
  "Write one sentence about the sea.",
  "What is the capital of France?",
  "List three prime numbers.",
  "Describe a cat in five words.",
  "Why is the sky blue?",
  "Say hello in Spanish.",
  "Name a famous painter.",
  "What does a compiler do?",
];

const options = {
  model: { type: "string", short: "m" },
  concurrency: { type: "string" },
  rounds: { type: "string" },
  "max-tokens": { type: "string" },
  parallel: { type: "string" },
  batching: { type: "string" },
  queue: { type: "string" },
  ctx: { type: "string" },
  quant: { type: "string" },
  "llama-batched": { type: "string" },
  "no-llama": { type: "boolean" },
  json: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

let raw: ReturnType<typeof parseArgs<{ options: typeof options; allowPositionals: false; strict: true }>>["values"];
try {
  raw = parseArgs({ args: args(), options, allowPositionals: false, strict: true }).values;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}
if (raw.help) {
  console.log(USAGE);
  exit(0);
}
const int = (min: number, max = 1_000_000) => z.string().trim().regex(/^\d+$/, "must be a non-negative integer").transform(Number).pipe(z.number().int().min(min, `must be at least ${min}`).max(max, `must be at most ${max}`));
const levels = z.string().trim().regex(/^\d+(,\d+)*$/, "must be a comma-separated list of integers, like 1,4,16").transform((s) => s.split(",").map(Number)).pipe(z.array(z.number().int().min(1, "each must be at least 1").max(4096, "each must be at most 4096")));
const flagsSchema = z.object({
  model: z.string({ error: "is required" }).min(1),
  concurrency: levels.default([1, 4, 16, 64]),
  rounds: int(1, 1000).default(2),
  "max-tokens": int(1).default(8),
  parallel: int(1, 256).default(4),
  batching: z.enum(["on", "off"]).default("on"),
  queue: int(0, 100_000).default(32),
  ctx: int(16).default(512),
  quant: z.enum(QUANT_CHOICES as [string, ...string[]]).default("auto"),
  "llama-batched": z.string().min(1, "needs a path").optional(),
  "no-llama": z.boolean().default(false),
  json: z.string().min(1, "needs a file name").optional(),
});
const parsed = flagsSchema.safeParse(raw);
if (!parsed.success) fail(SCRIPT, `${parsed.error.issues.map((i) => `--${i.path.join(".")} ${i.message}`).join("; ")}; ${USAGE}`);
const flags = parsed.data;
if (flags["no-llama"] && flags["llama-batched"]) fail(SCRIPT, "--no-llama and --llama-batched contradict each other");

interface LevelResult {
  concurrency: number;
  requests: number;
  ok: number;
  busy: number;
  errors: number;
  completionTokens: number;
  /** Median prompt tokens of the answered requests (chat template included). */
  promptTokens: number;
  wallSeconds: number;
  tokensPerSecond: number;
  firstTokenMs: { p50: number; p95: number };
  totalMs: { p50: number; p95: number };
  promptPrefilled: number;
  promptReused: number;
  decodeCalls: number;
  /** Sequences a decode model call advanced, on average (1 without batching). */
  sequencesPerCall: number;
  firstError?: string;
}

async function counters(server: RunningServer): Promise<{ prefilled: number; reused: number; decodeCalls: number; sequenceSteps: number }> {
  const text = server.host.metrics.render();
  const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
  return {
    prefilled: value("vkmoe_prompt_tokens_prefilled_total"),
    reused: value("vkmoe_prompt_tokens_reused_total"),
    decodeCalls: value("vkmoe_decode_calls_total"),
    sequenceSteps: value("vkmoe_decode_sequence_steps_total"),
  };
}

async function level(server: RunningServer, concurrency: number): Promise<LevelResult> {
  const before = await counters(server);
  const outcomes: ChatOutcome[] = [];
  let wallMs = 0;
  for (let round = 0; round < flags.rounds; round++) {
    const wave = await runWave(concurrency, (i) => ({ url: server.url, content: PROMPTS[(round * concurrency + i) % PROMPTS.length]!, maxTokens: flags["max-tokens"] }));
    outcomes.push(...wave.outcomes);
    wallMs += wave.wallMs;
  }
  const after = await counters(server);
  const ok = outcomes.filter((o): o is Extract<ChatOutcome, { kind: "ok" }> => o.kind === "ok");
  const errors = outcomes.filter((o): o is Extract<ChatOutcome, { kind: "error" }> => o.kind === "error");
  const completionTokens = ok.reduce((n, o) => n + o.completionTokens, 0);
  const first = ok.map((o) => o.firstTokenMs);
  const total = ok.map((o) => o.totalMs);
  return {
    concurrency,
    requests: outcomes.length,
    ok: ok.length,
    busy: outcomes.filter((o) => o.kind === "busy").length,
    errors: errors.length,
    completionTokens,
    promptTokens: median(ok.map((o) => o.promptTokens)),
    wallSeconds: wallMs / 1000,
    tokensPerSecond: completionTokens / (wallMs / 1000),
    firstTokenMs: { p50: median(first), p95: percentile(first, 95) },
    totalMs: { p50: median(total), p95: percentile(total, 95) },
    promptPrefilled: after.prefilled - before.prefilled,
    promptReused: after.reused - before.reused,
    decodeCalls: after.decodeCalls - before.decodeCalls,
    sequencesPerCall: (after.sequenceSteps - before.sequenceSteps) / Math.max(1, after.decodeCalls - before.decodeCalls),
    firstError: errors[0] && `${errors[0].status}: ${errors[0].message}`,
  };
}

async function main(): Promise<void> {
  const t0 = performance.now();
  const model = await Model.load(flags.model, { quant: flags.quant as any, ctx: flags.ctx, env: readConfig(), log: () => {} });
  const results: LevelResult[] = [];
  let stepper: string;
  const device = model.device;
  try {
    await using server = startServer(model, { port: 0, ctx: flags.ctx, parallel: flags.parallel, batching: flags.batching, queue: flags.queue, modelName: "bench" });
    stepper = server.host.scheduler.stats().stepper;
    writeStderr(`${SCRIPT}: ${runtimeName} · ${model.device.mode} (${model.device.why}) · ${server.url} · stepper ${stepper} · ${flags.parallel} slots, queue ${flags.queue}, ctx ${flags.ctx} · max_tokens ${flags["max-tokens"]}, ${flags.rounds} rounds a level\n`);
    const warm = await streamChat({ url: server.url, content: PROMPTS[0]!, maxTokens: flags["max-tokens"] });
    if (warm.kind !== "ok") fail(SCRIPT, `the warm-up request failed: ${JSON.stringify(warm)}`);
    for (const c of flags.concurrency) {
      const r = await level(server, c);
      results.push(r);
      writeStderr(`${SCRIPT}: concurrency ${c}: ${r.ok}/${r.requests} answered in ${fmt(r.wallSeconds)} s${r.firstError ? ` (first error: ${r.firstError})` : ""}\n`);
    }
  } finally {
    model[Symbol.dispose]();
  }
  const ms = (v: number) => fmt(v, 3);
  const rows = [
    ["concurrency", "requests", "ok", "429", "errors", "prompt tok", "completion tok/s", "first token p50 ms", "first token p95 ms", "total p50 ms", "total p95 ms", "prompt tok prefilled", "prompt tok reused", "decode calls", "seqs/call"],
    ...results.map((r) => [String(r.concurrency), String(r.requests), String(r.ok), String(r.busy), String(r.errors), String(r.promptTokens), fmt(r.tokensPerSecond), ms(r.firstTokenMs.p50), ms(r.firstTokenMs.p95), ms(r.totalMs.p50), ms(r.totalMs.p95), String(r.promptPrefilled), String(r.promptReused), String(r.decodeCalls), fmt(r.sequencesPerCall)]),
  ];
  console.log(`stepper: ${stepper!}`);
  console.log(formatTable(rows));
  const peak = peakRssBytes();
  console.log(`peak RSS ${peak === undefined ? "unknown" : formatBytes(peak)} · ${fmt((performance.now() - t0) / 1000)} s in all (load included)`);
  const llama = peer(results);
  if (llama) printPeer(results, llama);
  if (flags.json) writeFileSync(flags.json, `${JSON.stringify({ flags, stepper: stepper!, device, peakRssBytes: peak, results, llama }, null, 2)}\n`);
}

/** llama-batched-bench on the same file with the same parallel counts, or undefined (with the reason printed). */
function peer(results: LevelResult[]): BatchedResult | undefined {
  if (flags["no-llama"]) return undefined;
  const binary = findLlamaBatched(flags["llama-batched"]);
  if (!binary) {
    console.log(`llama.cpp: skipped, no llama-batched-bench at ${flags["llama-batched"] ?? "/tmp/llama/llama-vk/llama-batched-bench"} (../shared/tools/peer/README.md)`);
    return undefined;
  }
  if (!flags.model.endsWith(".gguf")) {
    console.log("llama.cpp: skipped, the model is not a GGUF file");
    return undefined;
  }
  const prompt = Math.max(1, Math.round(median(results.map((r) => r.promptTokens).filter((n) => n > 0))) || 16);
  return runLlamaBatched(binary, flags.model, { prompt, gen: flags["max-tokens"], parallel: flags.concurrency, log: (line) => writeStderr(`${SCRIPT}: ${line}\n`) });
}

function printPeer(results: LevelResult[], llama: BatchedResult): void {
  console.log(`llama.cpp: ${llama.command}${llama.device ? ` · ${llama.device}` : ""}`);
  if (llama.error) console.log(`llama.cpp: gave no figures: ${llama.error}`);
  const rows = [["concurrency", "ours completion tok/s", "llama completion tok/s", "ratio", "llama decode tok/s", "ours first token p50 ms", "llama prefill of all prompts ms"]];
  for (const r of results) {
    const l = llama.rows.find((x) => x.parallel === r.concurrency);
    rows.push([String(r.concurrency), fmt(r.tokensPerSecond), l ? fmt(l.completionTps) : "—", l ? `${fmt(r.tokensPerSecond / l.completionTps)}x` : "—", l ? fmt(l.decodeTps) : "—", fmt(r.firstTokenMs.p50, 3), l ? fmt(l.prefillSeconds * 1000, 3) : "—"]);
  }
  console.log("llama.cpp's completion tok/s: parallel x generated tokens over its prefill and decode time (no HTTP, no template, one shared batch); ours: the server's answered tokens over the level's wall time.");
  console.log(formatTable(rows));
}

try {
  await main();
} catch (e) {
  if (e instanceof VkmoeError) fail(SCRIPT, oneLine(e));
  fail(SCRIPT, `internal error: ${oneLine(e)}`);
}
