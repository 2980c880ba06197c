/** openTensorFile: choosing GGUF or safetensors by the path, and its errors. */
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ModelFileError, ModelFileNotFoundError, openTensorFile } from "../src/formats/index.ts";
import { fixture } from "./support/fixtures.ts";

const scratch = mkdtempSync(join(tmpdir(), "vkmoe-open-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

async function errorOf(path: string): Promise<ModelFileError> {
  return openTensorFile(path).then(
    () => { throw new Error(`${path} opened`); },
    (e) => e,
  );
}

describe("openTensorFile", () => {
  test("a .gguf file is GGUF", async () => {
    const path = fixture("qwen3-moe-tiny.Q8_0.gguf");
    if (!path) return;
    using file = await openTensorFile(path);
    expect(file.format).toBe("gguf");
    expect(file.tensors.size).toBe(39);
  });

  test("a file without the suffix but with the GGUF magic is GGUF", async () => {
    const path = fixture("qwen3-moe-tiny.Q4_0.gguf");
    if (!path) return;
    const link = join(scratch, "model.bin");
    symlinkSync(path, link);
    using file = await openTensorFile(link);
    expect(file.format).toBe("gguf");
    expect(file.tensors.get("token_embd.weight")!.dtype).toBe("Q4_0");
  });

  test("a directory is a Hugging Face checkpoint; a .safetensors file is one too", async () => {
    const dir = fixture("qwen3-moe-tiny");
    if (!dir) return;
    {
      using file = await openTensorFile(dir);
      expect(file.format).toBe("safetensors");
      expect(file.tensors.size).toBe(174);
    }
    using single = await openTensorFile(join(dir, "model.safetensors"));
    expect(single.format).toBe("safetensors");
    expect(single.tensors.size).toBe(174);
  });

  test("a missing path", async () => {
    const path = join(scratch, "nothing-here");
    const e = await errorOf(path);
    expect(e).toBeInstanceOf(ModelFileNotFoundError);
    expect(e.message).toBe(`${path}: does not exist`);
  });

  test("a directory without model.safetensors or its index", async () => {
    const dir = join(scratch, "empty-model");
    mkdirSync(dir);
    const e = await errorOf(dir);
    expect(e).toBeInstanceOf(ModelFileNotFoundError);
    expect(e.message).toBe(`${dir}: no model.safetensors or model.safetensors.index.json in this directory`);
  });

  test("a file that is neither", async () => {
    const path = join(scratch, "notes.txt");
    writeFileSync(path, "just text");
    const e = await errorOf(path);
    expect(e).toBeInstanceOf(ModelFileError);
    expect(e.message).toBe(`${path}: is neither GGUF (no .gguf suffix or GGUF magic) nor .safetensors; give a .gguf file, a .safetensors file or a Hugging Face model directory`);
  });
});
