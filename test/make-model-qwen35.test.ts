/**
 * make-model's Qwen3.5/3.6 MoE files (GGUF arch qwen35moe; src/model/qwen35moe-gguf-layout.ts): the
 * layout and metadata against the file llama.cpp's own converter wrote (../shared/fixtures
 * qwen3.5-moe-tiny.Q8_0.gguf: every tensor's name, order, dims and type, every key's type and value);
 * the presets' tensor and key sets against it; the K-quant mixes against llama-quantize --dry-run;
 * tiny files loaded and run by vkmoe's CPU path and by llama.cpp's llama-completion, whose greedy
 * tokens must be vkmoe's while vkmoe's top-2 margins allow. The llama.cpp checks need the peer tools
 * (../shared/tools/peer/README.md: /tmp/llama/llama-vk or $LLAMA_CPP_DIR) and are skipped with a
 * printed reason without them.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gguf } from "@huggingface/gguf";
import { readConfig } from "../src/config.ts";
import { truncateBpeTokenizer } from "../src/formats/bpe-truncate.ts";
import { openGguf } from "../src/formats/gguf.ts";
import { GgmlType, type GgufValue, GgufValueTypeId } from "../src/formats/gguf-writer.ts";
import { tokenizerMetadata } from "../src/formats/hf-tokenizer-gguf.ts";
import { Model } from "../src/model/model.ts";
import type { ModelFileType } from "../src/model/qwen3moe-gguf-layout.ts";
import { QWEN35_MOE_SHAPES, type Qwen35MoeShape, qwen35MoeMetadata, qwen35MoeTensors } from "../src/model/qwen35moe-gguf-layout.ts";
import { qwen3TokenizerFiles, writeRandomModel } from "../src/model/random-gguf.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";
import { repoRoot } from "./support/paths.ts";
import { runProcess, runtimeExecutable } from "./support/proc.ts";

const env = (globalThis as any).process?.env ?? {};
const LLAMA = env.LLAMA_CPP_DIR ?? "/tmp/llama/llama-vk";
const FIXTURE = "qwen3.5-moe-tiny.Q8_0.gguf";

const dir = mkdtempSync(join(tmpdir(), "vkmoe-make-qwen35-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The tool at `path`, or undefined after printing why the checks that need it are skipped. */
function tool(path: string, what: string): string | undefined {
  if (existsSync(path)) return path;
  console.warn(`skipping ${what}: ${path} not found (unpack ../shared/tools/peer as its README says)`);
  return undefined;
}

const tinyPreset = QWEN35_MOE_SHAPES["qwen3.5-tiny"]!;
const bigPreset = QWEN35_MOE_SHAPES["qwen3.6-35b-a3b"]!;
const tokenizer = qwen3TokenizerFiles();

/** The fixture's config.json (../shared/fixtures/qwen3.5-moe-tiny) as a shape: tied, no mrope_section in it. */
const fixtureShape: Qwen35MoeShape = {
  family: "qwen35moe", name: "fixture", contextLength: 32768, hidden: 64, layers: 4, fullAttentionInterval: 4,
  heads: 4, kvHeads: 2, headDim: 32, rotaryDim: 8, experts: 16, topK: 4, expertIntermediate: 64, sharedIntermediate: 96,
  vocab: 151936, tieEmbeddings: true, ropeTheta: 10000, rmsEps: 1e-6,
  linear: { keyHeads: 2, valueHeads: 4, keyDim: 32, valueDim: 32, convKernel: 4 },
  mropeSections: [11, 11, 10, 0], mropeSectionInConfig: false,
};

/** @huggingface/gguf's typed view of a file (an independent reader): type ids, values, tensor infos. */
async function readTyped(path: string) {
  const r = await gguf(path, { allowLocalFile: true, typedMetadata: true });
  const { version, tensor_count, kv_count, ...typed } = r.typedMetadata as Record<string, { value: unknown; type: number; subType?: number }>;
  return { typed, tensors: r.tensorInfos };
}

/** A value as @huggingface/gguf gives it back: f32 rounded, arrays as JS arrays. */
function expectedValue(v: GgufValue): unknown {
  if (v.type === "f32") return Math.fround(v.value);
  if (v.type !== "array") return v.value;
  const values = Array.from(v.value as ArrayLike<unknown>);
  return v.of === "f32" ? values.map((x) => Math.fround(x as number)) : values;
}

