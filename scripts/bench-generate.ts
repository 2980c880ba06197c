// Whole-model benchmark: prefill and decode of model files through the engine (Model.load,
// model.session), against the device's read bandwidth measured in the same run and against
// llama.cpp's llama-bench on the same files. For each --model FILE:
//   prefill      tok/s of a --prompt N token prompt (default 512), and its first token's latency
//                (prefill() of the prompt + the host argmax of the logits it returns)
//   decode       tok/s of --gen N greedy tokens after that prompt (default 128), and of --depth-gen N
//                tokens after a --depth N token context (default 64 after 4096; the context is
//                filled with prefill first); per token: wall µs, GPU µs (timestamps around the
//                token's submit, mean), host µs = wall - GPU, dispatches and submits
//   roofline     bytes one decode token reads, from the file's tensor types (dense weights of
//                every layer, the top-k experts' gate/up/down per MoE layer, lm_head, one embedding
//                row, and the f16 KV cache at the timed tokens' mean position) ÷ the streaming-read
//                bandwidth (shaders/stream_read via scripts/lib/gpu-time.ts) -> tok/s, and the share
//                of it reached
//   llama.cpp    llama-bench on the same file (-ngl 99 -fa 1; pp / tg / tg at depth) and our/their
//                ratios, when its binary is found (--llama-bench PATH; default
//                /tmp/llama/llama-vk/llama-bench)
//   --budget-half  decode again with a device budget of half the experts' bytes (per-layer mode,
//                the expert cache evicting): tok/s and the cache hit rate during decode, after a
//                --half-prompt N prompt (default min(prompt, 64)), over --half-gen N tokens
//                (default min(gen, 32)): that mode runs the dense ops on the GPU a layer a submit and
//                the experts through the per-layer MoE call
// Token ids are a seeded pseudo-random sequence (no text). Clocks: ~0.5 s of streaming reads before
// the bandwidth figure and before each timed phase (not on a CPU device).
//   bun scripts/bench-generate.ts --model FILE [--model FILE]... [--prompt N] [--gen N] [--depth N]
//     [--depth-gen N] [--ctx N] [--seed N] [--budget-half [--half-prompt N] [--half-gen N]] [--llama-bench PATH | --no-llama]
//     [--llama-reps N] [--json FILE]
import { existsSync, statSync, writeFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { basename } from "node:path";
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { openTensorFile, type TensorDType } from "../src/formats/index.ts";
import type { ModelConfig as Qwen3MoeConfig } from "../src/model/model-config.ts";
import { Model } from "../src/model/model.ts";
import type { Session } from "../src/model/session.ts";
import type { CacheStats } from "../src/pool/cache.ts";
import { formatDriverVersion } from "../src/vk/banner.ts";
import { formatApiVersion } from "../src/vk/constants.ts";
import { VulkanContext } from "../src/vk/index.ts";
import { args, exit, fail, oneLine, runtimeName, writeStderr } from "./lib/cli.ts";
import { readBandwidth, type ReadBandwidth } from "./lib/gpu-time.ts";
import { formatBytes } from "./lib/progress.ts";
import { fmt, formatTable, mean, median, percentile } from "./lib/table.ts";

const SCRIPT = "bench-generate";
const DEFAULT_LLAMA = "/tmp/llama/llama-vk/llama-bench";
const USAGE = `usage: bun scripts/bench-generate.ts --model FILE [--model FILE]... [--prompt N] [--gen N] [--depth N] [--depth-gen N] [--ctx N] [--seed N] [--budget-half [--half-prompt N] [--half-gen N]] [--llama-bench PATH | --no-llama] [--llama-reps N] [--json FILE]`;
const MiB = 2 ** 20;

// ---- arguments ---------------------------------------------------------------------------------

const options = {
  model: { type: "string", short: "m", multiple: true },
  prompt: { type: "string" },
  gen: { type: "string" },
  depth: { type: "string" },
  "depth-gen": { type: "string" },
  ctx: { type: "string" },
  seed: { type: "string" },
  "budget-half": { type: "boolean" },
  "half-prompt": { type: "string" },
  "half-gen": { type: "string" },
  "llama-bench": { type: "string" },
  "no-llama": { type: "boolean" },
  "llama-reps": { type: "string" },
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
const int = (min: number) => z.string().trim().regex(/^\d+$/, "must be a non-negative integer").transform(Number).pipe(z.number().int().min(min, `must be at least ${min}`));
const flagsSchema = z.object({
  model: z.array(z.string().min(1, "needs a file name"), { error: "is required (repeat it for several files)" }).min(1, "is required"),
  prompt: int(1).default(512),
  gen: int(1).default(128),
  depth: int(0).default(4096),
  "depth-gen": int(1).default(64),
  ctx: int(1).optional(),
  seed: int(0).default(1),
  "budget-half": z.boolean().default(false),
  "half-prompt": int(1).optional(),
  "half-gen": int(1).optional(),
  "llama-bench": z.string().min(1).optional(),
  "no-llama": z.boolean().default(false),
  "llama-reps": int(1).optional(),
  json: z.string().min(1, "needs a file name").optional(),
});
const parsed = flagsSchema.safeParse(raw);
if (!parsed.success) fail(SCRIPT, `${parsed.error.issues.map((i) => `--${i.path.join(".")} ${i.message}`).join("; ")}; ${USAGE}`);
const flags = parsed.data;
if (flags["no-llama"] && flags["llama-bench"]) fail(SCRIPT, "--no-llama and --llama-bench contradict each other");
for (const f of flags.model) if (!existsSync(f) || !statSync(f).isFile()) fail(SCRIPT, `--model ${f}: no such file`);

// Per-layer mode runs the dense part on the host (~1 s a token for Qwen3-30B-A3B): shorter by default.
const halfPrompt = flags["half-prompt"] ?? Math.min(flags.prompt, 64);
const halfGen = flags["half-gen"] ?? Math.min(flags.gen, 32);

// ---- bytes one decode token reads --------------------------------------------------------------

/** Bytes per weight of each tensor type vkmoe reads (Q4_0: f16 scale + 32 nibbles per 32 weights). */
const BYTES_PER_WEIGHT: Record<TensorDType, number> = {
  F32: 4, F16: 2, BF16: 2, Q8_0: 34 / 32, Q4_0: 18 / 32,
  Q4_1: 20 / 32, Q5_0: 22 / 32, Q5_1: 24 / 32, Q4_K: 144 / 256, Q5_K: 176 / 256, Q6_K: 210 / 256,
};

interface TokenBytes {
  /** Per layer, summed over layers: attention (q/k/v/o + q/k norms), router, other dense tensors (norms, dense MLPs, shared experts). */
  attention: number;
  router: number;
  otherDense: number;
  /** top-k experts' gate/up/down of every MoE layer. */
  experts: number;
  lmHead: number;
  /** One row of the token embedding, output norm. */
  embeddingRow: number;
  outputNorm: number;
  /** Every weight byte one token reads (all of the above). */
  weights: number;
  /** f16 K and V of one cached position, all layers. */
  kvPerPosition: number;
  /** All routed experts of all layers (what --budget-half halves). */
  allExperts: number;
  /** One expert's gate+up+down (first MoE layer). */
  perExpert: number;
  /** Tensor types: "attn_q Q4_0, ..., lm_head Q8_0". */
  types: Record<string, string>;
}

/** From the file's tensors (their types as stored) and the model's config. */
async function tokenBytes(path: string, cfg: Qwen3MoeConfig): Promise<TokenBytes> {
  using file = await openTensorFile(path);
  const sizeOf = (name: string): number => {
    const t = file.tensors.get(name)!;
    return t.shape.reduce((a, b) => a * b, 1) * BYTES_PER_WEIGHT[t.dtype];
  };
  const r: TokenBytes = { attention: 0, router: 0, otherDense: 0, experts: 0, lmHead: 0, embeddingRow: 0, outputNorm: 0, weights: 0, kvPerPosition: 0, allExperts: 0, perExpert: 0, types: {} };
  const typeOf = (key: string, name: string) => {
    const t = file.tensors.get(name);
    if (t && !(key in r.types)) r.types[key] = t.dtype;
  };
  const gguf = [...file.tensors.keys()].some((n) => n.startsWith("blk."));
  if (!gguf) throw new Error(`${path}: byte counts read GGUF tensor names (blk.N.*); this file has none`);
  for (const name of file.tensors.keys()) {
    const m = /^blk\.(\d+)\.(.+)$/.exec(name);
    if (!m) continue;
    const part = m[2]!;
    const bytes = sizeOf(name);
    if (/_exps\.weight$/.test(part)) {
      // [E, rows, cols]: top-k of E experts are read per token.
      const E = file.tensors.get(name)!.shape[0]!;
      r.experts += (bytes / E) * cfg.topK;
      r.allExperts += bytes;
      if (Number(m[1]) === cfg.moeLayers.indexOf(true)) r.perExpert += bytes / E;
      typeOf(part.replace(/\.weight$/, ""), name);
    } else if (part.startsWith("attn_")) {
      r.attention += bytes;
      if (!part.includes("norm")) typeOf(part.replace(/\.weight$/, ""), name);
    } else if (part === "ffn_gate_inp.weight") {
      r.router += bytes;
      typeOf("router", name);
    } else r.otherDense += bytes;
  }
  const lm = file.tensors.has("output.weight") ? "output.weight" : "token_embd.weight";
  r.lmHead = sizeOf(lm);
  typeOf("lm_head", lm);
  const embd = file.tensors.get("token_embd.weight");
  if (embd) r.embeddingRow = cfg.hidden * BYTES_PER_WEIGHT[embd.dtype];
  if (file.tensors.has("output_norm.weight")) r.outputNorm = sizeOf("output_norm.weight");
  r.weights = r.attention + r.router + r.otherDense + r.experts + r.lmHead + r.embeddingRow + r.outputNorm;
  r.kvPerPosition = cfg.layers * 2 * cfg.kvHeads * cfg.headDim * 2;
  return r;
}

// ---- the device: banner, clocks, read bandwidth ------------------------------------------------

interface DeviceInfo {
  name: string;
  driver: string;
  vulkan: string;
  index: number;
  cpu: boolean;
}

const env: VkmoeEnv = (() => {
  try {
    return readConfig();
  } catch (e) {
    fail(SCRIPT, oneLine(e));
  }
})();

let vk: VulkanContext | undefined;
let noDevice = "";
try {
  vk = new VulkanContext({}, env);
} catch (e) {
  noDevice = oneLine(e);
}
const deviceInfo: DeviceInfo | undefined = vk && {
  name: vk.device.info.name,
  driver: `${vk.device.info.driverName} ${vk.device.info.driverInfo} (driver ${formatDriverVersion(vk.device.info)})`,
  vulkan: formatApiVersion(vk.device.info.apiVersion),
  index: vk.device.info.index,
  cpu: vk.device.info.type === 4,
};

/** Streaming reads for ~0.5 s: the GPU's clocks up before a measurement (none on a CPU device). */
function warmClocks(): void {
  if (vk && !deviceInfo!.cpu) readBandwidth(vk.device, 1024 * MiB, 150);
}

// ---- timed phases ------------------------------------------------------------------------------

/** A seeded xorshift32 sequence of token ids in 0..vocab-1. */
function tokenIds(n: number, vocab: number, seed: number): number[] {
  let s = (seed * 0x9e3779b1 + 0x6d2b79f5) >>> 0 || 1;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    out.push(s % vocab);
  }
  return out;
}

function argmax(logits: Float32Array): number {
  let best = 0;
  for (let v = 1; v < logits.length; v++) if (logits[v]! > logits[best]!) best = v;
  return best;
}

interface PrefillRun {
  tokens: number;
  seconds: number;
  tps: number;
  /** prefill() of the prompt + the host argmax of its logits: the first generated token's latency. */
  firstTokenMs: number;
  /** The prompt's replays' GPU µs summed (device path with timestamps; 0 otherwise). */
  gpuUs: number;
}

interface DecodeRun {
  /** Tokens in the cache before the first timed token. */
  start: number;
  tokens: number;
  seconds: number;
  tps: number;
  path: string;
  wallUs: number[];
  /** s.lastGpuUs of each token (device path with timestamps; empty otherwise). */
  gpuUs: number[];
  dispatchesPerToken: number;
  submitsPerToken: number;
  /** Mean KV positions read per timed token. */
  meanPositions: number;
}

function timePrefill(s: Session, ids: number[]): PrefillRun & { next: number } {
  const gpu0 = s.counts.gpuUs;
  const t0 = performance.now();
  const logits = s.prefill(ids);
  const t1 = performance.now();
  const next = argmax(logits);
  const t2 = performance.now();
  const seconds = (t1 - t0) / 1e3;
  return { tokens: ids.length, seconds, tps: ids.length / seconds, firstTokenMs: t2 - t0, gpuUs: s.counts.gpuUs - gpu0, next };
}

function timeDecode(s: Session, first: number, n: number): DecodeRun {
  const start = s.length;
  const c0 = { ...s.counts };
  const wallUs: number[] = [], gpuUs: number[] = [];
  const device = s.path === "device";
  let id = first;
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    id = s.stepGreedy(id).id;
    wallUs.push((performance.now() - t) * 1e3);
    if (device) gpuUs.push(s.lastGpuUs);
  }
  const seconds = (performance.now() - t0) / 1e3;
  const tokens = s.counts.tokens - c0.tokens;
  return {
    start, tokens: n, seconds, tps: n / seconds, path: s.path, wallUs,
    gpuUs: gpuUs.every((g) => g > 0) ? gpuUs : [],
    dispatchesPerToken: s.dispatchesPerToken,
    submitsPerToken: tokens > 0 ? (s.counts.submits - c0.submits) / tokens : NaN,
    // The token at position p attends to p + 1 cached positions.
    meanPositions: start + (n + 1) / 2,
  };
}

