// The GPU path of a model file against the CPU decoder on the same file (the oracle the test suite
// holds to transformers and llama.cpp), for the device this process finds and its VKMOE_* settings:
// a --prompt N token prompt (pseudo-random ids, the graphs' chunks as configured) and --steps N
// greedy steps (the CPU's ids fed to both), each position's logits NMSE and both top ids. Exits 1
// past --bound (default 1e-2: the integer-dot path's rounding, NMSE about 1e-3 on random files, stays
// under it; a wrong kernel lands near 1e-1 and above). For checking a kernel change on a real GPU,
// where the suite's Lavapipe run cannot reach (the matrix cores, the integer-dot kernels' NVIDIA paths).
//   bun scripts/check-gpu.ts --model FILE [--prompt 100] [--steps 4] [--ctx 256] [--bound 1e-2] [--seed 1]
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { Model } from "../src/model/model.ts";
import { nmse } from "../src/quant/metrics.ts";
import { args, exit, fail } from "./lib/cli.ts";

const SCRIPT = "check-gpu";
const USAGE = "usage: bun scripts/check-gpu.ts --model FILE [--prompt N] [--steps N] [--ctx N] [--bound X] [--seed N]";
let flags: { model: string; prompt: number; steps: number; ctx: number; bound: number; seed: number };
try {
  const { values } = parseArgs({
    args: args(), strict: true, allowPositionals: false,
    options: { model: { type: "string" }, prompt: { type: "string" }, steps: { type: "string" }, ctx: { type: "string" }, bound: { type: "string" }, seed: { type: "string" } },
  });
  const parsed = z.object({
    model: z.string({ error: "--model FILE is required" }),
    prompt: z.coerce.number().int().min(1).max(65536).default(100),
    steps: z.coerce.number().int().min(0).max(1024).default(4),
    ctx: z.coerce.number().int().min(2).max(1 << 20).default(256),
    bound: z.coerce.number().positive().default(1e-2),
    seed: z.coerce.number().int().min(0).default(1),
  }).refine((f) => f.prompt + f.steps <= f.ctx, "--prompt + --steps must fit --ctx").safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]!}; ${USAGE}`);
}

const env = readConfig();
let worst = 0, disagreements = 0;
try {
  using gpu = await Model.load(flags.model, { env, log: () => {} });
  using cpu = await Model.load(flags.model, { env: { ...env, VKMOE_GPU: false }, log: () => {} });
  console.log(`${flags.model}: ${gpu.device.mode} on ${gpu.device.why}`);
  const vocab = gpu.config.vocab;
  let x = flags.seed >>> 0 || 1;
  const ids = Array.from({ length: flags.prompt }, () => {
    x ^= x << 13; x ^= x >>> 17; x ^= x << 5;
    return (x >>> 0) % vocab;
  });
  using a = gpu.session({ ctx: flags.ctx });
  using b = cpu.session({ ctx: flags.ctx, cpuCache: "f16" });
  let got = a.prefill(ids).slice(), want = b.prefill(ids).slice();
  const top = (v: Float32Array) => v.reduce((m, z, i, arr) => (z > arr[m]! ? i : m), 0);
  for (let step = 0; ; step++) {
    const e = nmse(want, got), g = top(got), c = top(want);
    worst = Math.max(worst, e);
    if (g !== c) disagreements++;
    console.log(`${step === 0 ? `prompt of ${flags.prompt}` : `step ${step}`}: NMSE ${e.toExponential(2)}, top id GPU ${g} CPU ${c}`);
    if (step === flags.steps) break;
    got = a.step(c).slice();
    want = b.step(c).slice();
  }
} catch (e) {
  fail(SCRIPT, (e as Error).message);
}
const defaults = readConfig({});
const settings = Object.entries(env).filter(([k, v]) => k.startsWith("VKMOE_") && v !== defaults[k as keyof typeof env]).map(([k, v]) => `${k}=${v}`).join(" ");
console.log(`worst NMSE ${worst.toExponential(2)} (bound ${flags.bound}), top ids differ at ${disagreements} of ${flags.steps + 1}${settings ? `; ${settings}` : ""}`);
exit(worst <= flags.bound ? 0 : 1);
