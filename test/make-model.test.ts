// `bun run make-model`: GGML's block encoders on hand-computed vectors, the GGUF writer read back by
// @huggingface/gguf, the qwen3moe layout and metadata against the file llama.cpp's converter wrote,
// tiny random models of each type, determinism, and the script's one-line errors.
import { afterAll, describe, expect, test } from "bun:test";
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gguf } from "@huggingface/gguf";
import { encodeF16, encodeQ4_0, encodeQ8_0 } from "../src/formats/ggml-quantize.ts";
import { type GgufMetadata, GgufValueTypeId, GgufWriter, type GgufValue, GgmlType, ggmlTensorBytes } from "../src/formats/gguf-writer.ts";
import { tokenizerMetadata } from "../src/formats/hf-tokenizer-gguf.ts";
import { truncateBpeTokenizer } from "../src/formats/bpe-truncate.ts";
import { ChunkPool } from "../src/model/chunk-pool.ts";
import { f16BitsToF32, f32ToF16Bits } from "../src/quant/half.ts";
import { type ModelFileType, qwen3MoeMetadata, qwen3MoeTensors } from "../src/model/qwen3moe-gguf-layout.ts";
import { qwen3TokenizerFiles, writeRandomModel } from "../src/model/random-gguf.ts";
import { type Qwen3MoeShape, QWEN3_MOE_SHAPES } from "../src/model/shapes.ts";
import { fixture } from "./support/fixtures.ts";
import { repoRoot } from "./support/paths.ts";
import { runProcess, runtimeExecutable } from "./support/proc.ts";