/** Context for `need` tokens: --ctx, or `need` rounded up to 256 (within the model's maximum). */
function ctxFor(need: number, cfg: Qwen3MoeConfig): number | string {
  if (flags.ctx !== undefined) return flags.ctx >= need ? flags.ctx : `--ctx ${flags.ctx} is under the ${need} tokens needed`;
  if (need > cfg.maxPositions) return `${need} tokens exceed the model's maximum context of ${cfg.maxPositions}`;
  return Math.min(cfg.maxPositions, Math.ceil(need / 256) * 256);
}

/** The expert cache's counters. */
function expertCache(model: Model): CacheStats | undefined {
  const stats = model.expertCacheStats() as unknown as CacheStats | undefined;
  return stats && typeof stats.hits === "number" && typeof stats.misses === "number" ? stats : undefined;
}

// ---- llama.cpp ---------------------------------------------------------------------------------

interface LlamaTest {
  test: string;
  tps: number;
  stddev: number;
  samples: number[];
}

interface LlamaResult {
  binary: string;
  /** Its Vulkan device line ("ggml_vulkan: 0 = ..."), or its gpu_info. */
  device: string;
  pp?: LlamaTest;
  tg?: LlamaTest;
  tgDepth?: LlamaTest;
  commands: string[];
  /** Why a run gave nothing. */
  errors: string[];
  raw: unknown[];
}

