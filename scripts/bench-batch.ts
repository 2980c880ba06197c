// Sequences decoding together (Model.batch, a server's continuous batching): for each --batch N,
// N sequences each prefilled with a --prompt token prompt, then --gen greedy steps of all N at
// once; prints the aggregate tok/s, the ms a step and the ratio to one sequence, measured in one
// run. Where the model runs resident a step is one replay for all N; elsewhere N sessions in turn.
//   bun scripts/bench-batch.ts --model FILE [--batch 1,4,16,64] [--prompt 64] [--gen 32]
import { parseArgs } from "node:util";
import { z } from "zod";
import { Model } from "../src/model/model.ts";
import { peakRssBytes } from "../src/engine/memory.ts";
import { args, fail, oneLine } from "./lib/cli.ts";

const SCRIPT = "bench-batch";
const USAGE = "usage: bun scripts/bench-batch.ts --model FILE|DIR [--batch 1,4,16,64] [--prompt N] [--gen N]";
let flags: { model: string; batch: number[]; prompt: number; gen: number };
try {
  const { values } = parseArgs({ args: args(), options: { model: { type: "string" }, batch: { type: "string" }, prompt: { type: "string" }, gen: { type: "string" } }, strict: true, allowPositionals: false });
  const sizes = z.string().regex(/^\d+(,\d+)*$/, "must be a comma-separated list of integers").transform((s) => s.split(",").map(Number)).pipe(z.array(z.number().int().min(1).max(64, "at most 64 (one replay's tokens)")));
  const count = z.coerce.number().int().min(1);
  const parsed = z.object({ model: z.string().min(1), batch: sizes.default([1, 4, 16, 64]), prompt: count.default(64), gen: count.default(32) }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}

let model: Model;
try {
  model = await Model.load(flags.model, { log: (l) => console.error(l) });
} catch (e) {
  fail(SCRIPT, oneLine(e));
}
const V = model.config.vocab;
const argmax = (x: Float32Array) => {
  let b = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[b]!) b = i;
  return b;
};
console.log(`${model.device.mode}: ${model.device.why}`);
console.log(`| sequences | path | ms a step | aggregate tok/s | ÷ one sequence |`);
console.log(`|---:|---|---:|---:|---:|`);
let single = 0;
for (const N of flags.batch) {
  using batch = model.batch({ slots: N, ctx: flags.prompt + flags.gen + 8 });
  const next: number[] = [];
  for (let s = 0; s < N; s++) {
    const prompt = Array.from({ length: flags.prompt }, (_, i) => (s * 7919 + i * 104729 + 13) % V);
    next.push(argmax(batch.prefill(s, prompt)));
  }
  const stepAll = () => batch.step(next.map((id, slot) => ({ slot, id }))).forEach((row, slot) => (next[slot] = argmax(row)));
  stepAll(); // recording and first touch, untimed
  const t0 = performance.now();
  for (let g = 1; g < flags.gen; g++) stepAll();
  const ms = (performance.now() - t0) / Math.max(1, flags.gen - 1);
  const tokS = (1000 * N) / ms;
  if (N === flags.batch[0]) single = tokS / N;
  console.log(`| ${N} | ${batch.path} | ${ms.toFixed(2)} | ${tokS.toFixed(1)} | ${(tokS / single).toFixed(2)}x |`);
}
const rss = peakRssBytes();
console.log(`${rss === undefined ? "" : `peak RSS ${(rss / 2 ** 20).toFixed(0)} MiB; `}the ratio is against the first --batch size's tok/s per sequence`);
model[Symbol.dispose]();