const dir = mkdtempSync(join(tmpdir(), "vkmoe-make-model-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const tiny = QWEN3_MOE_SHAPES.tiny!;
const tokenizer = qwen3TokenizerFiles();
const hex = (bytes: Uint8Array) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join(" ");

function block(entries: Record<number, number>): Float32Array {
  const x = new Float32Array(32);
  for (const [i, v] of Object.entries(entries)) x[Number(i)] = v;
  return x;
}

describe("GGML block encoders (quantize_row_q8_0_ref / quantize_row_q4_0_ref)", () => {
  test("Q8_0: all zeros is d = 0 and q = 0", () => {
    const out = new Uint8Array(34);
    expect(encodeQ8_0(new Float32Array(32), out)).toBe(34);
    expect(hex(out)).toBe(hex(new Uint8Array(34)));
  });

  test("Q8_0: one large outlier sets d = 254/127 = 2 (half 0x4000); halves round away from zero", () => {
    const out = new Uint8Array(34);
    encodeQ8_0(block({ 0: 254, 1: 1, 2: -1, 3: 3, 4: -3, 5: 0.98, 31: -5 }), out);
    // x/2: 127, 0.5 -> 1, -0.5 -> -1, 1.5 -> 2, -1.5 -> -2, 0.49 -> 0, -2.5 -> -3 (roundf, not Math.round)
    const q = new Int8Array(32);
    q.set([127, 1, -1, 2, -2, 0]);
    q[31] = -3;
    expect(hex(out)).toBe(hex(new Uint8Array([0x00, 0x40, ...new Uint8Array(q.buffer)])));
  });

  test("Q8_0: d = 1/127 is stored as the nearest half (0x2008); q uses the f32 d, not the half", () => {
    const out = new Uint8Array(34);
    encodeQ8_0(block({ 0: 1, 1: 0.5, 2: -0.25, 3: 0.1 }), out);
    // id = fround(1 / fround(1/127)) = 127 exactly in f32: 63.5 -> 64, -31.75 -> -32, 12.7 -> 13
    expect(hex(out.subarray(0, 6))).toBe(hex(new Uint8Array([0x08, 0x20, 127, 64, 0xe0, 13])));
  });

  test("Q4_0: all zeros is d = 0 / -8 = -0 (half 0x8000, as C computes it) and every nibble 8", () => {
    const out = new Uint8Array(18);
    expect(encodeQ4_0(new Float32Array(32), out)).toBe(18);
    expect(hex(out)).toBe(hex(new Uint8Array([0x00, 0x80, ...new Array(16).fill(0x88)])));
  });

  test("Q4_0: the first value of largest magnitude, negative here, gives d = -16/-8 = 2; q = min(15, trunc(x/d + 8.5))", () => {
    const out = new Uint8Array(18);
    encodeQ4_0(block({ 1: -16, 2: 16, 3: 1, 4: -1, 5: 3, 6: -3, 16: 0.2, 17: 5 }), out);
    // nibbles j (low) and j+16 (high): -16 -> 0, 16 -> 16.5 -> 15, 1 -> 9, -1 -> 8, 3 -> 10, -3 -> 7, 0.2 -> 8, 5 -> 11
    const qs = new Array(16).fill(0x88);
    qs[0] = 0x88; qs[1] = 0xb0; qs[2] = 0x8f; qs[3] = 0x89; qs[4] = 0x88; qs[5] = 0x8a; qs[6] = 0x87;
    expect(hex(out)).toBe(hex(new Uint8Array([0x00, 0x40, ...qs])));
  });

  test("Q4_0: a positive maximum gives a negative d (8 -> d = -1, half 0xbc00), so the nibbles flip", () => {
    const out = new Uint8Array(18);
    encodeQ4_0(block({ 0: 8, 1: -8, 2: 4.4 }), out);
    // x * -1 + 8.5: 8 -> 0, -8 -> 16.5 -> 15, 4.4 -> 4.1 -> 4, 0 -> 8
    expect(hex(out.subarray(0, 6))).toBe(hex(new Uint8Array([0x00, 0xbc, 0x80, 0x8f, 0x84, 0x88])));
  });

  test("encoders take whole blocks only", () => {
    expect(() => encodeQ8_0(new Float32Array(31), new Uint8Array(64))).toThrow(/32/);
    expect(() => encodeQ4_0(new Float32Array(64), new Uint8Array(35))).toThrow(/fit/);
  });

  test("F16: the Float16Array path and the scalar path give f32ToF16Bits' bits", () => {
    const x = new Float32Array([0, -0, 1, -2.5, 65504, 65520, 1e-8, 6e-5, 3.14159, -1e-3, 2 ** -24, 2 ** -25, 0.1]);
    const aligned = new Uint8Array(2 * x.length);
    const unaligned = new Uint8Array(2 * x.length + 1);
    encodeF16(x, aligned);
    encodeF16(x, unaligned, 1); // odd offset: the scalar fallback
    const expected = new Uint8Array(new Uint16Array([...x].map(f32ToF16Bits)).buffer);
    expect(hex(aligned)).toBe(hex(expected));
    expect(hex(unaligned.subarray(1))).toBe(hex(expected));
  });
});

/** A value as @huggingface/gguf gives it back: f32 rounded, arrays as JS arrays. */
function expectedValue(v: GgufValue): unknown {
  if (v.type === "f32") return Math.fround(v.value);
  if (v.type !== "array") return v.value;
  const values = Array.from(v.value as ArrayLike<unknown>);
  return v.of === "f32" ? values.map((x) => Math.fround(x as number)) : values;
}

/** @huggingface/gguf's typed view of a file: type ids, values, tensor infos (parsed once a file: ~0.6 s each). */
const parsed = new Map<string, ReturnType<typeof parseGguf>>();
function readGguf(path: string): ReturnType<typeof parseGguf> {
  if (!parsed.has(path)) parsed.set(path, parseGguf(path));
  return parsed.get(path)!;
}

async function parseGguf(path: string) {
  const r = await gguf(path, { allowLocalFile: true, typedMetadata: true });
  const { version, tensor_count, kv_count, ...typed } = r.typedMetadata as Record<string, { value: unknown; type: number; subType?: number }>;
  return { version: version!.value, typed, metadata: r.metadata as Record<string, unknown>, tensors: r.tensorInfos, dataOffset: Number(r.tensorDataOffset) };
}

function readBytes(path: string, position: number, length: number): Uint8Array {
  const fd = openSync(path, "r");
  try {
    const out = new Uint8Array(length);
    readSync(fd, out, 0, length, position);
    return out;
  } finally {
    closeSync(fd);
  }
}

describe("GGUF writer", () => {
  test("every value type, and tensors at 32-aligned offsets, read back by @huggingface/gguf", async () => {
    const path = join(dir, "types.gguf");
    const meta: GgufMetadata = [
      ["a.u8", { type: "u8", value: 255 }], ["a.i8", { type: "i8", value: -128 }],
      ["a.u16", { type: "u16", value: 65535 }], ["a.i16", { type: "i16", value: -32768 }],
      ["a.u32", { type: "u32", value: 4294967295 }], ["a.i32", { type: "i32", value: -2147483648 }],
      ["a.f32", { type: "f32", value: 0.1 }], ["a.f64", { type: "f64", value: 0.1 }],
      ["a.bool", { type: "bool", value: true }], ["a.str", { type: "string", value: "héllo ✓" }],
      ["a.u64", { type: "u64", value: 2n ** 63n + 5n }], ["a.i64", { type: "i64", value: -(2n ** 62n) }],
      ["a.strs", { type: "array", of: "string", value: ["", "Ġx", "<|im_end|>"] }],
      ["a.i32s", { type: "array", of: "i32", value: new Int32Array([1, -3, 5]) }],
      ["a.f32s", { type: "array", of: "f32", value: [0.5, -1.25] }],
    ];
    const a = Uint8Array.from({ length: 6 }, (_, i) => i + 1); // [3] F16: 6 bytes, padded to 32
    const b = Uint8Array.from({ length: 34 }, (_, i) => 100 + i); // [32] Q8_0: one block
    const w = GgufWriter.open(path, meta, [{ name: "a", ne: [3], type: "F16" }, { name: "b", ne: [32], type: "Q8_0" }]);
    w.write(a.subarray(0, 4));
    w.write(a.subarray(4));
    w.write(b);
    w.close();
    const g = await readGguf(path);
    expect(g.version).toBe(3);
    for (const [key, v] of meta) {
      const got = g.typed[key]!;
      expect([key, got.type, got.subType]).toEqual([key, GgufValueTypeId[v.type], v.type === "array" ? GgufValueTypeId[v.of] : undefined]);
      expect([key, got.value]).toEqual([key, expectedValue(v)]);
    }
    expect(g.tensors.map((t) => [t.name, t.dtype, t.shape.map(Number), Number(t.offset)])).toEqual([["a", GgmlType.F16, [3], 0], ["b", GgmlType.Q8_0, [32], 32]]);
    expect(g.dataOffset % 32).toBe(0);
    expect(readBytes(path, g.dataOffset, 6)).toEqual(a);
    expect(readBytes(path, g.dataOffset + 32, 34)).toEqual(b);
    expect(statSync(path).size).toBe(g.dataOffset + 32 + 64);
  });

  test("a write past a tensor's end, a short tensor at close, and an out-of-range u32 are errors", () => {
    const path = join(dir, "bad.gguf");
    const w = GgufWriter.open(path, [], [{ name: "t", ne: [4], type: "F32" }]);
    expect(() => w.write(new Uint8Array(17))).toThrow(/t takes 16 bytes/);
    w.write(new Uint8Array(8));
    expect(() => w.close()).toThrow(/closed with tensor t at 8 of 16 bytes/);
    expect(() => GgufWriter.open(path, [["k", { type: "u32", value: -1 }]], [])).toThrow(/not a u32/);
    expect(() => GgufWriter.open(path, [], [{ name: "q", ne: [48], type: "Q4_0" }])).toThrow(/multiple of 32/);
  });
});

describe("chunk pool", () => {
  test("workers and this thread make the same bytes; a chunk that fails in a worker rejects with its message", async () => {
    const job = { seed: 9, tensor: 3, chunk: 1, type: "Q4_0" as const, values: 4096, mean: 0, std: 0.1, kQuantSearch: true };
    using inline = new ChunkPool(1);
    using workers = new ChunkPool(2);
    const [a, b] = await Promise.all([inline.make(job), workers.make(job)]);
    expect(b.length).toBe(4096 / 32 * 18);
    expect(hex(b)).toBe(hex(a));
    await expect(workers.make({ ...job, values: 31 })).rejects.toThrow(/blocks hold 32 values; got 31/);
    // the K-quants' search setting reaches the workers: each setting's bytes as this thread's, the two different
    const k = { ...job, type: "Q4_K" as const };
    const [searched, plain, plainInline] = await Promise.all([workers.make(k), workers.make({ ...k, kQuantSearch: false }), inline.make({ ...k, kQuantSearch: false })]);
    expect(hex(plain)).toBe(hex(plainInline));
    expect(hex(plain)).not.toBe(hex(searched));
  });
});

/** The fixture's Hugging Face config as a shape (fixtures/README.md). */
const fixtureShape: Qwen3MoeShape = {
  name: "fixture", hidden: 64, layers: 3, heads: 4, kvHeads: 2, headDim: 32, experts: 16, topK: 4, expertIntermediate: 64,
  denseIntermediate: 256, vocab: 151936, ropeTheta: 1e6, rmsEps: 1e-6, contextLength: 40960, normTopkProb: true,
};

const tensorRows = (tensors: { name: string; dtype: number; shape: bigint[] }[]) => tensors.map((t) => `${t.name} ${t.dtype} ${t.shape.join(",")}`);
const planRows = (s: Qwen3MoeShape, type: ModelFileType) => qwen3MoeTensors(s, type).map((t) => `${t.name} ${GgmlType[t.type]} ${t.ne.join(",")}`);

describe("qwen3moe layout and metadata against llama.cpp's converter (../shared/fixtures)", () => {
  test("tensor names, order, GGUF dims and types equal the converter's Q8_0 file, and llama-quantize's Q4_0 file as a set", async () => {
    const q8 = fixture("qwen3-moe-tiny.Q8_0.gguf");
    const q4 = fixture("qwen3-moe-tiny.Q4_0.gguf");
    if (!q8 || !q4) return;
    expect(planRows(fixtureShape, "q8_0")).toEqual(tensorRows((await readGguf(q8)).tensors));
    expect(planRows(fixtureShape, "q4_0").sort()).toEqual(tensorRows((await readGguf(q4)).tensors).sort());
  });

  test("every metadata key in the converter's order with its GGUF type and value (tokens, types, merges, template included), but general.name", async () => {
    const q8 = fixture("qwen3-moe-tiny.Q8_0.gguf");
    if (!q8) return;
    const theirs = (await readGguf(q8)).typed;
    const ours = qwen3MoeMetadata(fixtureShape, "q8_0", tokenizerMetadata(tokenizer, { vocabSize: 151936, pre: "qwen2", fallbackBosToken: "<|endoftext|>" }));
    expect(ours.map(([k]) => k)).toEqual(Object.keys(theirs));
    for (const [key, v] of ours) {
      const t = theirs[key]!;
      expect([key, t.type, t.subType]).toEqual([key, GgufValueTypeId[v.type], v.type === "array" ? GgufValueTypeId[v.of] : undefined]);
      if (key === "general.name") continue;
      const value = expectedValue(v);
      // Arrays of 151,936: compare as a whole only when they differ, to keep the failure readable.
      if (Array.isArray(value)) {
        const mismatch = value.findIndex((x, i) => x !== (t.value as unknown[])[i]);
        expect([key, (t.value as unknown[]).length, mismatch, value[mismatch]]).toEqual([key, value.length, -1, undefined]);
      } else expect([key, t.value]).toEqual([key, value]);
    }
  });
});

function sameBytes(a: string, b: string): boolean {
  return Buffer.compare(readFileSync(a), readFileSync(b)) === 0;
}

describe("make-model, tiny shape", () => {
  // Made by the first two tests, read by the rest (bun runs a file's tests in order).
  const paths = {} as Record<ModelFileType, string>;
  const make = async (type: ModelFileType, seed = 1, threads = 2, name = `tiny.${type}.gguf`) => {
    const path = join(dir, name);
    const report = await writeRandomModel({ shape: tiny, fileType: type, path, seed, threads, tokenizer });
    expect(report.bytes).toBe(statSync(path).size);
    return path;
  };

  test("the script writes a q8_0 file and prints its size and time in one line", () => {
    paths.q8_0 = join(dir, "tiny.q8_0.gguf");
    const r = runProcess([runtimeExecutable(), "scripts/make-model.ts", "--shape", "tiny", "--type", "q8_0", "--out", paths.q8_0, "--threads", "2"], { cwd: repoRoot });
    expect(r.stderr).not.toContain("error");
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toMatch(new RegExp(`^${paths.q8_0}: [\\d.]+ MB \\(${statSync(paths.q8_0).size} bytes, 27 tensors\\) in [\\d.]+ s$`));
    expect(existsSync(`${paths.q8_0}.partial`)).toBe(false);
  }, 30_000);

  test("q4_0 and f16 files, and the same seed again on one thread (not two) gives the same bytes", async () => {
    paths.q4_0 = await make("q4_0");
    paths.f16 = await make("f16");
    expect(sameBytes(await make("q8_0", 1, 1, "again.q8_0.gguf"), paths.q8_0)).toBe(true);
  }, 30_000);

  for (const type of ["q8_0", "q4_0", "f16"] as const) {
    test(`${type}: architecture, metadata values, every tensor's name, type and dims, and the file's size`, async () => {
      const g = await readGguf(paths[type]);
      const m = g.metadata;
      expect(m["general.architecture"]).toBe("qwen3moe");
      expect(m["general.file_type"]).toBe({ f16: 1, q4_0: 2, q8_0: 7 }[type]);
      const keys: [string, number][] = [
        ["block_count", tiny.layers], ["context_length", tiny.contextLength], ["embedding_length", tiny.hidden],
        ["feed_forward_length", tiny.denseIntermediate], ["attention.head_count", tiny.heads], ["attention.head_count_kv", tiny.kvHeads],
        ["rope.freq_base", tiny.ropeTheta], ["attention.layer_norm_rms_epsilon", Math.fround(tiny.rmsEps)], ["expert_count", tiny.experts],
        ["expert_used_count", tiny.topK], ["expert_feed_forward_length", tiny.expertIntermediate],
        ["attention.key_length", tiny.headDim], ["attention.value_length", tiny.headDim],
      ];
      for (const [k, v] of keys) expect([k, m[`qwen3moe.${k}`]]).toEqual([k, v]);
      expect([m["tokenizer.ggml.model"], m["tokenizer.ggml.pre"], m["tokenizer.ggml.eos_token_id"], m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.padding_token_id"], m["tokenizer.ggml.add_bos_token"]])
        .toEqual(["gpt2", "qwen2", 151645, 151643, 151643, false]);
      expect((m["tokenizer.ggml.tokens"] as string[]).length).toBe(tiny.vocab);
      expect(m["tokenizer.chat_template"]).toBe((tokenizer.config as { chat_template: string }).chat_template);

      const expected = qwen3MoeTensors(tiny, type);
      expect(tensorRows(g.tensors)).toEqual(planRows(tiny, type));
      const f32 = new Set(expected.filter((t) => t.type === "F32").map((t) => t.name.replace(/^blk\.\d+\./, "")));
      expect([...f32].sort()).toEqual(["attn_k_norm.weight", "attn_norm.weight", "attn_q_norm.weight", "ffn_gate_inp.weight", "ffn_norm.weight", "output_norm.weight"]);
      const outputType = { q8_0: "Q8_0", q4_0: "Q8_0", f16: "F16" }[type];
      expect(expected.find((t) => t.name === "output.weight")!.type).toBe(outputType as "Q8_0");
      expect(expected.find((t) => t.name === "token_embd.weight")!.type).toBe({ q8_0: "Q8_0", q4_0: "Q4_0", f16: "F16" }[type] as "Q8_0");
      let end = 0;
      g.tensors.forEach((t, i) => {
        expect(Number(t.offset) % 32).toBe(0);
        expect(Number(t.offset)).toBeGreaterThanOrEqual(end);
        end = Number(t.offset) + ggmlTensorBytes(expected[i]!.type, expected[i]!.ne);
      });
      expect(statSync(paths[type]).size).toBe(g.dataOffset + Math.ceil(end / 32) * 32);
    });
  }

  test("one seed is one model at every precision: F32 tensors identical, Q8_0 within half a step of F16", async () => {
    const files = await Promise.all((["q8_0", "q4_0", "f16"] as const).map(async (type) => ({ type, g: await readGguf(paths[type]) })));
    const bytesOf = (type: ModelFileType, name: string) => {
      const { g } = files.find((f) => f.type === type)!;
      const i = g.tensors.findIndex((t) => t.name === name);
      const spec = qwen3MoeTensors(tiny, type)[i]!;
      return readBytes(paths[type], g.dataOffset + Number(g.tensors[i]!.offset), ggmlTensorBytes(spec.type, spec.ne));
    };
    for (const name of ["blk.1.ffn_gate_inp.weight", "blk.0.attn_q_norm.weight", "output_norm.weight"]) {
      expect(hex(bytesOf("q4_0", name))).toBe(hex(bytesOf("q8_0", name)));
      expect(hex(bytesOf("f16", name))).toBe(hex(bytesOf("q8_0", name)));
    }
    const q8 = bytesOf("q8_0", "blk.1.attn_v.weight");
    const h = bytesOf("f16", "blk.1.attn_v.weight");
    let worst = 0;
    for (let b = 0; b < q8.length / 34; b++) {
      const d = f16BitsToF32(q8[b * 34]! | (q8[b * 34 + 1]! << 8));
      for (let j = 0; j < 32; j++) {
        const q = (q8[b * 34 + 2 + j]! << 24) >> 24;
        const i = b * 32 + j;
        const f = f16BitsToF32(h[2 * i]! | (h[2 * i + 1]! << 8));
        worst = Math.max(worst, Math.abs(q * d - f) / d);
      }
    }
    // Half a step, plus the half rounding of d and of the F16 values (each up to 127 * 2^-11 steps).
    expect(worst).toBeLessThan(0.5 + 2 * 127 * 2 ** -11);
  });

  test("weights are decisive, not flat: router and lm_head spread as planned, norms near 1", async () => {
    const g = await readGguf(paths.f16);
    const f32Tensor = (name: string) => {
      const i = g.tensors.findIndex((t) => t.name === name);
      const n = g.tensors[i]!.shape.reduce((a, b) => a * Number(b), 1);
      const b = readBytes(paths.f16, g.dataOffset + Number(g.tensors[i]!.offset), 4 * n);
      return new Float32Array(b.buffer);
    };
    const stats = (x: Float32Array) => {
      const mean = x.reduce((a, b) => a + b, 0) / x.length;
      return { mean, std: Math.sqrt(x.reduce((a, b) => a + (b - mean) ** 2, 0) / x.length) };
    };
    const lmHead = g.tensors.find((t) => t.name === "output.weight")!;
    const firstRows = readBytes(paths.f16, g.dataOffset + Number(lmHead.offset), 2 * 4096 * tiny.hidden);
    const logitWeights = Float32Array.from(new Uint16Array(firstRows.buffer), f16BitsToF32);
    expect(stats(logitWeights).std * Math.sqrt(tiny.hidden)).toBeCloseTo(4, 1); // logits of std ~4: a clear top token
    const router = stats(f32Tensor("blk.0.ffn_gate_inp.weight"));
    expect(router.std * Math.sqrt(tiny.hidden)).toBeCloseTo(3, 0); // router logits of std ~3 for a unit-RMS input
    const norm = stats(f32Tensor("blk.1.ffn_norm.weight"));
    expect(Math.abs(norm.mean - 1)).toBeLessThan(0.05);
    expect(norm.std).toBeGreaterThan(0.05);
  });

  test("a different seed changes every tensor's data and nothing else", async () => {
    const other = await make("q8_0", 2, 1, "seed2.q8_0.gguf");
    const g = await readGguf(paths.q8_0);
    const a = readFileSync(paths.q8_0);
    const b = readFileSync(other);
    expect(b.length).toBe(a.length);
    expect(Buffer.compare(a.subarray(0, g.dataOffset), b.subarray(0, g.dataOffset))).toBe(0);
    const plan = qwen3MoeTensors(tiny, "q8_0");
    g.tensors.forEach((t, i) => {
      const start = g.dataOffset + Number(t.offset);
      const end = start + ggmlTensorBytes(plan[i]!.type, plan[i]!.ne);
      expect([t.name, Buffer.compare(a.subarray(start, end), b.subarray(start, end)) !== 0]).toEqual([t.name, true]);
    });
  }, 30_000);
});

describe("make-model flags", () => {
  const cases: [string, string[], RegExp][] = [
    ["no options", [], /--shape is required; --type .*is required; --out is required/],
    ["an unknown shape", ["--shape", "huge", "--type", "q8_0", "--out", "X"], /--shape must be one of tiny, qwen3-30b-a3b/],
    ["an unknown type", ["--shape", "tiny", "--type", "q5_k", "--out", "X"], /--type must be one of q4_0, q8_0, f16/],
    ["an unknown option", ["--shape", "tiny", "--type", "q8_0", "--out", "X", "--fast"], /unknown option --fast/],
    ["an unknown option with a value", ["--shape=tiny", "--type=q8_0", "--out=X", "--fast=1"], /unknown option --fast/],
    ["a bad seed", ["--shape", "tiny", "--type", "q8_0", "--out", "X", "--seed", "-3"], /--seed must be a non-negative integer/],
    ["a seed past 32 bits", ["--shape", "tiny", "--type", "q8_0", "--out", "X", "--seed", "4294967296"], /fit in 32 bits/],
    ["a zero thread count", ["--shape", "tiny", "--type", "q8_0", "--out", "X", "--threads", "0"], /--threads must be at least 1/],
    ["a vocab too small for the byte and special tokens", ["--shape", "tiny", "--type", "q8_0", "--out", "X", "--vocab", "100"], /--vocab must be at least 282/],
    ["an unwritable path", ["--shape", "tiny", "--type", "q8_0", "--out", "/nonexistent-dir/x.gguf"], /cannot write --out .*ENOENT/],
  ];
  for (const [what, args, message] of cases) {
    test(`${what}: exit status 1, one line naming the problem, no stack trace, no file`, () => {
      const r = runProcess([runtimeExecutable(), "scripts/make-model.ts", ...args], { cwd: repoRoot });
      expect(r.code).toBe(1);
      expect(r.stdout).toBe("");
      const lines = r.stderr.trimEnd().split("\n");
      expect(lines.length).toBe(1);
      expect(lines[0]).toMatch(/^make-model: /);
      expect(lines[0]).toMatch(message);
      expect(r.stderr).not.toMatch(/\n\s+at |\.ts:\d+:\d+/);
      expect(existsSync(join(repoRoot, "X")) || existsSync(join(repoRoot, "X.partial"))).toBe(false);
    }, 15_000);
  }
});

describe("--vocab N: the Qwen3 tokenizer cut to N tokens (test/model-kquant.test.ts: llama.cpp tokenizes as vkmoe does)", () => {
  test("the first N - 26 tokens with dense ids, only the merges among them (in rank order), the 26 special tokens renumbered after them", () => {
    const cut = truncateBpeTokenizer(tokenizer, 1024).tokenizer as any;
    const full = tokenizer.tokenizer as any;
    const ids = Object.values(cut.model.vocab as Record<string, number>).sort((a, b) => a - b);
    expect(ids).toEqual(Array.from({ length: 998 }, (_, i) => i));
    for (const [text, id] of Object.entries(cut.model.vocab as Record<string, number>)) expect(full.model.vocab[text]).toBe(id);
    // Qwen's merge i makes token 256 + i: the first 998 - 256 merges are kept, in order.
    expect(cut.model.merges).toEqual(full.model.merges.slice(0, 998 - 256));
    expect(cut.added_tokens.map((t: { id: number; content: string }) => [t.id, t.content])).toEqual(full.added_tokens.map((t: { content: string }, i: number) => [998 + i, t.content]));
    expect(() => truncateBpeTokenizer(tokenizer, 281)).toThrow("a vocab of 281 cannot hold the 256 byte tokens and 26 special tokens (at least 282)");
  });
});