function llamaBinary(): string | undefined {
  if (flags["no-llama"]) return undefined;
  const p = flags["llama-bench"] ?? DEFAULT_LLAMA;
  return existsSync(p) ? p : undefined;
}

function runLlama(binary: string, file: string, depthFits: boolean): LlamaResult {
  const out: LlamaResult = { binary, device: "", commands: [], errors: [], raw: [] };
  // ggml skips CPU (software) Vulkan devices unless named; naming ours also keeps both on one GPU.
  const procEnv: Record<string, string | undefined> = { ...(globalThis as any).process.env };
  if (procEnv.GGML_VK_VISIBLE_DEVICES === undefined && deviceInfo) procEnv.GGML_VK_VISIBLE_DEVICES = String(deviceInfo.index);
  const reps = flags["llama-reps"];
  const runs: { argv: string[]; pick: (e: any) => keyof Pick<LlamaResult, "pp" | "tg" | "tgDepth"> | undefined }[] = [
    {
      argv: ["-m", file, "-ngl", "99", "-fa", "1", "-p", String(flags.prompt), "-n", String(flags.gen), "-r", String(reps ?? 3), "-o", "json"],
      pick: (e) => (e.n_prompt > 0 && e.n_gen === 0 ? "pp" : e.n_prompt === 0 && e.n_gen > 0 ? "tg" : undefined),
    },
  ];
  if (flags.depth > 0 && depthFits) {
    runs.push({
      argv: ["-m", file, "-ngl", "99", "-fa", "1", "-p", "0", "-n", String(flags["depth-gen"]), "-d", String(flags.depth), "-r", String(reps ?? 2), "-o", "json"],
      pick: (e) => (e.n_prompt === 0 && e.n_gen > 0 && e.n_depth === flags.depth ? "tgDepth" : undefined),
    });
  }
  for (const run of runs) {
    const command = `${procEnv.GGML_VK_VISIBLE_DEVICES !== undefined ? `GGML_VK_VISIBLE_DEVICES=${procEnv.GGML_VK_VISIBLE_DEVICES} ` : ""}${binary} ${run.argv.join(" ")}`;
    out.commands.push(command);
    writeStderr(`${SCRIPT}: ${command}\n`);
    const r = spawnSync(binary, run.argv, { encoding: "utf8", env: procEnv, maxBuffer: 256 * MiB });
    const stderr = String(r.stderr ?? "");
    const dev = /ggml_vulkan: \d+ = ([^\n]*)/.exec(stderr);
    if (dev && !out.device) out.device = dev[1]!.trim();
    if (r.error || r.status !== 0) {
      const last = stderr.trim().split("\n").filter((l) => l.trim() !== "").slice(-2).join(" / ");
      out.errors.push(`${command}: ${r.error ? oneLine(r.error) : `exit ${r.status ?? r.signal}`}${last ? `: ${last}` : ""}`);
      continue;
    }
    let list: any[];
    try {
      list = JSON.parse(String(r.stdout));
      if (!Array.isArray(list)) throw new Error("not a JSON array");
    } catch (e) {
      out.errors.push(`${command}: output is not llama-bench's JSON (${oneLine(e)})`);
      continue;
    }
    for (const e of list) {
      out.raw.push(e);
      const key = run.pick(e);
      if (!key) continue;
      const test = key === "pp" ? `pp${e.n_prompt}` : key === "tg" ? `tg${e.n_gen}` : `tg${e.n_gen}@d${e.n_depth}`;
      out[key] = { test, tps: Number(e.avg_ts), stddev: Number(e.stddev_ts), samples: (e.samples_ts ?? []).map(Number) };
      if (!out.device && typeof e.gpu_info === "string") out.device = e.gpu_info;
    }
  }
  return out;
}