const tensorRows = (tensors: { name: string; dtype: number; shape: bigint[] }[]) => tensors.map((t) => `${t.name} ${t.dtype} ${t.shape.join(",")}`);
const planRows = (s: Qwen35MoeShape, type: ModelFileType) => qwen35MoeTensors(s, type).map((t) => `${t.name} ${GgmlType[t.type]} ${t.ne.join(",")}`);
/** A tensor's kind whatever its layer and dims: "blk.N.attn_qkv.weight Q8_0 2-D" -> "attn_qkv.weight Q8_0 2". */
const kinds = (rows: { name: string; type: string; dims: number }[]) => [...new Set(rows.map((r) => `${r.name.replace(/^blk\.\d+\./, "")} ${r.type} ${r.dims}`))].sort();

describe("qwen35moe layout and metadata against llama.cpp's converter (../shared/fixtures)", () => {
  test("tensor names, order, GGUF dims and types equal the converter's Q8_0 file", async () => {
    const path = fixture(FIXTURE);
    if (!path) return;
    expect(planRows(fixtureShape, "q8_0")).toEqual(tensorRows((await readTyped(path)).tensors));
  });

  test("every metadata key in the converter's order with its GGUF type and value (ssm.*, recurrent_layers, rope sections, tokenizer), but general.name", async () => {
    const path = fixture(FIXTURE);
    if (!path) return;
    const theirs = (await readTyped(path)).typed;
    const ours = qwen35MoeMetadata(fixtureShape, "q8_0", tokenizerMetadata(tokenizer, { vocabSize: 151936, pre: "qwen2", fallbackBosToken: "<|endoftext|>" }));
    expect(ours.map(([k]) => k)).toEqual(Object.keys(theirs));
    for (const [key, v] of ours) {
      const t = theirs[key]!;
      expect([key, t.type, t.subType]).toEqual([key, GgufValueTypeId[v.type], v.type === "array" ? GgufValueTypeId[v.of] : undefined]);
      if (key === "general.name") continue;
      const value = expectedValue(v);
      // Arrays of 151,936: compare as a whole only when they differ, to keep the failure readable.
      if (Array.isArray(value) && value.length > 64) {
        const mismatch = value.findIndex((x, i) => x !== (t.value as unknown[])[i]);
        expect([key, (t.value as unknown[]).length, mismatch, value[mismatch]]).toEqual([key, value.length, -1, undefined]);
      } else expect([key, t.value]).toEqual([key, value]);
    }
  });

  test("the presets hold the converter's tensor kinds (plus output.weight: they are untied, the fixture is tied) and its key set", async () => {
    const path = fixture(FIXTURE);
    if (!path) return;
    const g = await readTyped(path);
    const typeName = Object.fromEntries(Object.entries(GgmlType).map(([n, id]) => [id, n]));
    const theirs = kinds(g.tensors.map((t) => ({ name: t.name, type: typeName[t.dtype] ?? String(t.dtype), dims: t.shape.length })));
    const theirKeys = Object.keys(g.typed).sort();
    for (const shape of [tinyPreset, bigPreset]) {
      const plan = qwen35MoeTensors(shape, "q8_0");
      expect([shape.name, kinds(plan.map((t) => ({ name: t.name, type: t.type, dims: t.ne.length })))]).toEqual([shape.name, [...theirs, "output.weight Q8_0 2"].sort()]);
      const tok = tokenizerMetadata(tokenizer, { vocabSize: shape.vocab, pre: "qwen2", fallbackBosToken: "<|endoftext|>" });
      expect([shape.name, qwen35MoeMetadata(shape, "q8_0", tok).map(([k]) => k).sort()]).toEqual([shape.name, theirKeys]);
    }
  });
});

