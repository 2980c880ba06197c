// Where a decode token's GPU time goes on the whole-token path: one token recorded with a GPU
// timestamp after every op, after a prompt of --context tokens (and --warm untimed tokens), summed
// per op kind over the layers, as the median of --reps tokens. Untimed decode steps of a throwaway
// session for --warm-ms first (default 500) raise the GPU's clocks: an idle H100 runs at ~345 MHz,
// and a profile that starts at once read 2.4x its figures (2026-12-07). --tokens N
// profiles a prompt chunk of N tokens in one replay instead (prefill). --llama-bench PATH: then
// llama.cpp's own GPU time by op on the same file at the same depth (its Vulkan perf logger).
//
//   bun scripts/profile-graph.ts --model FILE.gguf [--context 512] [--reps 5] [--warm 64] [--warm-ms 500] [--tokens 1] [--llama-bench PATH]
import { existsSync } from "node:fs";
import { parseArgs } from "node:util";
import { z } from "zod";
import { CHUNK_MAX_TOKENS } from "../src/moe/routing.ts";
import { Model } from "../src/model/model.ts";
import { args, fail, oneLine } from "./lib/cli.ts";
import { runLlamaPerf } from "./lib/llama-perf.ts";

const SCRIPT = "profile-graph";
const USAGE = "usage: bun scripts/profile-graph.ts --model FILE.gguf|DIR [--context N] [--reps N] [--warm N] [--warm-ms N] [--tokens N] [--llama-bench PATH]";
const count = (min: number) => z.coerce.number().int().min(min);
let flags: { model: string; context: number; reps: number; warm: number; "warm-ms": number; tokens: number; "llama-bench"?: string | undefined };
try {
  const { values } = parseArgs({ args: args(), options: { model: { type: "string" }, context: { type: "string" }, reps: { type: "string" }, warm: { type: "string" }, "warm-ms": { type: "string" }, tokens: { type: "string" }, "llama-bench": { type: "string" } }, strict: true, allowPositionals: false });
  const parsed = z.object({ model: z.string().min(1), context: count(1).default(512), reps: count(1).default(5), warm: count(0).default(64), "warm-ms": count(0).max(60_000).default(500), tokens: count(1).max(CHUNK_MAX_TOKENS).default(1), "llama-bench": z.string().min(1).optional() }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}

const llamaBench = flags["llama-bench"];
if (llamaBench !== undefined && !existsSync(llamaBench)) fail(SCRIPT, `--llama-bench: no file ${llamaBench}`);

let loaded: Model;
try {
  loaded = await Model.load(flags.model, { log: (l) => console.error(l) });
} catch (e) {
  fail(SCRIPT, oneLine(e));
}
using model = loaded;
if (model.device.mode !== "resident") fail(SCRIPT, `the model runs ${model.device.mode} (${model.device.why}); the whole-token profile needs it resident`);
const V = model.config.vocab;
const ids = Array.from({ length: flags.context }, (_, i) => (i * 7919 + 13) % V);
{
  // the GPU's clocks up before anything is timed
  using warmup = model.session({ ctx: 64 });
  const until = performance.now() + flags["warm-ms"];
  for (let t = 1; performance.now() < until; ) {
    if (warmup.length >= 63) warmup.truncate(0);
    t = warmup.stepGreedy(t).id;
  }
}
using session = model.session({ ctx: flags.context + flags.warm + flags.reps * flags.tokens + 1 });
session.prefill(ids);
let id = 1;
for (let i = 0; i < flags.warm; i++) id = session.stepGreedy(id).id;
// per op kind: its µs in each profiled token, and how many times a token runs it
const runs = new Map<string, number[]>();
const perToken = new Map<string, number>();
const totals: number[] = [];
for (let r = 0; r < flags.reps; r++) {
  const chunk = Array.from({ length: flags.tokens }, (_, i) => (id * 31 + 7 * i) % V);
  const split = flags.tokens === 1 ? session.profileStep(id) : session.profileChunk(chunk);
  id = (id * 31 + 7) % V;
  const byOp = new Map<string, number>();
  for (const { op, us } of split) byOp.set(op, (byOp.get(op) ?? 0) + us);
  if (r === 0) for (const { op } of split) perToken.set(op, (perToken.get(op) ?? 0) + 1);
  for (const [op, us] of byOp) runs.set(op, [...(runs.get(op) ?? []), us]);
  totals.push(split.reduce((a, b) => a + b.us, 0));
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const total = median(totals);
console.log(model.device.why);
const what = flags.tokens === 1 ? "one decode token" : `a prompt chunk of ${flags.tokens} tokens (${(total / flags.tokens).toFixed(0)} µs a token)`;
console.log(`${what} at position ${flags.context + flags.warm}: ${total.toFixed(0)} µs of GPU time (median of ${flags.reps}); per op kind, summed over the layers:`);
console.log("| op | µs | share | µs each (runs per token) |");
console.log("|---|---:|---:|---:|");
for (const [op, samples] of runs) {
  const us = median(samples), n = perToken.get(op)!;
  console.log(`| ${op} | ${us.toFixed(0)} | ${((100 * us) / total).toFixed(1)}% | ${(us / n).toFixed(1)} (${n}) |`);
}

if (llamaBench !== undefined) {
  // the same depth as the profiled token: the prompt and the warm-up tokens before it
  const depth = flags.context + flags.warm;
  const peer = runLlamaPerf(llamaBench, flags.model, { depth, tokens: flags.tokens, log: (l) => console.error(l) });
  if (peer.error) fail(SCRIPT, `llama.cpp: ${peer.error}`);
  if (peer.warning) console.error(`${SCRIPT}: llama.cpp: ${peer.warning}`);
  console.log(`llama.cpp on the same file at depth ${depth}, ${flags.tokens === 1 ? "one decode token" : `a prompt of ${flags.tokens} tokens`}: ${peer.totalUs.toFixed(0)} µs of GPU time by its Vulkan perf logger (groups of nodes between its sync points; the logger's timestamps included):`);
  console.log("| llama.cpp group | runs | µs each | µs |");
  console.log("|---|---:|---:|---:|");
  for (const g of peer.groups) console.log(`| ${g.name} | ${g.count} | ${g.meanUs.toFixed(1)} | ${g.totalUs.toFixed(0)} |`);
  console.log(`GPU time, vkmoe / llama.cpp: ${(total / peer.totalUs).toFixed(2)}x (${total.toFixed(0)} / ${peer.totalUs.toFixed(0)} µs)`);
}