// ---- one model file ----------------------------------------------------------------------------

interface BudgetHalf {
  budgetMB: number;
  mode: string;
  why: string;
  path: string;
  prefill?: PrefillRun;
  decode?: DecodeRun;
  /** Expert cache during the timed decode (undefined when not reachable). */
  cache?: { hits: number; misses: number; hitRate: number; evictions: number; uploads: number; bytesUploaded: number; residentCount: number; budget: number };
  notes: string[];
}

interface ModelResult {
  file: string;
  config: Qwen3MoeConfig;
  mode: string;
  why: string;
  loadSeconds: number;
  bytes: TokenBytes;
  prefill?: PrefillRun;
  decode?: DecodeRun;
  depthFill?: PrefillRun;
  depthDecode?: DecodeRun;
  budgetHalf?: BudgetHalf;
  llama?: LlamaResult;
  notes: string[];
  log: string[];
}

/**
 * Warm-up: every shape the timed phases replay (a prompt of the timed one's length, so its chunks
 * whatever the graph's chunk length, a small chunk, one token), then the cache emptied. Without the
 * full chunk its recording (and the first run of its pipelines) was inside the timed prefill: 331
 * against 1126 tok/s at pp512 on the H200 (2026-12-02); with 512-token chunks the warm-up's 64-token
 * prompt left the 512-token recording and the kernels only it runs to the timed prefill (2026-12-07).
 */
