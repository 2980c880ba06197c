/** Mapping a model file, with the C library's reasons turned into ModelFileErrors naming the file. */
import { FileMapError, mapFile, type MappedFile } from "../ffi/index.ts";
import { ModelFileError, ModelFileNotFoundError } from "./errors.ts";

/** `what` says what the file should be, for the message when it is a directory ("a .gguf file"). */
export function mapModelFile(path: string, what: string): MappedFile {
  try {
    return mapFile(path);
  } catch (e) {
    if (!(e instanceof FileMapError)) throw e;
    if (e.errnoName === "ENOENT") throw new ModelFileNotFoundError(path, "does not exist", { cause: e });
    if (e.errnoName === "EISDIR") throw new ModelFileError(path, `is a directory, not ${what}`, { cause: e });
    throw new ModelFileError(path, `cannot be read: ${e.reason}${e.errnoName ? ` (${e.errnoName})` : ""}`, { cause: e });
  }
}

/** Bytes a view of the whole file can hold on every runtime (Bun stops at 4 GiB); headers live in it. */
export const HEADER_VIEW_LIMIT = 2 ** 32;

/** The file's first bytes, up to 4 GiB: enough for any header, without a copy. */
export function headerView(file: MappedFile): Uint8Array {
  return file.view(0, Math.min(file.byteLength, HEADER_VIEW_LIMIT));
}
