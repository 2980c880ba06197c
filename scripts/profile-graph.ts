// Where a decode token's GPU time goes on the whole-token path: one token recorded with a GPU
// timestamp after every op, after a prompt of --context tokens (and --warm untimed tokens to raise
// the clocks), summed per op kind over the layers, as the median of --reps tokens.
//
//   bun scripts/profile-graph.ts --model FILE.gguf [--context 512] [--reps 5] [--warm 64]
import { z } from "zod";
import { Model } from "../src/model/model.ts";

const flags = z.object({
  model: z.string().min(1),
  context: z.coerce.number().int().min(1).default(512),
  reps: z.coerce.number().int().min(1).default(5),
  warm: z.coerce.number().int().min(0).default(64),
}).parse(Object.fromEntries(process.argv.slice(2).reduce<[string, string][]>((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1] ?? ""]] : acc), [])));

using model = await Model.load(flags.model, { log: (l) => console.error(l) });
if (model.device.mode !== "resident") {
  console.error(`profile-graph: the model runs ${model.device.mode} (${model.device.why}); the whole-token profile needs it resident`);
  process.exit(1);
}
const V = model.config.vocab;
const ids = Array.from({ length: flags.context }, (_, i) => (i * 7919 + 13) % V);
using session = model.session({ ctx: flags.context + flags.warm + flags.reps + 1 });
session.prefill(ids);
let id = 1;
for (let i = 0; i < flags.warm; i++) id = session.stepGreedy(id).id;
const runs: Map<string, number>[] = [];
let totals: number[] = [];
for (let r = 0; r < flags.reps; r++) {
  const split = session.profileStep(id);
  id = (id * 31 + 7) % V;
  const byOp = new Map<string, number>();
  for (const { op, us } of split) byOp.set(op, (byOp.get(op) ?? 0) + us);
  runs.push(byOp);
  totals.push(split.reduce((a, b) => a + b.us, 0));
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const total = median(totals);
console.log(`${model.device.why}`);
console.log(`one decode token at position ${flags.context + flags.warm}: ${total.toFixed(0)} µs of GPU time (median of ${flags.reps}), ${session.dispatchesPerToken} dispatches; per op kind, summed over ${model.config.layers} layers:`);
console.log("| op | µs | share | µs per layer |");
console.log("|---|---:|---:|---:|");
for (const op of runs[0]!.keys()) {
  const us = median(runs.map((m) => m.get(op)!));
  const perLayer = /norm$|^final|lm_head|argmax/.test(op) && !/input|post|q\/k/.test(op) ? "" : (us / model.config.layers).toFixed(1);
  console.log(`| ${op} | ${us.toFixed(0)} | ${((100 * us) / total).toFixed(1)}% | ${perLayer} |`);
}
totals = [];