function warmSession(s: Session, vocab: number, prompt: number): void {
  const ids = tokenIds(prompt + 4, vocab, flags.seed + 99);
  s.prefill(ids.slice(0, prompt));
  s.truncate(0);
  s.prefill(ids.slice(-4));
  s.stepGreedy(ids[0]!);
  s.truncate(0);
}

async function benchModel(file: string): Promise<ModelResult> {
  const log: string[] = [];
  const notes: string[] = [];
  writeStderr(`${SCRIPT}: loading ${file}\n`);
  let result: ModelResult;
  {
    using model = await Model.load(file, { env, log: (l) => { log.push(l); writeStderr(`${l}\n`); } });
    const cfg = model.config;
    const bytes = await tokenBytes(file, cfg);
    const device = model.device;
    result = { file, config: cfg, mode: device.mode, why: device.why, loadSeconds: model.loadSeconds, bytes, notes, log };

    // Prompt, then decode after it.
    const c1 = ctxFor(flags.prompt + flags.gen, cfg);
    if (typeof c1 === "string") notes.push(`prefill and decode after the prompt skipped: ${c1}`);
    else {
      using s = model.session({ ctx: c1, timing: true });
      writeStderr(`${SCRIPT}: ${basename(file)}: prefill ${flags.prompt}, decode ${flags.gen} (ctx ${c1}, ${s.path})\n`);
      warmSession(s, cfg.vocab, flags.prompt);
      warmClocks();
      const p = timePrefill(s, tokenIds(flags.prompt, cfg.vocab, flags.seed));
      result.prefill = p;
      warmClocks();
      result.decode = timeDecode(s, p.next, flags.gen);
    }

    // Decode after a long context.
    if (flags.depth > 0) {
      const c2 = ctxFor(flags.depth + flags["depth-gen"], cfg);
      if (typeof c2 === "string") notes.push(`decode at depth ${flags.depth} skipped: ${c2}`);
      else {
        using s = model.session({ ctx: c2, timing: true });
        writeStderr(`${SCRIPT}: ${basename(file)}: fill ${flags.depth}, decode ${flags["depth-gen"]} (ctx ${c2}, ${s.path})\n`);
        warmSession(s, cfg.vocab, flags.depth);
        warmClocks();
        const fill = timePrefill(s, tokenIds(flags.depth, cfg.vocab, flags.seed + 1));
        result.depthFill = fill;
        warmClocks();
        result.depthDecode = timeDecode(s, fill.next, flags["depth-gen"]);
      }
    }
  }

  if (flags["budget-half"]) result.budgetHalf = await benchBudgetHalf(file, result);

  // llama.cpp, with our model freed.
  const binary = llamaBinary();
  if (binary) result.llama = runLlama(binary, file, typeof ctxFor(flags.depth + flags["depth-gen"], result.config) === "number");
  return result;
}

