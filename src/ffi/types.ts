/**
 * The runtime seam: everything above src/ffi/ talks to native code through these types only.
 * Pointers and 64-bit integers cross as bigint; 32-bit values as number.
 */

/** `ptr` is a native address passed with the u64 ABI (correct on x86-64 and arm64); it is a bigint on both sides. */
export type NativeType = "void" | "i32" | "u32" | "u64" | "f32" | "f64" | "ptr";

export interface FnSignature {
  readonly args: readonly NativeType[];
  readonly returns: NativeType;
  /** Deno runs such a call on a worker thread and returns a Promise; Bun calls it synchronously and returns a resolved Promise. */
  readonly nonblocking?: boolean;
  /** The C symbol when the table key is an alias (e.g. a nonblocking variant of a blocking call). */
  readonly symbol?: string;
}

export type NativeArg = number | bigint;
export type NativeFn = (...args: NativeArg[]) => any;

export type SymbolTable = Record<string, FnSignature>;

export interface NativeLibrary<S extends SymbolTable> extends Disposable {
  /** The path or name that opened. */
  readonly path: string;
  readonly symbols: { readonly [K in keyof S]: NativeFn };
  close(): void;
}

export interface NativeCallback extends Disposable {
  readonly address: bigint;
  close(): void;
}

export interface NativeBlock {
  readonly address: bigint;
  readonly buffer: ArrayBuffer;
}

export interface Ffi {
  readonly runtime: "bun" | "deno";
  /** Opens the first candidate that loads, binding every symbol. Throws LibraryNotFoundError naming every path tried. */
  open<S extends SymbolTable>(candidates: readonly string[], symbols: S): NativeLibrary<S>;
  /** A callable for a function pointer from vkGet*ProcAddr. In Deno this costs ~1.2 us a call: setup paths only. */
  fnPointer(address: bigint, signature: FnSignature): NativeFn;
  /** Zeroed native memory from the C heap; its address never moves. Release with freeNative. */
  allocNative(bytes: number): NativeBlock;
  freeNative(block: NativeBlock): void;
  /** An ArrayBuffer over foreign memory (mapped Vulkan memory); valid while the owner keeps it mapped. */
  view(address: bigint, bytes: number): ArrayBuffer;
  /** Reads a NUL-terminated UTF-8 string. */
  cString(address: bigint): string;
  /** A native function pointer that calls back into JS on the calling thread. */
  callback(signature: FnSignature, fn: (...args: any[]) => number | bigint | void): NativeCallback;
}
