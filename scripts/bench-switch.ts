// A switch's settings timed against each other in one run: `bench:generate` on --model FILE once for
// each value of --set NAME=A,B,..., the values taken in turn for --rounds N (default 2), so that every
// value sees the same machine, clocks and file cache. Each run is a child process with NAME set in its
// environment (the graphs read their switches from the process env when they are made). Prints each
// run's prefill and decode GPU µs a token, then each value's means and their ratio to the first
// value's: the figure a switch's default is chosen by.
//   bun scripts/bench-switch.ts --model FILE --set VKMOE_NAME=A,B[,...] [--rounds N] [--prompt N] [--gen N]
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { z } from "zod";
import { ENV_NAMES, readConfig } from "../src/config.ts";
import { args, fail, oneLine } from "./lib/cli.ts";
import { fmt, formatTable, mean } from "./lib/table.ts";

const SCRIPT = "bench-switch";
const USAGE = "usage: bun scripts/bench-switch.ts --model FILE --set VKMOE_NAME=A,B[,...] [--rounds N] [--prompt N] [--gen N]";
const count = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
let flags: { model: string; set: string; rounds: number; prompt: number; gen: number };
try {
  const { values } = parseArgs({ args: args(), options: { model: { type: "string" }, set: { type: "string" }, rounds: { type: "string" }, prompt: { type: "string" }, gen: { type: "string" } }, strict: true, allowPositionals: false });
  const parsed = z.object({ model: z.string().min(1), set: z.string().min(1), rounds: count(1, 20).default(2), prompt: count(1, 4096).default(64), gen: count(1, 4096).default(128) }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}

// --set NAME=A,B: a VKMOE_* switch and at least two of its values, each one the config accepts
const eq = flags.set.indexOf("=");
const name = eq > 0 ? flags.set.slice(0, eq) : "";
const settings = eq > 0 ? flags.set.slice(eq + 1).split(",").map((v) => v.trim()) : [];
if (!(ENV_NAMES as string[]).includes(name)) fail(SCRIPT, `--set ${flags.set}: no switch ${name || "(none)"}; the VKMOE_* names are ${ENV_NAMES.join(", ")}`);
if (settings.length < 2 || settings.some((v) => v === "") || new Set(settings).size !== settings.length) fail(SCRIPT, `--set ${flags.set}: give two or more distinct values, NAME=A,B`);
for (const v of settings) {
  try {
    readConfig({ [name]: v });
  } catch (e) {
    fail(SCRIPT, `--set ${name}=${v}: ${oneLine(e)}`);
  }
}

const figuresSchema = z.object({
  models: z.array(z.object({
    prefill: z.object({ tokens: z.number(), gpuUs: z.number() }).nullish(),
    decode: z.object({ dispatchesPerToken: z.number().nullish() }).nullish(),
    figures: z.object({ decode: z.object({ gpuUs: z.number().nullable(), tps: z.number() }).nullish() }),
  })).length(1),
});

interface Run { value: string; round: number; prefillGpuUs: number; decodeGpuUs: number; decodeTps: number; dispatches: number }

const dir = mkdtempSync(join(tmpdir(), "bench-switch-"));
const runs: Run[] = [];
try {
  for (let round = 1; round <= flags.rounds; round++) {
    for (const value of settings) {
      const json = join(dir, `${round}-${value}.json`);
      const argv = ["scripts/bench-generate.ts", "--model", flags.model, "--prompt", String(flags.prompt), "--gen", String(flags.gen), "--depth", "0", "--no-llama", "--json", json];
      console.error(`${SCRIPT}: round ${round}, ${name}=${value}`);
      const r = spawnSync(process.execPath, argv, { env: { ...process.env, [name]: value }, encoding: "utf8" });
      if (r.status !== 0) fail(SCRIPT, `bench-generate with ${name}=${value} failed (status ${r.status}): ${(r.stderr || r.stdout || String(r.error)).trim().split("\n").slice(-1)[0]}`);
      const parsed = figuresSchema.safeParse(JSON.parse(readFileSync(json, "utf8")));
      if (!parsed.success) fail(SCRIPT, `bench-generate's --json with ${name}=${value} lacks its figures: ${z.prettifyError(parsed.error)}`);
      const m = parsed.data.models[0]!;
      runs.push({ value, round, prefillGpuUs: m.prefill ? m.prefill.gpuUs / m.prefill.tokens : NaN, decodeGpuUs: m.figures.decode?.gpuUs ?? NaN, decodeTps: m.figures.decode?.tps ?? NaN, dispatches: m.decode?.dispatchesPerToken ?? NaN });
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

console.log(`${SCRIPT}: ${flags.model}, ${name} = ${settings.join(" / ")}, ${flags.rounds} round(s) in turn; bench:generate --prompt ${flags.prompt} --gen ${flags.gen} --depth 0`);
// the dispatches a decode token records: where a switch adds or removes steps, proof that it reached the run
console.log(formatTable([["round", "value", "prefill GPU µs a token", "decode GPU µs a token", "decode tok/s", "dispatches a token"], ...runs.map((r) => [String(r.round), r.value, fmt(r.prefillGpuUs), fmt(r.decodeGpuUs), fmt(r.decodeTps), Number.isFinite(r.dispatches) ? String(r.dispatches) : "—"])]));
const meanOf = (value: string, key: "prefillGpuUs" | "decodeGpuUs") => mean(runs.filter((r) => r.value === value).map((r) => r[key]));
const base = { prefill: meanOf(settings[0]!, "prefillGpuUs"), decode: meanOf(settings[0]!, "decodeGpuUs") };
console.log(formatTable([
  ["value", "prefill GPU µs (mean)", `÷ ${settings[0]}`, "decode GPU µs (mean)", `÷ ${settings[0]}`],
  ...settings.map((v) => {
    const p = meanOf(v, "prefillGpuUs"), d = meanOf(v, "decodeGpuUs");
    return [v, fmt(p), `${(p / base.prefill).toFixed(3)}x`, fmt(d), `${(d / base.decode).toFixed(3)}x`];
  }),
]));
console.log("GPU µs a token: bench:generate's (the token's GPU timestamps; prefill: its replays' GPU time ÷ its tokens). A ratio under 1 is the value's time below the first value's.");