async function benchBudgetHalf(file: string, main: ModelResult): Promise<BudgetHalf> {
  // The file's bytes of half the experts (budgetMB is in MiB and need not be whole); the pool's
  // layout may pad an expert, so the residents count printed says how many fit.
  const budgetMB = main.bytes.allExperts / 2 / MiB;
  const notes: string[] = [];
  if (env.VKMOE_BUDGET_MB !== undefined) notes.push(`VKMOE_BUDGET_MB=${env.VKMOE_BUDGET_MB} is set: it overrides the half budget (${fmt(budgetMB)} MiB)`);
  writeStderr(`${SCRIPT}: ${basename(file)}: loading with a budget of ${fmt(budgetMB)} MiB (half the experts)\n`);
  using model = await Model.load(file, { env, budgetMB, log: (l) => { notes.push(l); writeStderr(`${l}\n`); } });
  const cfg = model.config;
  const out: BudgetHalf = { budgetMB, mode: model.device.mode, why: model.device.why, path: "", notes };
  const prompt = halfPrompt, gen = halfGen;
  const c = ctxFor(prompt + gen, cfg);
  if (typeof c === "string") {
    notes.push(`skipped: ${c}`);
    return out;
  }
  using s = model.session({ ctx: c, timing: true });
  out.path = s.path;
  writeStderr(`${SCRIPT}: ${basename(file)}: half budget: prefill ${prompt}, decode ${gen} (ctx ${c}, ${s.path})\n`);
  warmSession(s, cfg.vocab, 4); // per-layer mode uploads the experts a long warm-up would route to
  warmClocks();
  const p = timePrefill(s, tokenIds(prompt, cfg.vocab, flags.seed));
  out.prefill = p;
  warmClocks();
  const before = expertCache(model);
  out.decode = timeDecode(s, p.next, gen);
  const after = expertCache(model);
  if (before && after) {
    const hits = after.hits - before.hits, misses = after.misses - before.misses;
    out.cache = {
      hits, misses, hitRate: hits + misses > 0 ? hits / (hits + misses) : NaN, evictions: after.evictions - before.evictions, uploads: after.uploads - before.uploads,
      bytesUploaded: after.bytesUploaded - before.bytesUploaded, residentCount: after.residentCount, budget: after.budget,
    };
  } else notes.push("expert cache hit rate not available: no GPU expert backend reachable (Model exposes no public path to its cache counters)");
  return out;
}

// ---- output ------------------------------------------------------------------------------------

const MB = 1e6;

function describeTypes(t: Record<string, string>): string {
  const groups = new Map<string, string[]>();
  for (const [k, v] of Object.entries(t)) groups.set(v, [...(groups.get(v) ?? []), k]);
  return [...groups].map(([type, names]) => `${names.join("/")} ${type}`).join(", ");
}

/** What the table prints for a decode run (also written to --json). */
interface DecodeFigures {
  tps: number;
  /** Means per token. */
  wallUs: number;
  gpuUs: number;
  hostUs: number;
  medianWallUs: number;
  p90WallUs: number;
  /** Weights + the KV cache at the timed tokens' mean position. */
  bytesPerToken: number;
  /** Read bandwidth ÷ bytes per token; NaN off the device path (the CPU decoder reads host memory). */
  rooflineTps: number;
  ofRoofline: number;
  /** Bytes per token ÷ GPU time, and its share of the read bandwidth (the GPU side alone). */
  gpuGBs: number;
  gpuOfBandwidth: number;
  llamaTps: number;
  oursOverLlama: number;
}

function decodeFigures(d: DecodeRun, b: TokenBytes, bw: ReadBandwidth | undefined, llama: LlamaTest | undefined): DecodeFigures {
  const wallUs = mean(d.wallUs), gpuUs = d.gpuUs.length ? mean(d.gpuUs) : NaN;
  const bytesPerToken = b.weights + b.kvPerPosition * d.meanPositions;
  const rooflineTps = bw && d.path === "device" ? (bw.gbs * 1e9) / bytesPerToken : NaN;
  return {
    tps: d.tps, wallUs, gpuUs, hostUs: wallUs - gpuUs, medianWallUs: median(d.wallUs), p90WallUs: percentile(d.wallUs, 90), bytesPerToken,
    rooflineTps, ofRoofline: d.tps / rooflineTps, gpuGBs: bytesPerToken / (gpuUs * 1e3), gpuOfBandwidth: bw ? bytesPerToken / (gpuUs * 1e3) / bw.gbs : NaN, llamaTps: llama?.tps ?? NaN, oursOverLlama: llama ? d.tps / llama.tps : NaN,
  };
}

