/**
 * Read-only memory maps of files, through libc (open, pread, lseek, mmap, munmap, close) over the
 * runtime seam: Deno has no mmap API and Bun's `Bun.mmap` does not exist under Deno, so both go
 * through the same C calls. The pages stay in the kernel's page cache; nothing is copied into the
 * JS heap, and a view into a mapping costs nothing until it is read.
 */
import { VkmoeError } from "../errors.ts";
import { ffi } from "./index.ts";
import { libcCandidates } from "./libc.ts";
import type { NativeLibrary } from "./types.ts";

export interface MappedFile extends Disposable {
  /**
   * The whole file, read-only (PROT_READ: a write faults). Valid until dispose. Throws RangeError
   * for a file over 4 GiB (Bun's ArrayBuffer limit): use view() there.
   */
  readonly bytes: Uint8Array;
  readonly byteLength: number;
  readonly path: string;
  /** A view of [offset, offset + length), at any offset of a file of any size (one range at most 4 GiB under Bun). Valid until dispose. */
  view(offset: number, length: number): Uint8Array;
  /**
   * Drops the whole pages inside [offset, offset + length) from this process (MADV_DONTNEED), so
   * data already copied elsewhere (uploaded to the GPU, converted) stops counting in its memory.
   * Views stay valid: reading them again faults the pages back in from the file.
   */
  release(offset: number, length: number): void;
}

/** A file could not be opened or mapped. `errno` and `reason` are the C library's (strerror). */
export class FileMapError extends VkmoeError {
  readonly path: string;
  readonly call: string;
  readonly errno: number;
  readonly errnoName: string | undefined;
  readonly reason: string;
  constructor(path: string, call: string, errno: number, reason: string, message?: string) {
    const name = ERRNO_NAMES[errno];
    super("FILE_MAP", message ?? `cannot map ${path}: ${reason}${name ? ` (${name})` : ""} in ${call}()`);
    this.path = path;
    this.call = call;
    this.errno = errno;
    this.errnoName = name;
    this.reason = reason;
  }
}

// Linux numbering; the low ones are the same on macOS.
const ERRNO_NAMES: Record<number, string> = {
  1: "EPERM", 2: "ENOENT", 5: "EIO", 9: "EBADF", 12: "ENOMEM", 13: "EACCES", 19: "ENODEV",
  20: "ENOTDIR", 21: "EISDIR", 22: "EINVAL", 23: "ENFILE", 24: "EMFILE", 27: "EFBIG", 29: "ESPIPE", 36: "ENAMETOOLONG", 40: "ELOOP",
};
const EISDIR = 21;

const PROT_READ = 1;
const MAP_PRIVATE = 2;
const SEEK_END = 2;
/** MADV_DONTNEED on Linux and macOS. */
const MADV_DONTNEED = 4;
/** The smallest page size of the platforms served; releasing inside 64 KiB boundaries is safe for 4, 16 and 64 KiB pages. */
const RELEASE_ALIGN = 65536;
const MAP_FAILED = (1n << 64n) - 1n; // (void *)-1 as an unsigned address
/** Bun (JavaScriptCore) refuses an ArrayBuffer over 2^32 bytes ("Out of memory"); Deno's V8 allows more. Measured, Bun 1.4.4. */
const WHOLE_VIEW_LIMIT = 2 ** 32;

function platform(): string {
  return globalThis.process?.platform ?? (globalThis as any).Deno?.build?.os;
}

function symbolsFor(os: string) {
  return {
    open: { args: ["ptr", "i32"], returns: "i32" },
    pread: { args: ["i32", "ptr", "u64", "u64"], returns: "u64" },
    lseek: { args: ["i32", "u64", "i32"], returns: "u64" },
    mmap: { args: ["ptr", "u64", "i32", "i32", "i32", "u64"], returns: "ptr" },
    munmap: { args: ["ptr", "u64"], returns: "i32" },
    madvise: { args: ["ptr", "u64", "i32"], returns: "i32" },
    close: { args: ["i32"], returns: "i32" },
    strerror: { args: ["i32"], returns: "ptr" },
    // errno is thread-local: libc hands out its address. The FFI call runs on this thread on both runtimes.
    errnoLocation: { args: [], returns: "ptr", symbol: os === "darwin" ? "__error" : "__errno_location" },
  } as const;
}

type MmapLibc = NativeLibrary<ReturnType<typeof symbolsFor>>;
let libc: MmapLibc | undefined;

function getLibc(path: string): MmapLibc {
  if (libc) return libc;
  const os = platform();
  if (os === "win32" || os === "windows") {
    throw new FileMapError(path, "mmap", 0, "Windows is not supported", `cannot map ${path}: mapping model files needs a POSIX C library (Linux or macOS); Windows is not supported`);
  }
  return (libc = ffi.open(libcCandidates(), symbolsFor(os)));
}

/** O_RDONLY | O_CLOEXEC: a child process started later must not inherit the descriptor. */
function openFlags(): number {
  return platform() === "darwin" ? 0x1000000 : 0o2000000;
}

const signed = (v: bigint) => BigInt.asIntN(64, BigInt(v));

function lastError(c: MmapLibc): { errno: number; reason: string } {
  const errno = new Int32Array(ffi.view(c.symbols.errnoLocation() as bigint, 4))[0]!;
  return { errno, reason: ffi.cString(c.symbols.strerror(errno) as bigint) };
}

