import { VkmoeError } from "../errors.ts";

/** No candidate shared library could be opened. `tried` lists each path with the runtime's reason. */
export class LibraryNotFoundError extends VkmoeError {
  readonly tried: readonly string[];
  constructor(what: string, tried: readonly string[]) {
    super("LIBRARY_NOT_FOUND", `could not open ${what}; tried:\n  ${tried.join("\n  ")}`);
    this.tried = tried;
  }
}

/** Neither Bun nor Deno: there is no FFI to call libvulkan with. */
export class UnsupportedRuntimeError extends VkmoeError {
  constructor() {
    super("UNSUPPORTED_RUNTIME", "vkmoe needs Bun (bun:ffi) or Deno (Deno.dlopen with --allow-ffi)");
  }
}
