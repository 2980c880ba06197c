/**
 * GGUF: every tensor of the fixture GGUFs against llama.cpp's gguf-py and @huggingface/gguf, the
 * quantized values against the bf16 checkpoint they were made from, and each kind of bad file.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, openSync, readFileSync, rmSync, closeSync, readSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gguf } from "@huggingface/gguf";
import { ModelFileError, ModelFileNotFoundError, TruncatedFileError, UnsupportedTensorTypeError, openGguf, openSafetensors, type TensorView } from "../src/formats/index.ts";
import { f16BitsToF32 } from "../src/quant/half.ts";
import { fixture } from "./support/fixtures.ts";

/** Made once with llama.cpp's gguf-py (GGUFReader): name, type, shape (outermost first), n_bytes, absolute data offset. */
const GGUF_PY: Record<string, string> = {
  "qwen3-moe-tiny.Q8_0.gguf": `
output.weight Q8_0 151936x64 10331648 5935360
token_embd.weight Q8_0 151936x64 10331648 16267008
blk.0.attn_norm.weight F32 64 256 26598656
blk.0.ffn_down_exps.weight Q8_0 16x64x64 69632 26598912
blk.0.ffn_gate_exps.weight Q8_0 16x64x64 69632 26668544
blk.0.ffn_up_exps.weight Q8_0 16x64x64 69632 26738176
blk.0.ffn_gate_inp.weight F32 16x64 4096 26807808
blk.0.ffn_norm.weight F32 64 256 26811904
blk.0.attn_k_norm.weight F32 32 128 26812160
blk.0.attn_k.weight Q8_0 64x64 4352 26812288
blk.0.attn_output.weight Q8_0 64x128 8704 26816640
blk.0.attn_q_norm.weight F32 32 128 26825344
blk.0.attn_q.weight Q8_0 128x64 8704 26825472
blk.0.attn_v.weight Q8_0 64x64 4352 26834176
blk.1.attn_norm.weight F32 64 256 26838528
blk.1.ffn_down_exps.weight Q8_0 16x64x64 69632 26838784
blk.1.ffn_gate_exps.weight Q8_0 16x64x64 69632 26908416
blk.1.ffn_up_exps.weight Q8_0 16x64x64 69632 26978048
blk.1.ffn_gate_inp.weight F32 16x64 4096 27047680
blk.1.ffn_norm.weight F32 64 256 27051776
blk.1.attn_k_norm.weight F32 32 128 27052032
blk.1.attn_k.weight Q8_0 64x64 4352 27052160
blk.1.attn_output.weight Q8_0 64x128 8704 27056512
blk.1.attn_q_norm.weight F32 32 128 27065216
blk.1.attn_q.weight Q8_0 128x64 8704 27065344
blk.1.attn_v.weight Q8_0 64x64 4352 27074048
blk.2.attn_norm.weight F32 64 256 27078400
blk.2.ffn_down_exps.weight Q8_0 16x64x64 69632 27078656
blk.2.ffn_gate_exps.weight Q8_0 16x64x64 69632 27148288
blk.2.ffn_up_exps.weight Q8_0 16x64x64 69632 27217920
blk.2.ffn_gate_inp.weight F32 16x64 4096 27287552
blk.2.ffn_norm.weight F32 64 256 27291648
blk.2.attn_k_norm.weight F32 32 128 27291904
blk.2.attn_k.weight Q8_0 64x64 4352 27292032
blk.2.attn_output.weight Q8_0 64x128 8704 27296384
blk.2.attn_q_norm.weight F32 32 128 27305088
blk.2.attn_q.weight Q8_0 128x64 8704 27305216
blk.2.attn_v.weight Q8_0 64x64 4352 27313920
output_norm.weight F32 64 256 27318272
`,
  "qwen3-moe-tiny.Q4_0.gguf": `
output.weight Q8_0 151936x64 10331648 5935360
output_norm.weight F32 64 256 16267008
token_embd.weight Q4_0 151936x64 5469696 16267264
blk.0.attn_k.weight Q4_0 64x64 2304 21736960
blk.0.attn_k_norm.weight F32 32 128 21739264
blk.0.attn_norm.weight F32 64 256 21739392
blk.0.attn_output.weight Q4_0 64x128 4608 21739648
blk.0.attn_q.weight Q4_0 128x64 4608 21744256
blk.0.attn_q_norm.weight F32 32 128 21748864
blk.0.attn_v.weight Q4_0 64x64 2304 21748992
blk.0.ffn_down_exps.weight Q4_0 16x64x64 36864 21751296
blk.0.ffn_gate_exps.weight Q4_0 16x64x64 36864 21788160
blk.0.ffn_gate_inp.weight F32 16x64 4096 21825024
blk.0.ffn_norm.weight F32 64 256 21829120
blk.0.ffn_up_exps.weight Q4_0 16x64x64 36864 21829376
blk.1.attn_k.weight Q4_0 64x64 2304 21866240
blk.1.attn_k_norm.weight F32 32 128 21868544
blk.1.attn_norm.weight F32 64 256 21868672
blk.1.attn_output.weight Q4_0 64x128 4608 21868928
blk.1.attn_q.weight Q4_0 128x64 4608 21873536
blk.1.attn_q_norm.weight F32 32 128 21878144
blk.1.attn_v.weight Q4_0 64x64 2304 21878272
blk.1.ffn_down_exps.weight Q4_0 16x64x64 36864 21880576
blk.1.ffn_gate_exps.weight Q4_0 16x64x64 36864 21917440
blk.1.ffn_gate_inp.weight F32 16x64 4096 21954304
blk.1.ffn_norm.weight F32 64 256 21958400
blk.1.ffn_up_exps.weight Q4_0 16x64x64 36864 21958656
blk.2.attn_k.weight Q4_0 64x64 2304 21995520
blk.2.attn_k_norm.weight F32 32 128 21997824
blk.2.attn_norm.weight F32 64 256 21997952
blk.2.attn_output.weight Q4_0 64x128 4608 21998208
blk.2.attn_q.weight Q4_0 128x64 4608 22002816
blk.2.attn_q_norm.weight F32 32 128 22007424
blk.2.attn_v.weight Q4_0 64x64 2304 22007552
blk.2.ffn_down_exps.weight Q4_0 16x64x64 36864 22009856
blk.2.ffn_gate_exps.weight Q4_0 16x64x64 36864 22046720
blk.2.ffn_gate_inp.weight F32 16x64 4096 22083584
blk.2.ffn_norm.weight F32 64 256 22087680
blk.2.ffn_up_exps.weight Q4_0 16x64x64 36864 22087936
`,
  "qwen3.5-moe-tiny.Q8_0.gguf": `
token_embd.weight Q8_0 151936x64 10331648 5938112
blk.0.attn_norm.weight F32 64 256 16269760
blk.0.ssm_a F32 4 16 16270016
blk.0.ssm_conv1d.weight F32 256x4 4096 16270048
blk.0.ssm_dt.bias F32 4 16 16274144
blk.0.ssm_alpha.weight Q8_0 4x64 272 16274176
blk.0.ssm_beta.weight Q8_0 4x64 272 16274464
blk.0.attn_qkv.weight Q8_0 256x64 17408 16274752
blk.0.attn_gate.weight Q8_0 128x64 8704 16292160
blk.0.ssm_norm.weight F32 32 128 16300864
blk.0.ssm_out.weight Q8_0 64x128 8704 16300992
blk.0.ffn_down_exps.weight Q8_0 16x64x64 69632 16309696
blk.0.ffn_gate_exps.weight Q8_0 16x64x64 69632 16379328
blk.0.ffn_up_exps.weight Q8_0 16x64x64 69632 16448960
blk.0.ffn_gate_inp.weight F32 16x64 4096 16518592
blk.0.ffn_down_shexp.weight Q8_0 64x96 6528 16522688
blk.0.ffn_gate_shexp.weight Q8_0 96x64 6528 16529216
blk.0.ffn_up_shexp.weight Q8_0 96x64 6528 16535744
blk.0.ffn_gate_inp_shexp.weight F32 1x64 256 16542272
blk.0.post_attention_norm.weight F32 64 256 16542528
blk.1.attn_norm.weight F32 64 256 16542784
blk.1.ssm_a F32 4 16 16543040
blk.1.ssm_conv1d.weight F32 256x4 4096 16543072
blk.1.ssm_dt.bias F32 4 16 16547168
blk.1.ssm_alpha.weight Q8_0 4x64 272 16547200
blk.1.ssm_beta.weight Q8_0 4x64 272 16547488
blk.1.attn_qkv.weight Q8_0 256x64 17408 16547776
blk.1.attn_gate.weight Q8_0 128x64 8704 16565184
blk.1.ssm_norm.weight F32 32 128 16573888
blk.1.ssm_out.weight Q8_0 64x128 8704 16574016
blk.1.ffn_down_exps.weight Q8_0 16x64x64 69632 16582720
blk.1.ffn_gate_exps.weight Q8_0 16x64x64 69632 16652352
blk.1.ffn_up_exps.weight Q8_0 16x64x64 69632 16721984
blk.1.ffn_gate_inp.weight F32 16x64 4096 16791616
blk.1.ffn_down_shexp.weight Q8_0 64x96 6528 16795712
blk.1.ffn_gate_shexp.weight Q8_0 96x64 6528 16802240
blk.1.ffn_up_shexp.weight Q8_0 96x64 6528 16808768
blk.1.ffn_gate_inp_shexp.weight F32 1x64 256 16815296
blk.1.post_attention_norm.weight F32 64 256 16815552
blk.2.attn_norm.weight F32 64 256 16815808
blk.2.ssm_a F32 4 16 16816064
blk.2.ssm_conv1d.weight F32 256x4 4096 16816096
blk.2.ssm_dt.bias F32 4 16 16820192
blk.2.ssm_alpha.weight Q8_0 4x64 272 16820224
blk.2.ssm_beta.weight Q8_0 4x64 272 16820512
blk.2.attn_qkv.weight Q8_0 256x64 17408 16820800
blk.2.attn_gate.weight Q8_0 128x64 8704 16838208
blk.2.ssm_norm.weight F32 32 128 16846912
blk.2.ssm_out.weight Q8_0 64x128 8704 16847040
blk.2.ffn_down_exps.weight Q8_0 16x64x64 69632 16855744
blk.2.ffn_gate_exps.weight Q8_0 16x64x64 69632 16925376
blk.2.ffn_up_exps.weight Q8_0 16x64x64 69632 16995008
blk.2.ffn_gate_inp.weight F32 16x64 4096 17064640
blk.2.ffn_down_shexp.weight Q8_0 64x96 6528 17068736
blk.2.ffn_gate_shexp.weight Q8_0 96x64 6528 17075264
blk.2.ffn_up_shexp.weight Q8_0 96x64 6528 17081792
blk.2.ffn_gate_inp_shexp.weight F32 1x64 256 17088320
blk.2.post_attention_norm.weight F32 64 256 17088576
blk.3.attn_norm.weight F32 64 256 17088832
blk.3.ffn_down_exps.weight Q8_0 16x64x64 69632 17089088
blk.3.ffn_gate_exps.weight Q8_0 16x64x64 69632 17158720
blk.3.ffn_up_exps.weight Q8_0 16x64x64 69632 17228352
blk.3.ffn_gate_inp.weight F32 16x64 4096 17297984
blk.3.ffn_down_shexp.weight Q8_0 64x96 6528 17302080
blk.3.ffn_gate_shexp.weight Q8_0 96x64 6528 17308608
blk.3.ffn_up_shexp.weight Q8_0 96x64 6528 17315136
blk.3.ffn_gate_inp_shexp.weight F32 1x64 256 17321664
blk.3.post_attention_norm.weight F32 64 256 17321920
blk.3.attn_k_norm.weight F32 32 128 17322176
blk.3.attn_k.weight Q8_0 64x64 4352 17322304
blk.3.attn_output.weight Q8_0 64x128 8704 17326656
blk.3.attn_q_norm.weight F32 32 128 17335360
blk.3.attn_q.weight Q8_0 256x64 17408 17335488
blk.3.attn_v.weight Q8_0 64x64 4352 17352896
output_norm.weight F32 64 256 17357248
`,
};

