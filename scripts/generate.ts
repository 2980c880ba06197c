// `bun run generate --model DIR|FILE.gguf --prompt TEXT [flags]`: a Qwen3-MoE model from its
// Hugging Face directory or GGUF file to streamed text. Thin over the engine (src/engine/).
// Text goes to stdout as it is generated; progress, notices and the summary line go to stderr.
import { writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { z } from "zod";
import { VkmoeError } from "../src/errors.ts";
import { generate, Model, peakRssBytes, promptIds, QUANT_CHOICES, type GenerateResult, type Session } from "../src/engine/index.ts";
import { samplingFromModel } from "../src/sampling/defaults.ts";
import type { ResolvedSamplingOptions } from "../src/sampling/options.ts";
import type { ChatMessage } from "../src/tokenizer/chat-template.ts";
import { args, exit, fail, oneLine, stderrIsTTY, writeStderr } from "./lib/cli.ts";
import { formatBytes } from "./lib/progress.ts";

const SCRIPT = "generate";
const USAGE = "usage: bun run generate --model DIR|FILE.gguf [--prompt TEXT | stdin] [--system TEXT] [--raw] [--max-tokens N] [--temperature T] [--top-k N] [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N] [--presence-penalty P] [--frequency-penalty F] [--seed N] [--stop TEXT]... [--ctx N] [--quant auto|none|q8|q4] [--think|--no-think] [--json] [--dump-logits FILE] [-i]";

const options = {
  model: { type: "string", short: "m" },
  prompt: { type: "string", short: "p" },
  system: { type: "string" },
  raw: { type: "boolean" },
  "max-tokens": { type: "string", short: "n" },
  temperature: { type: "string" },
  temp: { type: "string" },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  "min-p": { type: "string" },
  "repeat-penalty": { type: "string" },
  "repeat-last-n": { type: "string" },
  "presence-penalty": { type: "string" },
  "frequency-penalty": { type: "string" },
  seed: { type: "string", short: "s" },
  stop: { type: "string", multiple: true },
  ctx: { type: "string", short: "c" },
  quant: { type: "string" },
  think: { type: "boolean" },
  "no-think": { type: "boolean" },
  json: { type: "boolean" },
  "dump-logits": { type: "string" },
  interactive: { type: "boolean", short: "i" },
  help: { type: "boolean", short: "h" },
} as const;

/**
 * parseArgs refuses a value that starts with "-" ("argument is ambiguous"), so `--max-tokens -1` or
 * `--repeat-last-n -1` would never reach the checks below: a negative number after a valued option
 * is joined to it as `--name=-1`.
 */
function negativeValues(list: string[]): string[] {
  const valued = new Map<string, string>();
  for (const [name, o] of Object.entries(options)) {
    if (o.type !== "string") continue;
    valued.set(`--${name}`, name);
    if ("short" in o) valued.set(`-${o.short}`, name);
  }
  const out: string[] = [];
  for (let i = 0; i < list.length; i++) {
    const name = valued.get(list[i]!);
    const next = list[i + 1];
    if (name !== undefined && next !== undefined && /^-(\d|\.\d)/.test(next)) {
      out.push(`--${name}=${next}`);
      i++;
    } else out.push(list[i]!);
  }
  return out;
}

let raw: ReturnType<typeof parseArgs<{ options: typeof options; allowPositionals: false; strict: true }>>["values"];
try {
  raw = parseArgs({ args: negativeValues(args()), options, allowPositionals: false, strict: true }).values;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}
if (raw.help) {
  writeStderr(`${USAGE}\n`);
  exit(0);
}

const num = z.string().trim().min(1, "needs a number").transform(Number).pipe(z.number({ error: "must be a number" }).finite());
const int = (min: number) => z.string().trim().regex(/^-?\d+$/, "must be an integer").transform(Number).pipe(z.number().int().min(min));
const flagsSchema = z.object({
  model: z.string({ error: "is required" }).min(1),
  prompt: z.string().optional(),
  system: z.string().optional(),
  raw: z.boolean().default(false),
  "max-tokens": int(0).default(256),
  temperature: num.optional(),
  temp: num.optional(),
  "top-k": int(0).optional(),
  "top-p": num.optional(),
  "min-p": num.optional(),
  "repeat-penalty": num.optional(),
  "repeat-last-n": int(-1).optional(),
  "presence-penalty": num.optional(),
  "frequency-penalty": num.optional(),
  seed: int(0).optional(),
  stop: z.array(z.string().min(1, "must not be empty")).default([]),
  ctx: int(1).optional(),
  quant: z.enum(QUANT_CHOICES as [string, ...string[]]).default("auto"),
  think: z.boolean().optional(),
  "no-think": z.boolean().optional(),
  json: z.boolean().default(false),
  "dump-logits": z.string().min(1).optional(),
  interactive: z.boolean().default(false),
});
const parsed = flagsSchema.safeParse(raw);
if (!parsed.success) {
  const problems = parsed.error.issues.map((i) => `--${i.path.join(".")} ${i.message}`);
  fail(SCRIPT, `${problems.join("; ")}; ${USAGE}`);
}
const flags = parsed.data;
if (flags.think && flags["no-think"]) fail(SCRIPT, "--think and --no-think contradict each other");
if (flags.raw && flags.system !== undefined) fail(SCRIPT, "--system needs the chat template; it cannot go with --raw");
if (flags.temperature !== undefined && flags.temp !== undefined) fail(SCRIPT, "--temperature and --temp are the same option; give one");
if (flags.interactive && flags.raw) fail(SCRIPT, "-i is a chat; it cannot go with --raw");
if (flags.interactive && (flags.json || flags["dump-logits"])) fail(SCRIPT, "-i cannot go with --json or --dump-logits");
const enableThinking = flags.think ? true : flags["no-think"] ? false : undefined;

const userSampling = {
  temperature: flags.temperature ?? flags.temp,
  topK: flags["top-k"],
  topP: flags["top-p"],
  minP: flags["min-p"],
  repeatPenalty: flags["repeat-penalty"],
  repeatLastN: flags["repeat-last-n"],
  presencePenalty: flags["presence-penalty"],
  frequencyPenalty: flags["frequency-penalty"],
  seed: flags.seed,
};

const stdoutEncoder = new TextEncoder();
const deno = (globalThis as any).Deno;
function writeStdout(text: string): void {
  if (deno) deno.stdout.writeSync(stdoutEncoder.encode(text));
  else (globalThis as any).process.stdout.write(text);
}

async function readStdin(): Promise<string> {
  const chunks: Uint8Array[] = [];
  if (deno) for await (const c of deno.stdin.readable) chunks.push(c);
  else for await (const c of (globalThis as any).process.stdin) chunks.push(c);
  return new TextDecoder().decode(Buffer.concat(chunks));
}

function loadBar(): (stage: string, fraction: number) => void {
  const tty = stderrIsTTY();
  let last = "";
  return (stage, fraction) => {
    if (flags.json && !tty) return;
    const bar = "#".repeat(Math.round(fraction * 24)).padEnd(24, ".");
    const line = `loading: ${stage.padEnd(8)} [${bar}] ${(fraction * 100).toFixed(0).padStart(3)}%`;
    if (tty) writeStderr(`\r${line}\x1b[K${stage === "ready" ? "\n" : ""}`);
    else if (stage !== last) writeStderr(`${line}\n`);
    last = stage;
  };
}

function summary(r: GenerateResult, device: string): string {
  const t = r.timings;
  const ptps = t.promptTokens / Math.max(t.promptSeconds, 1e-9);
  const dtps = t.decodeTokens / Math.max(t.decodeSeconds, 1e-9);
  return `prompt: ${t.promptTokens} tokens, ${ptps.toFixed(1)} tok/s; generated: ${r.ids.length} tokens, ${dtps.toFixed(1)} tok/s; ${r.finishReason}; device: ${device}`;
}

async function main(): Promise<void> {
  const model = await Model.load(flags.model, { quant: flags.quant as any, ctx: flags.ctx, progress: loadBar() });
  try {
    const sampling = samplingFromModel(model.generationDefaults, userSampling);
    const session = model.session({ ctx: flags.ctx });
    const device = `${model.device.mode} (${model.device.why})`;
    if (flags.interactive) return await chat(model, session, sampling, device);
    const prompt = flags.prompt ?? (await readStdin());
    const ids = promptIds(model, prompt, { raw: flags.raw, system: flags.system, enableThinking });
    const run = generate(model, session, ids, { maxTokens: flags["max-tokens"], sampling, stop: flags.stop });
    let step = run.next();
    while (!step.done) {
      if (!flags.json) writeStdout(step.value);
      step = run.next();
    }
    const r = step.value;
    if (!flags.json) writeStdout("\n");
    if (flags["dump-logits"]) writeFileSync(flags["dump-logits"], new Uint8Array(r.promptLogits.buffer, r.promptLogits.byteOffset, r.promptLogits.byteLength));
    const t = r.timings;
    if (flags.json) {
      writeStdout(`${JSON.stringify({
        model: model.source.path,
        format: model.source.format,
        prompt_ids: r.promptIds,
        ids: r.ids,
        text: r.text,
        finish_reason: r.finishReason,
        seed: r.seed,
        sampling,
        timings: {
          prompt_tps: t.promptTokens / Math.max(t.promptSeconds, 1e-9),
          decode_tps: t.decodeTokens / Math.max(t.decodeSeconds, 1e-9),
          prompt_s: t.promptSeconds,
          decode_s: t.decodeSeconds,
          load_s: model.loadSeconds,
          first_token_s: t.promptSeconds,
          submits_per_token: t.decodeTokens > 0 ? t.decodeSubmits / t.decodeTokens : 0,
          dispatches_per_token: session.dispatchesPerToken,
        },
        mode: model.device.mode,
        device: model.device.why,
        peak_rss_bytes: peakRssBytes(),
      })}\n`);
    }
    writeStderr(`${summary(r, device)}; load ${model.loadSeconds.toFixed(2)} s, peak RSS ${formatBytes(peakRssBytes() ?? 0)}\n`);
  } finally {
    // With VKMOE_VALIDATION=1 the GPU path collects the Khronos layer's messages: each one is a line here.
    for (const m of model.takeValidationMessages()) writeStderr(`vkmoe: validation: ${m}\n`);
    model[Symbol.dispose]();
  }
}

/** -i: a chat with history; the session keeps the conversation's KV cache and only the new turn is run. */
async function chat(model: Model, session: Session, sampling: ResolvedSamplingOptions, device: string): Promise<void> {
  const { createInterface } = await import("node:readline");
  const rl = createInterface({ input: (globalThis as any).process.stdin, output: (globalThis as any).process.stderr, terminal: stderrIsTTY() });
  const history: ChatMessage[] = [];
  writeStderr(`chat with ${model.source.path} (${device}); an empty line or Ctrl-D ends it\n`);
  rl.setPrompt("> ");
  rl.prompt();
  for await (const line of rl) {
    if (line.trim() === "") break;
    const ids = promptIds(model, line, { system: flags.system, enableThinking }, history);
    // The template re-renders the whole conversation: keep the cached prefix it shares with it.
    let keep = 0;
    while (keep < session.tokens.length && keep < ids.length - 1 && session.tokens[keep] === ids[keep]) keep++;
    session.truncate(keep);
    const run = generate(model, session, ids.slice(keep), { maxTokens: flags["max-tokens"], sampling, stop: flags.stop });
    let step = run.next();
    while (!step.done) {
      writeStdout(step.value);
      step = run.next();
    }
    writeStdout("\n");
    writeStderr(`${summary(step.value, device)}\n`);
    history.push({ role: "user", content: line }, { role: "assistant", content: step.value.text });
    rl.prompt();
  }
  rl.close();
}

try {
  await main();
} catch (e) {
  if (e instanceof VkmoeError) fail(SCRIPT, oneLine(e));
  fail(SCRIPT, `internal error: ${oneLine(e)}`);
}
