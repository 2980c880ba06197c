import { ffi } from "./index.ts";
import type { NativeBlock } from "./types.ts";

/**
 * A zeroed block of C heap that structs and arrays handed to Vulkan live in. Addresses are
 * base + offset, independent of the JS garbage collector. Allocation is a bump pointer; `scope()`
 * returns a mark that rewinds (and re-zeroes) on dispose, so setup code can use `using`.
 */
export class NativeArena implements Disposable {
  readonly base: bigint;
  readonly size: number;
  readonly bytes: Uint8Array;
  readonly view: DataView;
  private block: NativeBlock | undefined;
  private top = 0;

  constructor(size = 1 << 20) {
    this.block = ffi.allocNative(size);
    this.base = this.block.address;
    this.size = size;
    this.bytes = new Uint8Array(this.block.buffer);
    this.view = new DataView(this.block.buffer);
  }

  /** Reserves `bytes` zeroed bytes aligned to `align`; returns the offset into the arena. */
  alloc(bytes: number, align = 8): number {
    if (!this.block) throw new Error("NativeArena used after dispose");
    const offset = (this.top + align - 1) & ~(align - 1);
    const end = offset + Math.max(bytes, 0);
    if (end > this.size) throw new RangeError(`NativeArena exhausted: need ${end} of ${this.size} bytes`);
    this.top = end;
    return offset;
  }

  address(offset: number): bigint {
    return this.base + BigInt(offset);
  }

  /** Copies a NUL-terminated UTF-8 string in; returns its address. */
  cString(text: string): bigint {
    const encoded = new TextEncoder().encode(text);
    const offset = this.alloc(encoded.length + 1, 1);
    this.bytes.set(encoded, offset);
    return this.address(offset);
  }

  /** Marks the current top; disposing the mark frees and zeroes everything allocated since. */
  scope(): Disposable {
    const mark = this.top;
    return {
      [Symbol.dispose]: () => {
        this.bytes.fill(0, mark, this.top);
        this.top = mark;
      },
    };
  }

  get used(): number {
    return this.top;
  }

  [Symbol.dispose](): void {
    if (!this.block) return;
    ffi.freeNative(this.block);
    this.block = undefined;
  }
}
