/**
 * safetensors: the fixture checkpoint against its config.json (every tensor's name, shape, dtype
 * and size), sharded checkpoints, and each kind of bad file.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ModelFileError, ModelFileNotFoundError, TruncatedFileError, UnsupportedTensorTypeError, openSafetensors } from "../src/formats/index.ts";
import { fixture } from "./support/fixtures.ts";

const scratch = mkdtempSync(join(tmpdir(), "vkmoe-st-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

let dirs = 0;
function newDir(): string {
  const dir = join(scratch, `m${dirs++}`);
  mkdirSync(dir);
  return dir;
}

interface Entry {
  name: string;
  dtype: string;
  shape: number[];
  /** Bytes of data; default prod(shape) × item size, filled with a recognisable pattern. */
  bytes?: number;
  /** data_offsets to write instead of the packed ones. */
  offsets?: [number, number];
}

const ITEM: Record<string, number> = { F32: 4, F16: 2, BF16: 2, I8: 1, F8_E4M3: 1, I64: 8 };

/** A safetensors file by hand: tensors packed in order, `header` overriding the JSON text when given. */
function writeSafetensors(path: string, entries: Entry[], opts: { header?: string; cutData?: number } = {}): string {
  const json: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let offset = 0;
  for (const e of entries) {
    const bytes = e.bytes ?? e.shape.reduce((a, b) => a * b, 1) * ITEM[e.dtype]!;
    json[e.name] = { dtype: e.dtype, shape: e.shape, data_offsets: e.offsets ?? [offset, offset + bytes] };
    offset += bytes;
  }
  const header = new TextEncoder().encode(opts.header ?? JSON.stringify(json));
  const out = new Uint8Array(8 + header.length + offset - (opts.cutData ?? 0));
  new DataView(out.buffer).setBigUint64(0, BigInt(header.length), true);
  out.set(header, 8);
  for (let i = 8 + header.length; i < out.length; i++) out[i] = (i * 7) & 0xff;
  writeFileSync(path, out);
  return path;
}

/** What config.json says the checkpoint holds: every tensor's name and shape. */
function expectedTensors(config: any): Map<string, number[]> {
  const D = config.hidden_size, H = config.num_attention_heads, KV = config.num_key_value_heads, hd = config.head_dim;
  const E = config.num_local_experts, I = config.moe_intermediate_size, V = config.vocab_size;
  const out = new Map<string, number[]>([["model.embed_tokens.weight", [V, D]], ["model.norm.weight", [D]], ["lm_head.weight", [V, D]]]);
  for (let l = 0; l < config.num_hidden_layers; l++) {
    const p = `model.layers.${l}`;
    out.set(`${p}.input_layernorm.weight`, [D]);
    out.set(`${p}.post_attention_layernorm.weight`, [D]);
    out.set(`${p}.self_attn.q_proj.weight`, [H * hd, D]);
    out.set(`${p}.self_attn.k_proj.weight`, [KV * hd, D]);
    out.set(`${p}.self_attn.v_proj.weight`, [KV * hd, D]);
    out.set(`${p}.self_attn.o_proj.weight`, [D, H * hd]);
    out.set(`${p}.self_attn.q_norm.weight`, [hd]);
    out.set(`${p}.self_attn.k_norm.weight`, [hd]);
    out.set(`${p}.mlp.gate.weight`, [E, D]);
    for (let e = 0; e < E; e++) {
      out.set(`${p}.mlp.experts.${e}.gate_proj.weight`, [I, D]);
      out.set(`${p}.mlp.experts.${e}.up_proj.weight`, [I, D]);
      out.set(`${p}.mlp.experts.${e}.down_proj.weight`, [D, I]);
    }
  }
  return out;
}

