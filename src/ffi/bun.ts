import { CFunction, CString, JSCallback, dlopen, toArrayBuffer } from "bun:ffi";
import { LibraryNotFoundError } from "./errors.ts";
import { libcCandidates, libcSymbols } from "./libc.ts";
import type { Ffi, FnSignature, NativeBlock, NativeCallback, NativeLibrary, NativeType, SymbolTable } from "./types.ts";

// Pointers travel as u64 so that addresses stay bigint on both runtimes.
function bunType(t: NativeType): string {
  return t === "ptr" ? "u64" : t;
}

function bunSignature(sig: FnSignature) {
  return { args: sig.args.map(bunType), returns: bunType(sig.returns) } as any;
}

function openLibrary<S extends SymbolTable>(candidates: readonly string[], symbols: S): NativeLibrary<S> {
  const tried: string[] = [];
  const table: Record<string, unknown> = {};
  // Bun binds by C name: aliases share the C symbol's binding.
  for (const [name, sig] of Object.entries(symbols)) table[sig.symbol ?? name] ??= bunSignature(sig);
  for (const path of candidates) {
    try {
      const lib = dlopen(path, table as any);
      const bound: Record<string, any> = {};
      for (const [name, sig] of Object.entries(symbols)) {
        const fn = (lib.symbols as any)[sig.symbol ?? name];
        // Bun has no nonblocking calls: the call runs here and its result arrives as a resolved Promise.
        bound[name] = sig.nonblocking ? (...a: any[]) => Promise.resolve(fn(...a)) : fn;
      }
      return {
        path,
        symbols: bound as any,
        close: () => lib.close(),
        [Symbol.dispose]: () => lib.close(),
      };
    } catch (e) {
      tried.push(`${path}: ${(e as Error).message.split("\n")[0]}`);
    }
  }
  throw new LibraryNotFoundError(candidates.join(" | "), tried);
}

let libc: ReturnType<typeof openLibrary<typeof libcSymbols>> | undefined;
function getLibc() {
  return (libc ??= openLibrary(libcCandidates(), libcSymbols));
}

export const bunFfi: Ffi = {
  runtime: "bun",
  open: openLibrary,
  fnPointer(address, signature) {
    return CFunction({ ptr: Number(address), ...bunSignature(signature) }) as any;
  },
  allocNative(bytes): NativeBlock {
    const address = getLibc().symbols.calloc(1n, BigInt(bytes)) as bigint;
    if (!address) throw new RangeError(`calloc(${bytes}) failed`);
    return { address, buffer: toArrayBuffer(Number(address), 0, bytes) };
  },
  freeNative(block) {
    getLibc().symbols.free(block.address);
  },
  view(address, bytes) {
    return toArrayBuffer(Number(address), 0, bytes);
  },
  cString(address) {
    return address ? new CString(Number(address) as any).toString() : "";
  },
  callback(signature, fn): NativeCallback {
    const cb = new JSCallback((...args: unknown[]) => fn(...args) ?? 0, bunSignature(signature));
    const close = () => cb.close();
    return { address: BigInt(cb.ptr as unknown as number), close, [Symbol.dispose]: close };
  },
};