const scratch = mkdtempSync(join(tmpdir(), "vkmoe-gguf-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** The first `n` bytes of a fixture, as a new file. */
function truncatedCopy(source: string, n: number, name: string): string {
  const head = new Uint8Array(n);
  const fd = openSync(source, "r");
  readSync(fd, head, 0, n, 0);
  closeSync(fd);
  const path = join(scratch, name);
  writeFileSync(path, head);
  return path;
}

/** A GGUF v3 file by hand: u32/string metadata and tensors of any ggml type id, data packed at `alignment`. */
function writeGguf(name: string, opts: { version?: number; kv?: [string, number | string][]; tensors: { name: string; ne: number[]; type: number; bytes: number }[]; alignment?: number }): string {
  const parts: Uint8Array[] = [];
  const u32 = (v: number) => { const b = new Uint8Array(4); new DataView(b.buffer).setUint32(0, v, true); parts.push(b); };
  const u64 = (v: number) => { const b = new Uint8Array(8); new DataView(b.buffer).setBigUint64(0, BigInt(v), true); parts.push(b); };
  const str = (s: string) => { const e = new TextEncoder().encode(s); u64(e.length); parts.push(e); };
  const alignment = opts.alignment ?? 32;
  const kv = [...(opts.kv ?? []), ...(opts.alignment ? [["general.alignment", alignment] as [string, number]] : [])];
  parts.push(new TextEncoder().encode("GGUF"));
  u32(opts.version ?? 3);
  u64(opts.tensors.length);
  u64(kv.length);
  for (const [key, value] of kv) {
    str(key);
    if (typeof value === "number") { u32(4); u32(value); } else { u32(8); str(value); }
  }
  let offset = 0;
  for (const t of opts.tensors) {
    str(t.name);
    u32(t.ne.length);
    for (const n of t.ne) u64(n);
    u32(t.type);
    u64(offset);
    offset += Math.ceil(t.bytes / alignment) * alignment;
  }
  const headerLength = parts.reduce((n, p) => n + p.length, 0);
  const dataStart = Math.ceil(headerLength / alignment) * alignment;
  const out = new Uint8Array(dataStart + offset);
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  for (let i = dataStart; i < out.length; i++) out[i] = i & 0xff; // recognisable data
  const path = join(scratch, name);
  writeFileSync(path, out);
  return path;
}

const f32Of = (t: TensorView) => new Float32Array(t.bytes.buffer, t.bytes.byteOffset, t.bytes.byteLength / 4);
const bf16Of = (t: TensorView) => {
  const bits = new Uint16Array(t.bytes.slice().buffer); // copied: safetensors data need not be 2-byte aligned in the file
  const out = new Float32Array(bits.length);
  const u = new Uint32Array(out.buffer);
  for (let i = 0; i < bits.length; i++) u[i] = bits[i]! << 16;
  return out;
};

/** A quantized GGUF tensor's block `b`: its scale and 32 dequantized values (llama.cpp's definition). */
function dequantBlock(t: TensorView, b: number): { d: number; values: number[] } {
  const size = t.dtype === "Q8_0" ? 34 : 18;
  const o = b * size;
  const d = f16BitsToF32(t.bytes[o]! | (t.bytes[o + 1]! << 8));
  const values: number[] = [];
  for (let j = 0; j < 32; j++) {
    const q = t.dtype === "Q8_0" ? (t.bytes[o + 2 + j]! << 24) >> 24 : j < 16 ? (t.bytes[o + 2 + j]! & 15) - 8 : (t.bytes[o + 2 + j - 16]! >> 4) - 8;
    values.push(q * d);
  }
  return { d, values };
}

describe("GGUF fixtures", () => {
  for (const name of Object.keys(GGUF_PY)) {
    test(`${name}: every tensor's name, dtype, shape, bytes and offset as gguf-py reads them`, async () => {
      const path = fixture(name);
      if (!path) return;
      using file = await openGguf(path);
      const expected = GGUF_PY[name]!.trim().split("\n").map((line) => line.split(" "));
      expect(file.format).toBe("gguf");
      expect(file.version).toBe(3);
      expect([...file.tensors.keys()]).toEqual(expected.map((e) => e[0]!));
      for (const [tensor, type, shape, bytes, offset] of expected) {
        const view = file.tensors.get(tensor!)!;
        expect(view.dtype as string).toBe(type!);
        expect(view.shape).toEqual(shape!.split("x").map(Number));
        expect(view.bytes.byteLength).toBe(Number(bytes));
        expect(view.bytes.byteOffset).toBe(Number(offset)); // all views share the one mapping of the file
      }
      expect(file.mappedBytes).toBe(readFileSync(path).byteLength);
    });

    test(`${name}: header and metadata agree with @huggingface/gguf`, async () => {
      const path = fixture(name);
      if (!path) return;
      using file = await openGguf(path);
      const theirs = await gguf(path, { allowLocalFile: true });
      const { version, tensor_count, kv_count, ...theirMetadata } = theirs.metadata as Record<string, unknown>;
      expect(file.version).toBe(version as number);
      expect(file.tensors.size).toBe(Number(tensor_count));
      expect(Object.keys(file.metadata).length).toBe(Number(kv_count));
      const asNumber = (v: unknown): unknown => (typeof v === "bigint" ? Number(v) : Array.isArray(v) ? v.map(asNumber) : v);
      for (const [key, value] of Object.entries(theirMetadata)) expect([key, file.metadata[key]]).toEqual([key, asNumber(value)]);
      const dataOffset = Number(theirs.tensorDataOffset);
      for (const info of theirs.tensorInfos) {
        const view = file.tensors.get(info.name)!;
        expect(view.shape).toEqual(info.shape.map(Number).reverse());
        expect(view.bytes.byteOffset).toBe(dataOffset + Number(info.offset));
      }
    });
  }

  test("metadata values: strings, u32 as number, f32, bool, arrays of strings and of i32", async () => {
    const path = fixture("qwen3-moe-tiny.Q8_0.gguf");
    if (!path) return;
    using file = await openGguf(path);
    const m = file.metadata;
    expect(m["general.architecture"]).toBe("qwen3moe");
    expect(m["qwen3moe.expert_count"]).toBe(16);
    expect(m["qwen3moe.expert_used_count"]).toBe(4);
    expect(m["qwen3moe.embedding_length"]).toBe(64);
    expect(m["qwen3moe.attention.layer_norm_rms_epsilon"]).toBe(Math.fround(1e-6));
    expect(m["tokenizer.ggml.add_bos_token"]).toBe(false);
    const tokens = m["tokenizer.ggml.tokens"] as string[];
    expect(tokens.length).toBe(151936);
    expect(tokens.slice(0, 3)).toEqual(["!", '"', "#"]);
    expect((m["tokenizer.ggml.token_type"] as number[]).length).toBe(151936);
    expect(m["tokenizer.ggml.eos_token_id"]).toBe(151645);
  });

  test("norms and router are the checkpoint's bf16 values exactly; Q8_0 and Q4_0 experts within their rounding", async () => {
    const q8Path = fixture("qwen3-moe-tiny.Q8_0.gguf");
    const q4Path = fixture("qwen3-moe-tiny.Q4_0.gguf");
    const hfPath = fixture("qwen3-moe-tiny");
    if (!q8Path || !q4Path || !hfPath) return;
    using q8 = await openGguf(q8Path);
    using q4 = await openGguf(q4Path);
    using hf = openSafetensors(hfPath);
    const hfTensor = (name: string) => hf.tensors.get(name)!;
    const exact: [string, string][] = [["output_norm.weight", "model.norm.weight"]];
    for (let l = 0; l < 3; l++) {
      exact.push([`blk.${l}.attn_norm.weight`, `model.layers.${l}.input_layernorm.weight`]);
      exact.push([`blk.${l}.ffn_norm.weight`, `model.layers.${l}.post_attention_layernorm.weight`]);
      exact.push([`blk.${l}.attn_q_norm.weight`, `model.layers.${l}.self_attn.q_norm.weight`]);
      exact.push([`blk.${l}.attn_k_norm.weight`, `model.layers.${l}.self_attn.k_norm.weight`]);
      exact.push([`blk.${l}.ffn_gate_inp.weight`, `model.layers.${l}.mlp.gate.weight`]);
    }
    for (const file of [q8, q4]) {
      for (const [g, h] of exact) {
        const ours = file.tensors.get(g)!;
        expect(ours.dtype).toBe("F32");
        expect(ours.shape).toEqual(hfTensor(h).shape);
        expect(f32Of(ours)).toEqual(bf16Of(hfTensor(h)));
      }
    }
    // Each expert's [rows, cols] matrix is slice e of the fused [E, rows, cols] GGUF tensor.
    let blocks = 0;
    for (const [file, slack] of [[q8, 0.5 + 127 * 2 ** -11], [q4, 1 + 8 * 2 ** -11]] as const) {
      for (let l = 0; l < 3; l++) {
        for (const proj of ["gate", "up", "down"]) {
          const fused = file.tensors.get(`blk.${l}.ffn_${proj}_exps.weight`)!;
          const [E, rows, cols] = fused.shape as [number, number, number];
          for (let e = 0; e < E; e++) {
            const expert = hfTensor(`model.layers.${l}.mlp.experts.${e}.${proj}_proj.weight`);
            expect(expert.shape).toEqual([rows, cols]);
            const want = bf16Of(expert);
            for (let b = 0; b < (rows * cols) / 32; b++) {
              const { d, values } = dequantBlock(fused, (e * rows * cols) / 32 + b);
              for (let j = 0; j < 32; j++) expect(Math.abs(values[j]! - want[b * 32 + j]!)).toBeLessThanOrEqual(Math.abs(d) * slack);
              blocks++;
            }
          }
        }
      }
    }
    expect(blocks).toBe(2 * 3 * 3 * 16 * (64 * 64) / 32);
  });
});

describe("GGUF: bad files", () => {
  test("missing file", async () => {
    const path = join(scratch, "nope.gguf");
    const error = await openGguf(path).catch((e) => e);
    expect(error).toBeInstanceOf(ModelFileNotFoundError);
    expect(error.code).toBe("MODEL_FILE");
    expect(error.message).toBe(`${path}: does not exist`);
  });

  test("a directory", async () => {
    const dir = join(scratch, "a-dir.gguf");
    mkdirSync(dir, { recursive: true });
    const error = await openGguf(dir).catch((e) => e);
    expect(error).toBeInstanceOf(ModelFileError);
    expect(error.message).toBe(`${dir}: is a directory, not a .gguf file`);
  });

  test("not GGUF", async () => {
    const path = join(scratch, "text.gguf");
    writeFileSync(path, "hello, this is not a model file at all");
    const error = await openGguf(path).catch((e) => e);
    expect(error).toBeInstanceOf(ModelFileError);
    expect(error.message).toBe(`${path}: it does not start with the GGUF magic "GGUF"`);
  });

  test("GGUF v1 is refused", async () => {
    const path = writeGguf("v1.gguf", { version: 1, tensors: [] });
    const error = await openGguf(path).catch((e) => e);
    expect(error).toBeInstanceOf(ModelFileError);
    expect(error.message).toBe(`${path}: GGUF version 1 is not supported; vkmoe reads GGUF v3 (and v2)`);
  });

  test("truncated header, cut inside the metadata and inside the tensor infos", async () => {
    const source = fixture("qwen3-moe-tiny.Q8_0.gguf");
    if (!source) return;
    const inMetadata = truncatedCopy(source, 1_000_000, "cut-metadata.gguf");
    let error = await openGguf(inMetadata).catch((e) => e);
    expect(error).toBeInstanceOf(TruncatedFileError);
    expect(error.message).toBe(`${inMetadata}: the header ends early: the file stops (at byte 1000000) inside the value of metadata key "tokenizer.ggml.tokens"`);
    // Tensor infos start at 5932946; output.weight's takes 53 bytes, token_embd.weight's name the next 25.
    const inTensorInfos = truncatedCopy(source, 5_933_030, "cut-infos.gguf");
    error = await openGguf(inTensorInfos).catch((e) => e);
    expect(error).toBeInstanceOf(TruncatedFileError);
    expect(error.message).toBe(`${inTensorInfos}: the header ends early: the file stops (at byte 5933030) inside the info of tensor "token_embd.weight"`);
    for (const n of [0, 3, 12]) {
      error = await openGguf(truncatedCopy(source, n, `cut-${n}.gguf`)).catch((e) => e);
      expect(error).toBeInstanceOf(TruncatedFileError);
    }
  });

  test("truncated data names the first tensor that runs past the end", async () => {
    const source = fixture("qwen3-moe-tiny.Q8_0.gguf");
    if (!source) return;
    const size = readFileSync(source).byteLength;
    const path = truncatedCopy(source, size - 1000, "cut-data.gguf");
    const error = await openGguf(path).catch((e) => e);
    expect(error).toBeInstanceOf(TruncatedFileError);
    expect(error.tensor).toBe("blk.2.attn_v.weight");
    expect(error.message).toBe(
      `${path}: tensor "blk.2.attn_v.weight" (Q8_0 [64, 64]) needs bytes 27313920..27318272 but the file ends at ${size - 1000}: the file is truncated (an interrupted download?)`,
    );
  });

  test("an unsupported tensor type names the first such tensor, its type and what is supported", async () => {
    const path = writeGguf("q2k.gguf", {
      kv: [["general.architecture", "qwen3moe"]],
      tensors: [
        { name: "blk.0.attn_norm.weight", ne: [256], type: 0, bytes: 1024 },
        { name: "blk.0.ffn_down_exps.weight", ne: [256, 4], type: 10, bytes: 4 * 84 }, // Q2_K: 84-byte blocks of 256
        { name: "blk.0.ffn_gate_exps.weight", ne: [256, 4], type: 11, bytes: 4 * 110 }, // Q3_K
        { name: "blk.0.ffn_up_exps.weight", ne: [256, 4], type: 10, bytes: 4 * 84 },
      ],
    });
    const error = await openGguf(path).catch((e) => e);
    expect(error).toBeInstanceOf(UnsupportedTensorTypeError);
    expect(error.tensor).toBe("blk.0.ffn_down_exps.weight");
    expect(error.type).toBe("Q2_K");
    expect(error.message).toBe(
      `${path}: tensor "blk.0.ffn_down_exps.weight" is Q2_K (unreadable tensors: 2 Q2_K, 1 Q3_K); vkmoe reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: requantize with llama-quantize to Q8_0 or Q4_0`,
    );
  });

  test("hand-built file: alignment 64, F16/BF16/Q4_0/Q8_0 byte sizes, bytes in place", async () => {
    const tensors = [
      { name: "a", ne: [3, 2], type: 0, bytes: 24 },
      { name: "b", ne: [5], type: 1, bytes: 10 },
      { name: "c", ne: [7], type: 30, bytes: 14 },
      { name: "d", ne: [64, 3], type: 2, bytes: 6 * 18 },
      { name: "e", ne: [32, 2, 2], type: 8, bytes: 4 * 34 },
    ];
    const path = writeGguf("aligned.gguf", { alignment: 64, tensors });
    using file = await openGguf(path);
    const disk = readFileSync(path);
    const dataStart = disk.byteLength - tensors.reduce((n, t) => n + Math.ceil(t.bytes / 64) * 64, 0);
    expect(dataStart % 64).toBe(0);
    expect(file.metadata["general.alignment"]).toBe(64);
    let offset = dataStart;
    for (const t of tensors) {
      const view = file.tensors.get(t.name)!;
      expect(view.shape).toEqual([...t.ne].reverse());
      expect(view.bytes.byteLength).toBe(t.bytes);
      expect(view.bytes.byteOffset).toBe(offset);
      expect(Array.from(view.bytes)).toEqual(Array.from(disk.subarray(offset, offset + t.bytes)));
      offset += Math.ceil(t.bytes / 64) * 64;
    }
    expect(file.tensors.get("d")!.dtype).toBe("Q4_0");
    expect(file.tensors.get("c")!.dtype).toBe("BF16");
  });

  test("a Q8_0 row that is not whole blocks", async () => {
    const path = writeGguf("ragged.gguf", { tensors: [{ name: "w", ne: [40, 2], type: 8, bytes: 34 * 3 }] });
    const error = await openGguf(path).catch((e) => e);
    expect(error).toBeInstanceOf(ModelFileError);
    expect(error.message).toBe(`${path}: tensor "w" (Q8_0 [2, 40]) has rows of 40 elements, not a multiple of the 32-element Q8_0 block`);
  });

  test("dispose empties the tensor map", async () => {
    const path = writeGguf("small.gguf", { tensors: [{ name: "a", ne: [4], type: 0, bytes: 16 }] });
    const file = await openGguf(path);
    expect(file.tensors.size).toBe(1);
    file[Symbol.dispose]();
    expect(file.tensors.size).toBe(0);
    file[Symbol.dispose](); // twice is harmless
  });
});