function report(r: ModelResult, bw: ReadBandwidth | undefined): string[] {
  const c = r.config, b = r.bytes;
  const lines: string[] = [];
  const moe = c.moeLayers.filter((m) => m).length;
  lines.push(`\n### ${basename(r.file)}: D=${c.hidden}, ${c.layers} layers (${moe} MoE), E=${c.experts} top-${c.topK}, I=${c.expertIntermediate}, heads ${c.heads}/${c.kvHeads}x${c.headDim}, vocab ${c.vocab}`);
  lines.push(`types: ${describeTypes(b.types)}`);
  lines.push(`mode ${r.mode}: ${r.why}; load ${r.loadSeconds.toFixed(2)} s`);
  lines.push(`bytes per decode token: attention ${formatBytes(b.attention)}, router ${formatBytes(b.router)}, other dense ${formatBytes(b.otherDense)}, experts (top-${c.topK} x ${moe} layers) ${formatBytes(b.experts)}, lm_head ${formatBytes(b.lmHead)}, embedding row + output norm ${formatBytes(b.embeddingRow + b.outputNorm)}: weights ${formatBytes(b.weights)}; + KV cache (f16) ${formatBytes(b.kvPerPosition)} per position`);
  const l = r.llama;
  const h = r.budgetHalf;
  const ratio = (ours: number | undefined, theirs: LlamaTest | undefined) => (ours !== undefined && theirs ? `${fmt(ours / theirs.tps)}x` : "—");
  const theirs = (t: LlamaTest | undefined) => (t ? `${fmt(t.tps)} (${t.test})` : "—");
  const head = ["phase", "tok/s", "wall µs/token", "p90", "GPU µs", "host µs", "dispatches", "submits", "MB read/token", "GPU GB/s", "roofline tok/s", "of roofline", "llama.cpp tok/s", "ours ÷ llama.cpp"];
  const rows: string[][] = [head];
  if (r.prefill) {
    const p = r.prefill;
    const wallUs = (p.seconds * 1e6) / p.tokens, gpuUs = p.gpuUs / p.tokens;
    rows.push([`prefill ${p.tokens}`, fmt(p.tps), fmt(wallUs), "—", gpuUs ? fmt(gpuUs) : "—", gpuUs ? fmt(wallUs - gpuUs) : "—", "—", "—", "—", "—", "—", "—", theirs(l?.pp), ratio(p.tps, l?.pp)]);
  }
  const decodeRow = (label: string, d: DecodeRun, llama?: LlamaTest) => {
    const f = decodeFigures(d, b, bw, llama);
    rows.push([
      label, fmt(d.tps), fmt(f.wallUs), fmt(percentile(d.wallUs, 90)), fmt(f.gpuUs), fmt(f.hostUs), d.dispatchesPerToken ? fmt(d.dispatchesPerToken) : "—", fmt(d.submitsPerToken),
      fmt(f.bytesPerToken / MB), fmt(f.gpuGBs), fmt(f.rooflineTps), Number.isFinite(f.ofRoofline) ? `${fmt(100 * f.ofRoofline)}%` : "—", theirs(llama), ratio(d.tps, llama),
    ]);
  };
  if (r.decode) decodeRow(`decode ${r.decode.tokens} @${r.decode.start}`, r.decode, l?.tg);
  if (r.depthFill) {
    const p = r.depthFill;
    rows.push([`fill ${p.tokens} (prefill)`, fmt(p.tps), fmt((p.seconds * 1e6) / p.tokens), "—", "—", "—", "—", "—", "—", "—", "—", "—", "—", "—"]);
  }
  if (r.depthDecode) decodeRow(`decode ${r.depthDecode.tokens} @${r.depthDecode.start}`, r.depthDecode, l?.tgDepth);
  if (h?.decode) decodeRow(`decode ${h.decode.tokens} @${h.decode.start}, half experts (${h.mode})`, h.decode);
  lines.push(formatTable(rows));
  if (r.prefill) lines.push(`first token: ${fmt(r.prefill.firstTokenMs)} ms after a ${r.prefill.tokens}-token prompt (prefill + host argmax of its logits)`);
  if (r.decode && r.decode.path !== "device") lines.push(`decode ran on the ${r.decode.path} path: no GPU timestamps per token, no device roofline`);
  if (h?.decode && h.decode.path !== "device") lines.push(`half experts: the ${h.decode.path} path runs the dense part on the host, so no device roofline for it`);
  if (h) {
    const pre = h.prefill ? `; prefill ${fmt(h.prefill.tps)} tok/s` : "";
    const cache = h.cache
      ? `; expert cache during decode: hit rate ${fmt(100 * h.cache.hitRate)}% (${h.cache.hits} hits, ${h.cache.misses} misses), ${h.cache.evictions} evictions, ${formatBytes(h.cache.bytesUploaded)} uploaded, ${h.cache.residentCount} experts resident of ${c.experts * moe}`
      : "";
    lines.push(`half budget (${fmt(h.budgetMB)} MiB of ${formatBytes(b.allExperts)} of experts): mode ${h.mode}, session ${h.path || "—"}${h.decode ? `, decode ${fmt(h.decode.tps)} tok/s` : ""}${pre}${cache}`);
    for (const n of h.notes) lines.push(`  ${n}`);
  }
  if (l) {
    lines.push(`llama.cpp: ${l.binary}${l.device ? ` on ${l.device}` : ""}`);
    for (const e of l.errors) lines.push(`  llama-bench failed: ${e}`);
  } else if (!flags["no-llama"]) lines.push(`llama.cpp: no llama-bench at ${flags["llama-bench"] ?? DEFAULT_LLAMA} (--llama-bench PATH): no comparison`);
  for (const n of r.notes) lines.push(n);
  return lines;
}