describe("the presets' dimensions", () => {
  test("qwen3.5-tiny: 3 linear + 1 full layers, every row a multiple of 256 (K-quants), two value heads per key head", () => {
    const meta = Object.fromEntries(qwen35MoeMetadata(tinyPreset, "f16", []).map(([k, v]) => [k, expectedValue(v)]));
    expect(meta["qwen35moe.attention.recurrent_layers"]).toEqual([true, true, true, false]);
    for (const t of qwen35MoeTensors(tinyPreset, "f16")) if (t.type !== "F32") expect([t.name, t.ne[0]! % 256]).toEqual([t.name, 0]);
    expect(tinyPreset.linear.valueHeads / tinyPreset.linear.keyHeads).toBe(2);
  });

  test("qwen3.6-35b-a3b: Qwen3.6-35B-A3B's config (40 layers 3:1, 256 experts top-8, 16 x 256 attention heads, 16/32 linear heads of 128), ~35B weights", () => {
    const meta = Object.fromEntries(qwen35MoeMetadata(bigPreset, "q8_0", []).map(([k, v]) => [k, expectedValue(v)]));
    const a = "qwen35moe";
    expect([meta[`${a}.block_count`], meta[`${a}.embedding_length`], meta[`${a}.expert_count`], meta[`${a}.expert_used_count`], meta[`${a}.expert_feed_forward_length`], meta[`${a}.expert_shared_feed_forward_length`]])
      .toEqual([40, 2048, 256, 8, 512, 512]);
    expect([meta[`${a}.attention.head_count`], meta[`${a}.attention.head_count_kv`], meta[`${a}.attention.key_length`], meta[`${a}.rope.dimension_count`], meta[`${a}.rope.freq_base`], meta[`${a}.context_length`]])
      .toEqual([16, 2, 256, 64, 1e7, 262144]);
    expect([meta[`${a}.ssm.group_count`], meta[`${a}.ssm.time_step_rank`], meta[`${a}.ssm.state_size`], meta[`${a}.ssm.inner_size`], meta[`${a}.ssm.conv_kernel`], meta[`${a}.full_attention_interval`]])
      .toEqual([16, 32, 128, 4096, 4, 4]);
    expect(meta[`${a}.attention.recurrent_layers`]).toEqual(Array.from({ length: 40 }, (_, i) => i % 4 !== 3));
    expect(meta[`${a}.rope.dimension_sections`]).toEqual([11, 11, 10, 0]);
    const weights = qwen35MoeTensors(bigPreset, "q8_0").reduce((n, t) => n + t.ne.reduce((x, y) => x * y, 1), 0);
    expect(weights / 1e9).toBeCloseTo(34.66, 1);
    // gguf-py's size_label: experts x (weights outside the experts + one expert of each layer)
    expect(meta["general.size_label"]).toBe("256x2.6B");
  });
});

/** The mix types llama-quantize gives these files, by ftype name. */
const MIXES: [ModelFileType, string][] = [["q4_k_m", "Q4_K_M"], ["q5_k_m", "Q5_K_M"], ["q6_k", "Q6_K"], ["q5_0", "Q5_0"]];
const VOCAB = 1024;
const cutTokenizer = truncateBpeTokenizer(tokenizer, VOCAB);
/** The cut tokenizer's 26 added (special) tokens come last (bpe-truncate.ts); llama.cpp prints none and stops at its end-of-generation ones. */
const firstSpecial = VOCAB - 26;

async function make(shape: Qwen35MoeShape, fileType: ModelFileType, name: string): Promise<string> {
  const path = join(dir, name);
  await writeRandomModel({ shape: { ...shape, vocab: VOCAB }, fileType, path, seed: 1, threads: 2, tokenizer: cutTokenizer });
  return path;
}

/** llama-quantize --dry-run's choice for every tensor: its lines `[ i/ n] NAME - [...], type = IN, ... -> ... (OUT)`. */
function dryRun(quantize: string, f16: string, ftype: string): Record<string, string> {
  const r = runProcess([quantize, "--dry-run", f16, ftype, "2"]);
  expect(r.code).toBe(0);
  const types: Record<string, string> = {};
  for (const line of (r.stdout + r.stderr).split("\n")) {
    const m = /^\[\s*\d+\/\s*\d+\]\s+(\S+)\s+-.*type =\s+(\w+),.*?(?:\((\w+)\))?\s*$/.exec(line);
    if (m) types[m[1]!] = (m[3] ?? m[2]!).toUpperCase();
  }
  return types;
}

describe("K-quant mixes against llama.cpp's llama-quantize", () => {
  test("8 layers (use_more_bits on attn_qkv / attn_v and both ffn_downs) and 8 experts (Q8_0 attn_qkv/attn_v/attn_k): --dry-run's type for every tensor", async () => {
    const quantize = tool(`${LLAMA}/llama-quantize`, "the llama-quantize comparison");
    if (!quantize) return;
    for (const shape of [{ ...tinyPreset, layers: 8 }, { ...tinyPreset, experts: 8, topK: 2 }]) {
      const f16 = await make(shape, "f16", `dry.${shape.layers}.${shape.experts}.f16.gguf`);
      for (const [fileType, ftype] of MIXES) {
        const plan = Object.fromEntries(qwen35MoeTensors({ ...shape, vocab: VOCAB }, fileType).map((t) => [t.name, t.type as string]));
        expect([shape.layers, shape.experts, ftype, dryRun(quantize, f16, ftype)]).toEqual([shape.layers, shape.experts, ftype, plan]);
      }
      rmSync(f16);
    }
    // What the cases exercise: attn_qkv takes attn_v's more-bits rule, by layer.
    const q4km = Object.fromEntries(qwen35MoeTensors({ ...tinyPreset, layers: 8 }, "q4_k_m").map((t) => [t.name, t.type as string]));
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((i) => q4km[`blk.${i}.attn_qkv.weight`] ?? q4km[`blk.${i}.attn_v.weight`])).toEqual(["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"]);
  }, 30_000);
});