function fail(c: MmapLibc, path: string, call: string): never {
  const { errno, reason } = lastError(c);
  throw new FileMapError(path, call, errno, reason);
}

/**
 * Maps `path` read-only (MAP_PRIVATE). Any size works, past 4 GiB too; a 0-byte file maps to an
 * empty view without calling mmap (which rejects length 0). Throws FileMapError naming the path
 * and the C library's reason: missing file (ENOENT), a directory (EISDIR), no permission (EACCES).
 */
export function mapFile(path: string): MappedFile {
  const c = getLibc(path);
  const fd = openFd(c, path);
  let size: number;
  let address = 0n;
  try {
    rejectDirectory(c, fd, path);
    const end = signed(c.symbols.lseek(fd, 0n, SEEK_END) as bigint);
    if (end < 0n) fail(c, path, "lseek");
    if (end > BigInt(Number.MAX_SAFE_INTEGER)) throw new FileMapError(path, "lseek", 27, `size ${end} is beyond 2^53 bytes`);
    size = Number(end);
    if (size > 0) {
      address = c.symbols.mmap(0n, BigInt(size), PROT_READ, MAP_PRIVATE, fd, 0n) as bigint;
      if (address === MAP_FAILED) fail(c, path, "mmap");
    }
  } finally {
    // The mapping keeps the file referenced; the descriptor is not needed past mmap.
    c.symbols.close(fd);
  }
  return new Mapping(c, path, address, size);
}

function openFd(c: MmapLibc, path: string): number {
  // C would read the path only up to the NUL and open some other file.
  if (path.includes("\0")) throw new FileMapError(path, "open", 22, "the path contains a NUL character", `cannot map ${JSON.stringify(path)}: the path contains a NUL character`);
  const encoded = new TextEncoder().encode(path);
  const block = ffi.allocNative(encoded.length + 1); // zeroed: the NUL is already there
  try {
    new Uint8Array(block.buffer).set(encoded);
    const fd = c.symbols.open(block.address, openFlags()) as number;
    if (fd < 0) fail(c, path, "open");
    return fd;
  } finally {
    ffi.freeNative(block);
  }
}

/** open() succeeds on a directory; reading a byte is the portable way to get EISDIR before lseek or mmap give vaguer errors. */
function rejectDirectory(c: MmapLibc, fd: number, path: string): void {
  const probe = ffi.allocNative(8);
  try {
    if (signed(c.symbols.pread(fd, probe.address, 1n, 0n) as bigint) >= 0n) return;
    const { errno, reason } = lastError(c);
    if (errno === EISDIR) throw new FileMapError(path, "read", errno, reason, `cannot map ${path}: it is a directory, not a file`);
    throw new FileMapError(path, "read", errno, reason);
  } finally {
    ffi.freeNative(probe);
  }
}

class Mapping implements MappedFile {
  readonly path: string;
  readonly byteLength: number;
  private address: bigint;
  private whole: Uint8Array | undefined;

  constructor(private readonly c: MmapLibc, path: string, address: bigint, byteLength: number) {
    this.path = path;
    this.address = address;
    this.byteLength = byteLength;
  }

  get bytes(): Uint8Array {
    this.assertOpen();
    if (this.byteLength > WHOLE_VIEW_LIMIT) {
      throw new RangeError(`${this.path} is ${this.byteLength} bytes: one ArrayBuffer holds at most 4 GiB under Bun; use view(offset, length)`);
    }
    return this.wholeView();
  }

  view(offset: number, length: number): Uint8Array {
    this.assertOpen();
    if (!(Number.isSafeInteger(offset) && Number.isSafeInteger(length) && offset >= 0 && length >= 0 && offset + length <= this.byteLength)) {
      throw new RangeError(`view [${offset}, +${length}) is outside ${this.path} (${this.byteLength} bytes)`);
    }
    if (length === 0) return new Uint8Array(0);
    // Views of a file that fits one ArrayBuffer share it; a larger file gets one ArrayBuffer per view.
    if (this.byteLength <= WHOLE_VIEW_LIMIT) return this.wholeView().subarray(offset, offset + length);
    return new Uint8Array(ffi.view(this.address + BigInt(offset), length));
  }

  release(offset: number, length: number): void {
    this.assertOpen();
    const start = Math.ceil(offset / RELEASE_ALIGN) * RELEASE_ALIGN;
    const end = Math.min(this.byteLength, Math.floor((offset + length) / RELEASE_ALIGN) * RELEASE_ALIGN);
    // Advice only: a failure leaves the pages resident, which is what no call would have done.
    if (end > start) this.c.symbols.madvise(this.address + BigInt(start), BigInt(end - start), MADV_DONTNEED);
  }

  private wholeView(): Uint8Array {
    if (this.byteLength === 0) return new Uint8Array(0);
    return (this.whole ??= new Uint8Array(ffi.view(this.address, this.byteLength)));
  }

  private assertOpen(): void {
    if (this.address === 0n && this.byteLength > 0) throw new RangeError(`${this.path} was unmapped`);
  }

  [Symbol.dispose](): void {
    if (this.address === 0n) return;
    // Views made from this mapping must not be read after this point: the pages are gone.
    this.c.symbols.munmap(this.address, BigInt(this.byteLength));
    this.address = 0n;
    this.whole = undefined;
  }
}
