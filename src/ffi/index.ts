import { UnsupportedRuntimeError } from "./errors.ts";
import type { Ffi } from "./types.ts";

export type * from "./types.ts";
export { LibraryNotFoundError, UnsupportedRuntimeError } from "./errors.ts";
export { NativeArena } from "./arena.ts";
export { storeFence } from "./fence.ts";
export { collectGarbage } from "./gc.ts";
export { FileMapError, mapFile, type MappedFile } from "./mmap.ts";

async function loadRuntime(): Promise<Ffi> {
  if ("Bun" in globalThis) return (await import("./bun.ts")).bunFfi;
  if ("Deno" in globalThis) return (await import("./deno.ts")).denoFfi;
  throw new UnsupportedRuntimeError();
}

/** The FFI of the runtime we run in, chosen once at load. */
export const ffi: Ffi = await loadRuntime();
