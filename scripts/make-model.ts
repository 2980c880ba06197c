// `bun run make-model --shape NAME --type q4_0|q8_0|f16|q4_k_m|q5_k_m|q6_k|q5_0 --out FILE [--seed N] [--layers N] [--vocab N] [--threads N] [--kquant-search full|plain]`:
// a random-weight Qwen3-MoE GGUF (llama.cpp arch qwen3moe), or Qwen3.5/3.6-MoE (qwen35moe) for the qwen3.5-* / qwen3.6-* shapes, with the Qwen3 tokenizer, so full-size
// benchmarks need no download; --vocab N cuts the tokenizer to N tokens (small test files). The
// K-quant types mix tensor types as llama-quantize does for that ftype (src/model/qwen3moe-quant-mix.ts);
// --kquant-search plain skips their scale search (quicker builds of files only to be timed).
// Progress goes to stderr; the last line (stdout) gives size and time.
import { closeSync, openSync, renameSync, rmSync } from "node:fs";
import { z } from "zod";
import { MODEL_FILE_TYPES } from "../src/model/qwen3moe-gguf-layout.ts";
import { plannedTensors, qwen3TokenizerFiles, randomModelTensorBytes, writeRandomModel } from "../src/model/random-gguf.ts";
import { truncateBpeTokenizer } from "../src/formats/bpe-truncate.ts";
import { SHAPE_NAMES, shapeByName } from "../src/model/shapes.ts";
import { args, exit, fail, oneLine } from "./lib/cli.ts";
import { formatBytes, Progress } from "./lib/progress.ts";

const SCRIPT = "make-model";
const USAGE = `usage: bun run make-model --shape ${SHAPE_NAMES.join("|")} --type ${MODEL_FILE_TYPES.join("|")} --out FILE [--seed N] [--layers N] [--vocab N] [--threads N] [--kquant-search full|plain]`;

const integer = z.string().regex(/^\d+$/, "must be a non-negative integer").transform(Number);
const flagsSchema = z.strictObject({
  shape: z.string().refine((s) => shapeByName(s) !== undefined, { message: `must be one of ${SHAPE_NAMES.join(", ")}` }),
  type: z.enum(MODEL_FILE_TYPES, { message: `must be one of ${MODEL_FILE_TYPES.join(", ")}` }),
  out: z.string().min(1, "needs a file name"),
  seed: integer.pipe(z.number().max(0xffffffff, "must fit in 32 bits")).default(1),
  // Fewer layers than the shape has: quick trials and per-layer timings of a big shape.
  layers: integer.pipe(z.number().min(1, "must be at least 1")).optional(),
  // A smaller vocab than the shape's (the Qwen3 tokenizer's first tokens, its special tokens after them): files of a few MB for tests.
  vocab: integer.pipe(z.number().min(282, "must be at least 282 (256 byte tokens and 26 special tokens)")).optional(),
  threads: integer.pipe(z.number().min(1, "must be at least 1").max(256, "must be at most 256")).default(defaultThreads()),
  // K-quant tensors: GGML's scale search ("full"), or each sub-block's plain fit ("plain": ~4x quicker builds, 10-20% more error; benchmark files)
  "kquant-search": z.enum(["full", "plain"], { message: "must be full or plain" }).default("full"),
});

/** One worker per core, up to 16 (writing the file becomes the limit well before). */
function defaultThreads(): number {
  return Math.min(16, Math.max(1, navigator.hardwareConcurrency ?? 1));
}

/** `--name value` and `--name=value` pairs into an object; zod then names what is wrong with the values. */
function collectFlags(list: string[]): Record<string, string> {
  const flags: Record<string, string> = {};
  for (let i = 0; i < list.length; i++) {
    const a = list[i]!;
    if (a === "--help" || a === "-h") {
      console.log(USAGE);
      exit(0);
    }
    if (!a.startsWith("--")) fail(SCRIPT, `unexpected argument ${JSON.stringify(a)}; ${USAGE}`);
    const eq = a.indexOf("=");
    const name = a.slice(2, eq < 0 ? undefined : eq);
    if (!Object.hasOwn(flagsSchema.shape, name)) fail(SCRIPT, `unknown option --${name}; ${USAGE}`);
    const value = eq < 0 ? list[++i] : a.slice(eq + 1);
    if (value === undefined || (eq < 0 && value.startsWith("--"))) fail(SCRIPT, `--${name} needs a value; ${USAGE}`);
    if (Object.hasOwn(flags, name)) fail(SCRIPT, `--${name} is given twice`);
    flags[name] = value;
  }
  return flags;
}

const given = collectFlags(args());
const parsed = flagsSchema.safeParse(given);
if (!parsed.success) {
  const problems = parsed.error.issues.map((issue) => {
    const name = String(issue.path[0]);
    return given[name] === undefined ? `--${name} is required` : `--${name} ${issue.message}`;
  });
  fail(SCRIPT, `${problems.join("; ")}; ${USAGE}`);
}
const flags = parsed.data;
const base = shapeByName(flags.shape)!;
const shape = { ...base, layers: flags.layers ?? base.layers, vocab: flags.vocab ?? base.vocab };
const tokenizer = flags.vocab === undefined ? undefined : truncateBpeTokenizer(qwen3TokenizerFiles(), flags.vocab);
const fileType = flags.type;

// Written under a temporary name, so an interrupted run leaves no file that looks complete.
const partial = `${flags.out}.partial`;
try {
  closeSync(openSync(partial, "w")); // an unwritable --out fails now, before any progress line
} catch (e) {
  fail(SCRIPT, `cannot write --out ${flags.out}: ${oneLine(e)}`);
}
try {
  const layers = (shape.layers === base.layers ? "" : `, ${shape.layers} of ${base.layers} layers`) + (shape.vocab === base.vocab ? "" : `, vocab ${shape.vocab}`);
  const count = plannedTensors(shape, fileType).length;
  const progress = new Progress(`${SCRIPT}: ${shape.name} ${fileType}${layers}, seed ${flags.seed}, ${flags.threads} threads, ~${formatBytes(randomModelTensorBytes(shape, fileType))}`, count, "tensors");
  const report = await writeRandomModel({
    shape,
    fileType,
    path: partial,
    seed: flags.seed,
    threads: flags.threads,
    tokenizer,
    kQuantSearch: flags["kquant-search"] === "full",
    onTensor: () => progress.tick(),
  });
  progress.finish();
  renameSync(partial, flags.out);
  console.log(`${flags.out}: ${formatBytes(report.bytes)} (${report.bytes} bytes, ${report.tensors} tensors) in ${report.seconds.toFixed(1)} s`);
} catch (e) {
  rmSync(partial, { force: true });
  fail(SCRIPT, oneLine(e));
}