describe("safetensors fixtures", () => {
  test("qwen3-moe-tiny: every tensor config.json implies, BF16, packed edge to edge over the data", () => {
    const dir = fixture("qwen3-moe-tiny");
    if (!dir) return;
    using file = openSafetensors(dir);
    const expected = expectedTensors(JSON.parse(readFileSync(join(dir, "config.json"), "utf8")));
    expect(file.format).toBe("safetensors");
    expect(file.files).toEqual([join(dir, "model.safetensors")]);
    expect(file.metadata).toEqual({ format: "pt" });
    expect(file.tensors.size).toBe(expected.size);
    for (const [name, shape] of expected) {
      const view = file.tensors.get(name);
      expect(view?.name).toBe(name);
      expect(view!.dtype).toBe("BF16");
      expect(view!.shape).toEqual(shape);
      expect(view!.bytes.byteLength).toBe(shape.reduce((a, b) => a * b, 1) * 2);
    }
    // The views cover the data section exactly, with no gap or overlap, up to the end of the file.
    const views = [...file.tensors.values()].sort((a, b) => a.bytes.byteOffset - b.bytes.byteOffset);
    const headerLength = Number(new DataView(readFileSync(join(dir, "model.safetensors")).buffer).getBigUint64(0, true));
    let at = 8 + headerLength;
    for (const v of views) {
      expect(v.bytes.byteOffset).toBe(at);
      at += v.bytes.byteLength;
    }
    expect(at).toBe(file.mappedBytes);
  });

  test("a tensor's bytes are the file's bytes at its offsets (spot check)", () => {
    const dir = fixture("qwen3-moe-tiny");
    if (!dir) return;
    using file = openSafetensors(dir);
    const view = file.tensors.get("model.layers.1.mlp.experts.7.down_proj.weight")!;
    const disk = new Uint8Array(view.bytes.byteLength);
    const fd = openSync(join(dir, "model.safetensors"), "r");
    readSync(fd, disk, 0, disk.length, view.bytes.byteOffset);
    closeSync(fd);
    expect(Buffer.from(view.bytes).equals(Buffer.from(disk))).toBe(true);
  });

  test("qwen3.5-moe-tiny opens: 255 BF16 tensors", () => {
    const dir = fixture("qwen3.5-moe-tiny");
    if (!dir) return;
    using file = openSafetensors(dir);
    expect(file.tensors.size).toBe(255);
    expect(new Set([...file.tensors.values()].map((t) => t.dtype))).toEqual(new Set(["BF16"]));
    expect(file.tensors.get("model.embed_tokens.weight")!.shape).toEqual([151936, 64]);
  });
});

describe("safetensors: sharded checkpoints", () => {
  function shardedDir(): string {
    const dir = newDir();
    writeSafetensors(join(dir, "model-00001-of-00002.safetensors"), [{ name: "a", dtype: "F32", shape: [2, 3] }, { name: "b", dtype: "F16", shape: [5] }]);
    writeSafetensors(join(dir, "model-00002-of-00002.safetensors"), [{ name: "c", dtype: "BF16", shape: [4, 1] }]);
    const weightMap = { a: "model-00001-of-00002.safetensors", c: "model-00002-of-00002.safetensors", b: "model-00001-of-00002.safetensors" };
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: { total_size: 42 }, weight_map: weightMap }));
    return dir;
  }

  test("the index's shards, all mapped, every tensor in one map", () => {
    const dir = shardedDir();
    using file = openSafetensors(dir);
    expect(file.files).toEqual([join(dir, "model-00001-of-00002.safetensors"), join(dir, "model-00002-of-00002.safetensors")]);
    expect([...file.tensors.keys()].sort()).toEqual(["a", "b", "c"]);
    expect(file.tensors.get("a")!.bytes.byteLength).toBe(24);
    expect(file.tensors.get("b")!.dtype).toBe("F16");
    expect(file.tensors.get("c")!.shape).toEqual([4, 1]);
    const shard2 = readFileSync(join(dir, "model-00002-of-00002.safetensors"));
    expect(Array.from(file.tensors.get("c")!.bytes)).toEqual(Array.from(shard2.subarray(shard2.length - 8)));
    expect(file.mappedBytes).toBe(readFileSync(file.files[0]!).length + shard2.length);
  });

  test("missing shard", () => {
    const dir = shardedDir();
    rmSync(join(dir, "model-00002-of-00002.safetensors"));
    expect(() => openSafetensors(dir)).toThrow(ModelFileNotFoundError);
    expect(() => openSafetensors(dir)).toThrow(`${join(dir, "model.safetensors.index.json")}: names shard "model-00002-of-00002.safetensors", which is missing from ${dir}`);
  });

  test("the index names a tensor that its shard does not hold", () => {
    const dir = shardedDir();
    const index = join(dir, "model.safetensors.index.json");
    writeFileSync(index, JSON.stringify({ weight_map: { a: "model-00001-of-00002.safetensors", b: "model-00002-of-00002.safetensors", c: "model-00002-of-00002.safetensors" } }));
    expect(() => openSafetensors(dir)).toThrow(ModelFileError);
    expect(() => openSafetensors(dir)).toThrow(`${index}: says tensor "b" is in model-00002-of-00002.safetensors, but it is in model-00001-of-00002.safetensors`);
    writeFileSync(index, JSON.stringify({ weight_map: { a: "model-00001-of-00002.safetensors", z: "model-00002-of-00002.safetensors" } }));
    expect(() => openSafetensors(dir)).toThrow(`${index}: says tensor "z" is in model-00002-of-00002.safetensors, but no shard holds it`);
  });

  test("a tensor in two shards", () => {
    const dir = shardedDir();
    writeSafetensors(join(dir, "model-00002-of-00002.safetensors"), [{ name: "a", dtype: "F32", shape: [1] }]);
    expect(() => openSafetensors(dir)).toThrow(`${join(dir, "model-00002-of-00002.safetensors")}: tensor "a" is also in ${join(dir, "model-00001-of-00002.safetensors")}: a checkpoint holds each tensor once`);
  });
});