// ---- main --------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const date = new Date().toISOString();
  console.log(`bench-generate (${runtimeName}) ${date.slice(0, 10)}; --prompt ${flags.prompt} --gen ${flags.gen} --depth ${flags.depth} --depth-gen ${flags["depth-gen"]}${flags.ctx ? ` --ctx ${flags.ctx}` : ""}`);
  let bw: ReadBandwidth | undefined;
  if (vk && deviceInfo) {
    console.log(`device: ${deviceInfo.name}, ${deviceInfo.driver}, Vulkan ${deviceInfo.vulkan}`);
    warmClocks();
    bw = readBandwidth(vk.device, deviceInfo.cpu ? 64 * MiB : 1024 * MiB, deviceInfo.cpu ? 3 : 7);
    console.log(`read bandwidth: ${fmt(bw.gbs)} GB/s (stream_read over ${formatBytes(bw.bytes)} x${bw.passes}, best of runs)`);
  } else console.log(`device: no Vulkan device (${noDevice}); no read bandwidth, no roofline`);
  const results: ModelResult[] = [];
  for (const file of flags.model) {
    const r = await benchModel(file);
    results.push(r);
    for (const l of report(r, bw)) console.log(l);
  }
  console.log(`\ntok/s: tokens ÷ wall time of the phase. wall µs: mean per token (p90 beside); GPU µs: mean of the token's GPU timestamps (prefill: its replays' GPU time ÷ its tokens); host µs = wall - GPU. dispatches: of one recorded token; submits: per token. MB read/token: the file's weights one token reads (dense, top-k experts, lm_head) + the f16 KV cache at the timed tokens' mean position; GPU GB/s = that ÷ GPU µs; roofline = read bandwidth ÷ that. llama.cpp: llama-bench -ngl 99 -fa 1, same file, same run.`);
  if (flags.json) {
    const models = results.map((r) => ({
      ...r,
      figures: {
        prefill: r.prefill && { ...r.prefill, llamaTps: r.llama?.pp?.tps ?? null, oursOverLlama: r.llama?.pp ? r.prefill.tps / r.llama.pp.tps : null },
        decode: r.decode && decodeFigures(r.decode, r.bytes, bw, r.llama?.tg),
        depthDecode: r.depthDecode && decodeFigures(r.depthDecode, r.bytes, bw, r.llama?.tgDepth),
        budgetHalfDecode: r.budgetHalf?.decode && decodeFigures(r.budgetHalf.decode, r.bytes, bw, undefined),
      },
    }));
    // NaN is not JSON: null there.
    const json = JSON.stringify({ date, runtime: runtimeName, flags, device: deviceInfo ?? { none: noDevice }, bandwidth: bw ?? null, models }, (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? null : v), 2);
    writeFileSync(flags.json, `${json}\n`);
    writeStderr(`${SCRIPT}: wrote ${flags.json}\n`);
  }
}

try {
  await main();
} catch (e) {
  fail(SCRIPT, oneLine(e));
} finally {
  vk?.[Symbol.dispose]();
}
