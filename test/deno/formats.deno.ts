/**
 * The model file formats under Deno: mapFile through Deno.dlopen's libc, the fixture GGUFs and
 * safetensors checkpoint opened with the right tensors, and the main errors.
 */
import { closeSync, ftruncateSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FileMapError, mapFile } from "../../src/ffi/index.ts";
import { ModelFileNotFoundError, TruncatedFileError, openGguf, openSafetensors, openTensorFile } from "../../src/formats/index.ts";
import { fixture } from "../support/fixtures.ts";

declare const Deno: any;

function assert(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

Deno.test("mapFile under Deno: fixture bytes, an empty file, past 4 GiB, a missing file", () => {
  const scratch = mkdtempSync(join(tmpdir(), "vkmoe-deno-mmap-"));
  try {
    const path = fixture("qwen3-moe-tiny.Q8_0.gguf");
    if (path) {
      using file = mapFile(path);
      const disk = readFileSync(path);
      assert(file.byteLength === disk.byteLength, `${file.byteLength} bytes mapped, ${disk.byteLength} on disk`);
      for (const at of [0, 1, 4096, 5_935_360, disk.byteLength - 1]) assert(file.bytes[at] === disk[at], `byte ${at} differs`);
    }
    const empty = join(scratch, "empty");
    closeSync(openSync(empty, "w"));
    {
      using file = mapFile(empty);
      assert(file.bytes.byteLength === 0, "empty file is not an empty view");
    }
    const big = join(scratch, "sparse-5g");
    const size = 5 * 2 ** 30;
    const fd = openSync(big, "w");
    ftruncateSync(fd, size);
    writeSync(fd, new TextEncoder().encode("tail"), 0, 4, size - 4);
    closeSync(fd);
    {
      using file = mapFile(big);
      assert(file.byteLength === size, `5 GiB file mapped as ${file.byteLength}`);
      assert(new TextDecoder().decode(file.view(size - 4, 4)) === "tail", "last bytes of a 5 GiB file");
    }
    let error: unknown;
    try {
      mapFile(join(scratch, "missing"));
    } catch (e) {
      error = e;
    }
    assert(error instanceof FileMapError && error.errnoName === "ENOENT", `missing file: ${error}`);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
});

Deno.test("GGUF and safetensors fixtures open under Deno", async () => {
  const q8 = fixture("qwen3-moe-tiny.Q8_0.gguf");
  const q4 = fixture("qwen3-moe-tiny.Q4_0.gguf");
  const hf = fixture("qwen3-moe-tiny");
  if (!q8 || !q4 || !hf) return;
  {
    using file = await openGguf(q8);
    assert(file.version === 3 && file.tensors.size === 39, `Q8_0: v${file.version}, ${file.tensors.size} tensors`);
    const gate = file.tensors.get("blk.0.ffn_gate_exps.weight")!;
    assert(gate.dtype === "Q8_0" && gate.shape.join() === "16,64,64" && gate.bytes.byteLength === 69632, `gate_exps: ${gate.dtype} [${gate.shape}] ${gate.bytes.byteLength}`);
    assert(file.metadata["qwen3moe.expert_count"] === 16, "expert_count");
  }
  {
    using file = await openTensorFile(q4);
    const embd = file.tensors.get("token_embd.weight")!;
    assert(embd.dtype === "Q4_0" && embd.bytes.byteLength === 5469696, `token_embd: ${embd.dtype} ${embd.bytes.byteLength}`);
    assert(file.tensors.get("output.weight")!.dtype === "Q8_0", "output.weight is Q8_0");
  }
  using gguf = await openGguf(q8);
  using st = openSafetensors(hf);
  assert(st.tensors.size === 174, `${st.tensors.size} safetensors tensors`);
  const norm = st.tensors.get("model.layers.2.input_layernorm.weight")!;
  assert(norm.dtype === "BF16" && norm.shape.join() === "64", `norm: ${norm.dtype} [${norm.shape}]`);
  // The GGUF stores the norm as F32 made from the bf16: the same values exactly.
  const f32 = gguf.tensors.get("blk.2.attn_norm.weight")!;
  const values = new Float32Array(f32.bytes.slice().buffer);
  for (let i = 0; i < 64; i++) {
    const bits = norm.bytes[2 * i]! | (norm.bytes[2 * i + 1]! << 8);
    const bf16 = new Float32Array(new Uint32Array([bits << 16]).buffer)[0];
    assert(values[i] === bf16, `norm value ${i}: ${values[i]} vs ${bf16}`);
  }
});

Deno.test("model file errors under Deno: missing path, truncated GGUF", async () => {
  const scratch = mkdtempSync(join(tmpdir(), "vkmoe-deno-formats-"));
  try {
    const missing = join(scratch, "none.gguf");
    const error = await openTensorFile(missing).catch((e) => e);
    assert(error instanceof ModelFileNotFoundError && error.message === `${missing}: does not exist`, `missing: ${error}`);
    const source = fixture("qwen3-moe-tiny.Q8_0.gguf");
    if (!source) return;
    const cut = join(scratch, "cut.gguf");
    Deno.writeFileSync(cut, readFileSync(source).subarray(0, 1_000_000));
    const truncated = await openGguf(cut).catch((e) => e);
    assert(truncated instanceof TruncatedFileError && truncated.message.includes('inside the value of metadata key "tokenizer.ggml.tokens"'), `truncated: ${truncated}`);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
});