describe("safetensors: bad files", () => {
  const errorOf = (path: string) => {
    try {
      openSafetensors(path);
    } catch (e) {
      return e as ModelFileError;
    }
    throw new Error(`${path} opened`);
  };

  test("missing directory", () => {
    const path = join(scratch, "no-such-model");
    const e = errorOf(path);
    expect(e).toBeInstanceOf(ModelFileNotFoundError);
    expect(e.message).toBe(`${path}: does not exist`);
  });

  test("a directory without model.safetensors or its index", () => {
    const dir = newDir();
    writeFileSync(join(dir, "config.json"), "{}");
    const e = errorOf(dir);
    expect(e).toBeInstanceOf(ModelFileNotFoundError);
    expect(e.message).toBe(`${dir}: no model.safetensors or model.safetensors.index.json in this directory`);
  });

  test("shorter than the header length", () => {
    const path = join(newDir(), "model.safetensors");
    writeFileSync(path, new Uint8Array(5));
    const e = errorOf(path);
    expect(e).toBeInstanceOf(TruncatedFileError);
    expect(e.message).toBe(`${path}: is 5 bytes, shorter than the 8-byte header length that starts a safetensors file`);
  });

  test("truncated header: the length runs past the end of the file", () => {
    const dir = fixture("qwen3-moe-tiny");
    if (!dir) return;
    const path = join(newDir(), "model.safetensors");
    writeFileSync(path, readFileSync(join(dir, "model.safetensors")).subarray(0, 10_000));
    const e = errorOf(path);
    expect(e).toBeInstanceOf(TruncatedFileError);
    expect(e.message).toBe(`${path}: the header is 19872 bytes but the file has only 9992 after the length: the file is truncated (an interrupted download?)`);
  });

  test("a header length no safetensors file has", () => {
    const path = join(newDir(), "model.safetensors");
    writeFileSync(path, new TextEncoder().encode("GGUF\x03\x00\x00\x00 and then some more bytes"));
    const e = errorOf(path);
    expect(e).toBeInstanceOf(ModelFileError);
    expect(e.message).toMatch(/: is not a safetensors file: its first 8 bytes give a header length of \d+, beyond the format's 100000000-byte limit$/);
  });

  test("header that is not JSON", () => {
    const path = writeSafetensors(join(newDir(), "model.safetensors"), [{ name: "a", dtype: "F32", shape: [1] }], { header: '{"a": {"dtype": "F32", ' });
    const e = errorOf(path);
    expect(e).toBeInstanceOf(ModelFileError);
    expect(e.message.startsWith(`${path}: the header is not valid JSON (`)).toBe(true);
    expect(e.message.endsWith("): the file is corrupt or not safetensors")).toBe(true);
  });

  test("truncated data names the tensor that runs past the end", () => {
    const path = writeSafetensors(join(newDir(), "model.safetensors"), [{ name: "a", dtype: "F32", shape: [4] }, { name: "b", dtype: "BF16", shape: [2, 8] }], { cutData: 3 });
    const e = errorOf(path);
    expect(e).toBeInstanceOf(TruncatedFileError);
    expect(e.tensor).toBe("b");
    expect(e.message).toBe(`${path}: tensor "b" (BF16 [2, 8]) needs data bytes 16..48 but the file holds 45: the file is truncated (an interrupted download?)`);
  });

  test("truncated fixture: the last tensor in the data is named", () => {
    const dir = fixture("qwen3-moe-tiny");
    if (!dir) return;
    const whole = readFileSync(join(dir, "model.safetensors"));
    let last = "";
    {
      using file = openSafetensors(dir);
      last = [...file.tensors.values()].sort((a, b) => b.bytes.byteOffset - a.bytes.byteOffset)[0]!.name;
    }
    const path = join(newDir(), "model.safetensors");
    writeFileSync(path, whole.subarray(0, whole.length - 1));
    const e = errorOf(path);
    expect(e).toBeInstanceOf(TruncatedFileError);
    expect(e.tensor).toBe(last);
  });

  test("data_offsets that do not match shape × dtype", () => {
    const path = writeSafetensors(join(newDir(), "model.safetensors"), [{ name: "w", dtype: "F16", shape: [3, 4], bytes: 20 }]);
    const e = errorOf(path);
    expect(e).toBeInstanceOf(ModelFileError);
    expect(e.tensor).toBe("w");
    expect(e.message).toBe(`${path}: tensor "w" (F16 [3, 4]) has data_offsets [0, 20], 20 bytes, but its shape and dtype make 24`);
  });

  test("malformed entries", () => {
    const dir = newDir();
    const path = writeSafetensors(join(dir, "model.safetensors"), [{ name: "w", dtype: "F32", shape: [2] }], { header: '{"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}}' });
    expect(errorOf(path).message).toBe(`${path}: tensor "w" has shape [2,-1], not a list of sizes in the header: the file is corrupt`);
    writeSafetensors(path, [{ name: "w", dtype: "F32", shape: [2] }], { header: '{"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}' });
    expect(errorOf(path).message).toBe(`${path}: tensor "w" has data_offsets [8,0], not [begin, end] with begin <= end in the header: the file is corrupt`);
    writeSafetensors(path, [{ name: "w", dtype: "F32", shape: [2] }], { header: "[1, 2]" });
    expect(errorOf(path).message).toBe(`${path}: the header is JSON but not an object of tensors: the file is corrupt or not safetensors`);
  });

  test("a dtype vkmoe does not read names the first such tensor and the dtypes present", () => {
    const path = writeSafetensors(join(newDir(), "model.safetensors"), [
      { name: "ok", dtype: "BF16", shape: [4] },
      { name: "q", dtype: "F8_E4M3", shape: [4, 4] },
      { name: "ids", dtype: "I64", shape: [3] },
      { name: "q2", dtype: "F8_E4M3", shape: [4] },
    ]);
    const e = errorOf(path) as UnsupportedTensorTypeError;
    expect(e).toBeInstanceOf(UnsupportedTensorTypeError);
    expect(e.tensor).toBe("q");
    expect(e.type).toBe("F8_E4M3");
    expect(e.message).toBe(`${path}: tensor "q" has dtype F8_E4M3 (unreadable tensors: 2 F8_E4M3, 1 I64); vkmoe reads F32, F16, BF16 from safetensors`);
    const i8 = writeSafetensors(join(newDir(), "model.safetensors"), [{ name: "x", dtype: "I8", shape: [2] }]);
    expect(errorOf(i8).message).toBe(`${i8}: tensor "x" has dtype I8 (unreadable tensors: 1 I8); vkmoe reads F32, F16, BF16 from safetensors`);
  });

  test("a single .safetensors file opens by itself; a 0-element tensor is an empty view", () => {
    const path = writeSafetensors(join(newDir(), "weights.safetensors"), [{ name: "empty", dtype: "F32", shape: [0, 4] }, { name: "x", dtype: "F32", shape: [2] }]);
    using file = openSafetensors(path);
    expect(file.files).toEqual([path]);
    expect(file.tensors.get("empty")!.bytes.byteLength).toBe(0);
    expect(file.tensors.get("x")!.bytes.byteLength).toBe(8);
  });
});
