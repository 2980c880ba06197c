/** Loading SPIR-V from disk with enough structural checks that a driver never sees a truncated or foreign file. */
import { readFileSync } from "node:fs";
import { ShaderFileError } from "./errors.ts";

const SPIRV_MAGIC = 0x07230203;
const OP_ENTRY_POINT = 15;
const OP_FUNCTION_END = 56;

/** Reads and checks a .spv: magic, header, every instruction's length, an entry point, and a final OpFunctionEnd. */
export function loadSpirv(path: string): Uint32Array {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (e) {
    throw new ShaderFileError(path, `cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); run \`bun run build:shaders\` or reinstall`);
  }
  return checkSpirv(path, bytes);
}

export function checkSpirv(path: string, bytes: Uint8Array): Uint32Array {
  if (bytes.byteLength < 20) throw new ShaderFileError(path, `${bytes.byteLength} bytes is shorter than a SPIR-V header`);
  if (bytes.byteLength % 4 !== 0) throw new ShaderFileError(path, `size ${bytes.byteLength} is not a whole number of words (truncated?)`);
  const words = new Uint32Array(bytes.slice().buffer);
  if (words[0] !== SPIRV_MAGIC) throw new ShaderFileError(path, `bad magic 0x${words[0]!.toString(16)} (not SPIR-V, or big-endian)`);
  if (words[3] === 0) throw new ShaderFileError(path, "id bound is 0");
  let at = 5;
  let entryPoints = 0;
  let last = -1;
  while (at < words.length) {
    const count = words[at]! >>> 16;
    const op = words[at]! & 0xffff;
    if (count === 0 || at + count > words.length) throw new ShaderFileError(path, `instruction at word ${at} runs past the end (truncated)`);
    if (op === OP_ENTRY_POINT) entryPoints++;
    last = op;
    at += count;
  }
  if (entryPoints === 0) throw new ShaderFileError(path, "no OpEntryPoint");
  if (last !== OP_FUNCTION_END) throw new ShaderFileError(path, "does not end with OpFunctionEnd (truncated)");
  return words;
}
