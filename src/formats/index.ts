/** Model files: GGUF and Hugging Face safetensors, mapped, each tensor a view into the file. */
import { closeSync, existsSync, openSync, readSync, statSync } from "node:fs";
import { ModelFileError, ModelFileNotFoundError } from "./errors.ts";
import { openGguf } from "./gguf.ts";
import { openSafetensors } from "./safetensors.ts";
import type { TensorFile } from "./tensor.ts";

export type { GgufFile, SafetensorsFile, TensorDType, TensorFile, TensorView } from "./tensor.ts";
export { TENSOR_DTYPES } from "./tensor.ts";
export { ModelFileError, ModelFileNotFoundError, TruncatedFileError, UnsupportedTensorTypeError } from "./errors.ts";
export { openGguf } from "./gguf.ts";
export { INDEX_FILE, SINGLE_FILE, openSafetensors } from "./safetensors.ts";

/**
 * Opens a model by its path: a directory is a Hugging Face checkpoint (model.safetensors or its
 * index and shards); a file is GGUF when it ends in .gguf or starts with the GGUF magic, and
 * safetensors when it ends in .safetensors.
 */
export async function openTensorFile(path: string): Promise<TensorFile> {
  if (!existsSync(path)) throw new ModelFileNotFoundError(path, "does not exist");
  if (statSync(path).isDirectory()) return openSafetensors(path);
  if (path.endsWith(".gguf") || startsWithGgufMagic(path)) return openGguf(path);
  if (path.endsWith(".safetensors")) return openSafetensors(path);
  throw new ModelFileError(path, "is neither GGUF (no .gguf suffix or GGUF magic) nor .safetensors; give a .gguf file, a .safetensors file or a Hugging Face model directory");
}

function startsWithGgufMagic(path: string): boolean {
  const head = new Uint8Array(4);
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (e) {
    throw new ModelFileError(path, `cannot be read: ${(e as Error).message}`, { cause: e });
  }
  try {
    return readSync(fd, head, 0, 4, 0) === 4 && new TextDecoder().decode(head) === "GGUF";
  } finally {
    closeSync(fd);
  }
}