interface Greedy {
  ids: number[];
  margins: number[];
}

function greedy(model: Model, prompt: string, n: number): Greedy {
  const s = model.session({ ctx: 64 });
  let logits = s.prefill(model.tokenizer.encode(prompt));
  const ids: number[] = [], margins: number[] = [];
  for (let i = 0; i < n; i++) {
    expect(logits.every(Number.isFinite)).toBe(true);
    const [top, second] = topTwo(logits);
    ids.push(top);
    margins.push(logits[top]! - logits[second]!);
    logits = s.step(top);
  }
  return { ids, margins };
}

function topTwo(v: Float32Array): [number, number] {
  let a = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[a]!) a = i;
  let b = a === 0 ? 1 : 0;
  for (let i = 0; i < v.length; i++) if (i !== a && v[i]! > v[b]!) b = i;
  return [a, b];
}

function std(x: Float32Array): number {
  const mean = x.reduce((a, b) => a + b, 0) / x.length;
  return Math.sqrt(x.reduce((a, b) => a + (b - mean) ** 2, 0) / x.length);
}

const PROMPTS = ["hi", "Once upon a time", "1 2 3 4", "The sky is", "I think"];
const STEPS = 12;
/**
 * vkmoe computes with f32 activations; llama.cpp's CPU backend rounds them to f16 (F16 weights) or
 * 8 bits (Q8_0, Q4_0) before each dot product: a top-2 margin below this may flip.
 */
const MARGIN = 0.2;
const cpu = () => ({ ...readConfig(), VKMOE_GPU: false });

