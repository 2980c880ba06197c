import { LibraryNotFoundError } from "./errors.ts";
import { libcCandidates, libcSymbols } from "./libc.ts";
import type { Ffi, FnSignature, NativeBlock, NativeCallback, NativeFn, NativeLibrary, NativeType, SymbolTable } from "./types.ts";

declare const Deno: any;

function denoType(t: NativeType): string {
  return t === "ptr" ? "u64" : t;
}

function denoSignature(sig: FnSignature, name?: string) {
  return {
    ...(name ? { name } : {}),
    parameters: sig.args.map(denoType),
    result: denoType(sig.returns),
    ...(sig.nonblocking ? { nonblocking: true } : {}),
  };
}

const returnsWide = (sig: FnSignature) => sig.returns === "u64" || sig.returns === "ptr";

// Deno hands back 64-bit results as number when they fit; the seam promises bigint.
function widen(fn: NativeFn, sig: FnSignature): NativeFn {
  if (!returnsWide(sig)) return fn;
  if (sig.nonblocking) return (...a) => fn(...a).then((v: number | bigint) => BigInt(v));
  return (...a) => BigInt(fn(...a));
}

function openLibrary<S extends SymbolTable>(candidates: readonly string[], symbols: S): NativeLibrary<S> {
  const tried: string[] = [];
  const table: Record<string, unknown> = {};
  for (const [name, sig] of Object.entries(symbols)) table[name] = denoSignature(sig, sig.symbol);
  for (const path of candidates) {
    try {
      const lib = Deno.dlopen(path, table);
      const wrapped: Record<string, NativeFn> = {};
      for (const [name, sig] of Object.entries(symbols)) wrapped[name] = widen(lib.symbols[name], sig);
      return { path, symbols: wrapped as any, close: () => lib.close(), [Symbol.dispose]: () => lib.close() };
    } catch (e) {
      tried.push(`${path}: ${(e as Error).message.split("\n")[0]}`);
    }
  }
  throw new LibraryNotFoundError(candidates.join(" | "), tried);
}

let libc: NativeLibrary<typeof libcSymbols> | undefined;
function getLibc() {
  return (libc ??= openLibrary(libcCandidates(), libcSymbols));
}

const pointerOf = (address: bigint) => Deno.UnsafePointer.create(address);

export const denoFfi: Ffi = {
  runtime: "deno",
  open: openLibrary,
  fnPointer(address, signature) {
    const fp = new Deno.UnsafeFnPointer(pointerOf(address), denoSignature(signature));
    return widen((...args) => fp.call(...args), signature);
  },
  allocNative(bytes): NativeBlock {
    const address = getLibc().symbols.calloc(1n, BigInt(bytes)) as bigint;
    if (!address) throw new RangeError(`calloc(${bytes}) failed`);
    return { address, buffer: Deno.UnsafePointerView.getArrayBuffer(pointerOf(address), bytes) };
  },
  freeNative(block) {
    getLibc().symbols.free(block.address);
  },
  view(address, bytes) {
    return Deno.UnsafePointerView.getArrayBuffer(pointerOf(address), bytes);
  },
  cString(address) {
    return address ? Deno.UnsafePointerView.getCString(pointerOf(address)) : "";
  },
  callback(signature, fn): NativeCallback {
    const cb = new Deno.UnsafeCallback(denoSignature(signature), (...args: unknown[]) => fn(...args) ?? 0);
    const close = () => cb.close();
    return { address: BigInt(Deno.UnsafePointer.value(cb.pointer)), close, [Symbol.dispose]: close };
  },
};
