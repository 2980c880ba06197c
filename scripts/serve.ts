// `bun run serve --model DIR|FILE.gguf [--host H] [--port P] [flags]` (or `deno task serve ...`): an
// OpenAI-compatible server over one model. Thin over the host (src/host/): flags in, one line out
// when it listens, one line and exit status 1 for a bad flag or a refused bind.
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { Model, QUANT_CHOICES } from "../src/engine/index.ts";
import { VkmoeError } from "../src/errors.ts";
import { isLoopback, startServer } from "../src/host/index.ts";
import { args, exit, fail, oneLine, writeStderr } from "./lib/cli.ts";

const SCRIPT = "serve";
const USAGE = "usage: bun run serve --model DIR|FILE.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--parallel 4] [--batching on|off] [--queue 32] [--ctx N] [--max-tokens-cap N] [--timeout SECONDS] [--max-body-bytes N] [--max-messages N] [--cors ORIGIN]... [--model-name NAME] [--quant auto|none|q8|q4]";

const options = {
  model: { type: "string", short: "m" },
  host: { type: "string" },
  port: { type: "string" },
  "api-key": { type: "string" },
  parallel: { type: "string" },
  batching: { type: "string" },
  queue: { type: "string" },
  ctx: { type: "string", short: "c" },
  "max-tokens-cap": { type: "string" },
  timeout: { type: "string" },
  "max-body-bytes": { type: "string" },
  "max-messages": { type: "string" },
  cors: { type: "string", multiple: true },
  "model-name": { type: "string" },
  quant: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

let raw: ReturnType<typeof parseArgs<{ options: typeof options; allowPositionals: false; strict: true }>>["values"];
try {
  raw = parseArgs({ args: args(), options, allowPositionals: false, strict: true }).values;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]}; ${USAGE}`);
}
if (raw.help) {
  writeStderr(`${USAGE}\n`);
  exit(0);
}

const int = (min: number) => z.string().trim().regex(/^\d+$/, "must be an integer").transform(Number).pipe(z.number().int().min(min));
const flagsSchema = z.object({
  model: z.string({ error: "is required" }).min(1),
  host: z.string().min(1).default("127.0.0.1"),
  port: int(0).pipe(z.number().max(65535)).default(8080),
  "api-key": z.string().optional(),
  parallel: int(1).optional(),
  batching: z.enum(["on", "off"]).default("on"),
  queue: int(0).optional(),
  ctx: int(1).optional(),
  "max-tokens-cap": int(1).optional(),
  timeout: z.string().trim().transform(Number).pipe(z.number({ error: "must be a number" }).positive()).optional(),
  "max-body-bytes": int(1024).optional(),
  "max-messages": int(1).optional(),
  cors: z.array(z.string().min(1)).default([]),
  "model-name": z.string().min(1).optional(),
  quant: z.enum(QUANT_CHOICES as [string, ...string[]]).default("auto"),
});
const parsed = flagsSchema.safeParse(raw);
if (!parsed.success) fail(SCRIPT, `${parsed.error.issues.map((i) => `--${i.path.join(".")} ${i.message}`).join("; ")}; ${USAGE}`);
const flags = parsed.data;

async function main(): Promise<void> {
  const env = readConfig(); // every VKMOE_* setting: VKMOE_API_KEY is the host's, the engine ignores it
  const apiKey = flags["api-key"] ?? env.VKMOE_API_KEY;
  // refuse before the (slow) load
  if (!isLoopback(flags.host) && apiKey === undefined) fail(SCRIPT, `refusing to listen on ${flags.host} without an API key: a non-loopback address needs --api-key KEY or VKMOE_API_KEY (or bind 127.0.0.1)`);
  const model = await Model.load(flags.model, { quant: flags.quant as any, ctx: flags.ctx, env });
  let server: ReturnType<typeof startServer>;
  try {
    server = startServer(model, {
      host: flags.host,
      port: flags.port,
      apiKey,
      parallel: flags.parallel,
      batching: flags.batching,
      queue: flags.queue,
      ctx: flags.ctx,
      maxTokensCap: flags["max-tokens-cap"],
      timeoutSeconds: flags.timeout,
      maxBodyBytes: flags["max-body-bytes"],
      maxMessages: flags["max-messages"],
      cors: flags.cors,
      modelName: flags["model-name"],
    });
  } catch (e) {
    model[Symbol.dispose]();
    throw e;
  }
  const c = server.host.config;
  writeStderr(`serve: ${server.url} · model ${c.modelName} · ${model.device.mode} · ${c.parallel} slots (${server.host.scheduler.stats().stepper}), ctx ${c.ctx}${c.apiKey ? " · API key required" : ""}\n`);
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await server.close();
    model[Symbol.dispose]();
    exit(0);
  };
  const deno = (globalThis as any).Deno;
  if (deno) for (const s of ["SIGINT", "SIGTERM"]) deno.addSignalListener(s, stop);
  else for (const s of ["SIGINT", "SIGTERM"]) (globalThis as any).process.on(s, stop);
}

try {
  await main();
} catch (e) {
  if (e instanceof VkmoeError) fail(SCRIPT, oneLine(e));
  fail(SCRIPT, `internal error: ${oneLine(e)}`);
}