describe("qwen3.5-tiny files (vocab 1024): vkmoe's CPU path and llama.cpp's", () => {
  const paths = {} as Record<"f16" | "q8_0" | "q4_0", string>;

  test("the script writes q8_0 and prints its size and time; f16 and q4_0 of the same seed; each read back as planned", async () => {
    paths.q8_0 = join(dir, "tiny.q8_0.gguf");
    const r = runProcess([runtimeExecutable(), "scripts/make-model.ts", "--shape", "qwen3.5-tiny", "--type", "q8_0", "--vocab", String(VOCAB), "--threads", "2", "--out", paths.q8_0], { cwd: repoRoot });
    expect(r.stderr).not.toContain("error");
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toMatch(new RegExp(`^${paths.q8_0}: [\\d.]+ MB \\(${statSync(paths.q8_0).size} bytes, 76 tensors\\) in [\\d.]+ s$`));
    paths.f16 = await make(tinyPreset, "f16", "tiny.f16.gguf");
    paths.q4_0 = await make(tinyPreset, "q4_0", "tiny.q4_0.gguf");
    for (const [type, path] of Object.entries(paths) as [ModelFileType, string][]) {
      using file = await openGguf(path);
      expect(file.metadata["general.architecture"]).toBe("qwen35moe");
      const rows = [...file.tensors].map(([name, v]) => `${name} ${v.dtype} ${[...v.shape].reverse().join(",")}`);
      expect(rows).toEqual(qwen35MoeTensors({ ...tinyPreset, vocab: VOCAB }, type).map((t) => `${t.name} ${t.type} ${t.ne.join(",")}`));
    }
  }, 30_000);

  test("Model.load runs each on the CPU path: finite logits, spread (not constant), Q8_0 and Q4_0 near the F16 file's model", async () => {
    using f = await Model.load(paths.f16, { env: cpu(), log: () => {} });
    expect(f.device.mode).toBe("cpu");
    const config = f.config;
    expect(config.architecture).toBe("qwen3_5_moe");
    expect(config.architecture === "qwen3_5_moe" && config.layerTypes).toEqual(["linear", "linear", "linear", "full"]);
    const prompt = f.tokenizer.encode("Once upon a time");
    const reference = f.session({ ctx: 64 }).prefill(prompt).slice();
    expect(std(reference)).toBeGreaterThan(1);
    for (const [type, bound] of [["q8_0", 1e-2], ["q4_0", 0.2]] as const) {
      using m = await Model.load(paths[type], { env: cpu(), log: () => {} });
      const logits = m.session({ ctx: 64 }).prefill(prompt);
      const e = nmse(reference, logits);
      console.log(`${type}: last logits' NMSE against the f16 file's: ${e.toExponential(3)}`);
      expect(e).toBeLessThan(bound);
      expect(e).toBeGreaterThan(0);
    }
    const g = greedy(f, "hi", 4);
    expect(new Set(g.ids).size).toBeGreaterThan(1);
  }, 30_000);

  test("random values in the converter's conventions: norms near 1 (it adds 1), ssm_a < 0 so every decay is in (0, 1), dt_bias near 1, conv of its kernel's fan-in", async () => {
    using file = await openGguf(paths.f16);
    const f32 = (name: string) => {
      const v = file.tensors.get(name)!;
      expect([name, v.dtype]).toEqual([name, "F32"]);
      return new Float32Array(v.bytes.slice().buffer);
    };
    const stats = (x: Float32Array) => ({ mean: x.reduce((a, b) => a + b, 0) / x.length, std: std(x), min: Math.min(...x), max: Math.max(...x) });
    for (const name of ["blk.0.attn_norm.weight", "blk.1.post_attention_norm.weight", "blk.2.ssm_norm.weight", "blk.3.attn_q_norm.weight", "output_norm.weight"]) {
      const n = stats(f32(name));
      expect([name, Math.abs(n.mean - 1) < 0.05, n.std > 0.05, n.min > 0.5]).toEqual([name, true, true, true]);
    }
    for (let l = 0; l < 3; l++) {
      const a = stats(f32(`blk.${l}.ssm_a`)), dt = stats(f32(`blk.${l}.ssm_dt.bias`));
      // exp(ssm_a · softplus(alpha + dt_bias)): ssm_a < 0 keeps it below 1 whatever alpha is
      expect([l, a.max < 0, a.min > -2, Math.abs(dt.mean - 1) < 0.2]).toEqual([l, true, true, true]);
    }
    const conv = stats(f32("blk.0.ssm_conv1d.weight"));
    expect(conv.std * Math.sqrt(tinyPreset.linear.convKernel)).toBeCloseTo(1, 1);
    expect(Math.abs(conv.mean)).toBeLessThan(0.02);
  });

  /** llama-completion's greedy text on `path` against vkmoe's tokens on the same file, for each prompt. */
  async function compareWithLlama(path: string, what: string, margin: number) {
    const completion = tool(`${LLAMA}/llama-completion`, "the llama-completion comparison");
    if (!completion) return;
    using model = await Model.load(path, { env: cpu(), log: () => {} });
    let compared = 0;
    for (const prompt of PROMPTS) {
      const r = runProcess([completion, "-m", path, "-ngl", "0", "--temp", "0", "-n", String(STEPS), "-p", prompt, "-no-cnv", "--no-display-prompt", "--no-warmup", "-t", "2"]);
      expect(r.code).toBe(0);
      const { ids, margins } = greedy(model, prompt, STEPS);
      // Decisive steps: from the first, while the margin holds and before a special token (llama.cpp prints none, and stops at some).
      let decisive = 0;
      while (decisive < STEPS && margins[decisive]! >= margin && ids[decisive]! < firstSpecial) decisive++;
      // The most of vkmoe's tokens whose text llama.cpp's output starts with.
      let same = 0;
      while (same < STEPS && r.stdout.startsWith(model.tokenizer.decode(ids.slice(0, same + 1), { skipSpecial: true }))) same++;
      console.log(`${what} ${JSON.stringify(prompt)}: llama.cpp ${JSON.stringify(r.stdout.slice(0, 60))}, vkmoe ${JSON.stringify(model.tokenizer.decode(ids, { skipSpecial: true }))}: the same for ${same} of ${STEPS} tokens (${decisive} decisive; margins ${margins.map((m) => m.toFixed(2)).join(" ")})`);
      expect([prompt, same >= decisive]).toEqual([prompt, true]);
      compared += decisive;
    }
    // Not vacuous: enough decisive tokens across the prompts.
    expect(compared).toBeGreaterThanOrEqual(6);
  }

  for (const type of ["f16", "q8_0", "q4_0"] as const) {
    test(`${type}: llama-completion loads it and generates vkmoe's greedy tokens while vkmoe's top-2 margin is at least ${MARGIN}`, async () => {
      await compareWithLlama(paths[type], type, MARGIN);
    }, 30_000);
  }

  test("q4_k_m (llama-quantize's mix): the same, at margins of at least 0.5 (llama.cpp rounds activations to 8 bits before K-quant dot products)", async () => {
    const path = await make(tinyPreset, "q4_k_m", "tiny.q4_k_m.gguf");
    await compareWithLlama(path, "q4_k_m", 0.5);
  }, 30_000);
});
