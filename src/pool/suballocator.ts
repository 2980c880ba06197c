/**
 * Best-fit suballocator over device-memory slabs.
 *
 * Device memory arrives in slabs (one VkDeviceMemory + buffer each, in the Vulkan backend) no
 * larger than the device allows. {@link SlabAllocator} carves aligned ranges out of them:
 *
 * - best fit across *all* slabs (smallest free block that fits, ties: lowest slab index, then
 *   lowest offset), so existing slabs fill up before a new one is created;
 * - an allocation never straddles two slabs;
 * - frees coalesce with both neighbours; a slab that becomes empty is destroyed, except up to
 *   `spareSlabs` empty slabs kept to absorb churn;
 * - offsets are plain numbers (exact: slabs are far below 2^53 bytes); device addresses are
 *   bigint end to end ({@link deviceAddress}).
 *
 * Cost: allocate / free are O(log F) expected (F = free blocks, kept in a treap keyed by
 * (size, slab, offset)) plus O(1) neighbour work; creating a slab is O(S) in the slab count.
 *
 * GPU-independent: memory comes from an abstract {@link SlabProvider}.
 */
import { InvalidArgumentError } from "../errors.ts";
import { AllocationTooLargeError, PoolDisposedError, PoolInvariantError } from "./errors.ts";

/** Where slabs come from. The Vulkan backend implements it with vkAllocateMemory + a buffer. */
export interface SlabProvider<H> {
  /**
   * Create a slab of exactly `bytes` bytes. May throw an `OutOfDeviceMemoryError` (or any
   * `VkmoeError` with code `OUT_OF_DEVICE_MEMORY`); other errors propagate as they are.
   */
  createSlab(bytes: number): H;
  /** Release a slab created by {@link createSlab}. Called once per slab. */
  destroySlab(handle: H): void;
  /** Optional: the slab's base device address (buffer device address), for {@link SlabAllocator.deviceAddressOf}. */
  slabDeviceAddress?(handle: H): bigint;
}

export interface SlabAllocatorOptions {
  /**
   * Effective upper bound on one slab, in bytes: the caller folds in maxMemoryAllocationSize,
   * maxBufferSize and (if slabs are bound whole) maxStorageBufferRange. Requests above it throw
   * {@link AllocationTooLargeError}.
   */
  maxSlabBytes: number;
  /** Size of a normal new slab (default min(256 MiB, maxSlabBytes)). Larger requests get a dedicated slab. */
  slabBytes?: number;
  /** Default alignment of allocations, a power of two (default 256). */
  alignment?: number;
  /** Empty slabs kept instead of destroyed (default 1; 0 = destroy every empty slab at once). */
  spareSlabs?: number;
}

/** Usage of one slab. */
export interface SlabUsage<H> {
  readonly index: number;
  readonly handle: H;
  /** Slab size in bytes. */
  readonly bytes: number;
  /** Bytes reserved by live allocations (each rounded up to its alignment, plus nothing else). */
  readonly usedBytes: number;
  readonly freeBytes: number;
  readonly allocations: number;
  /** Largest free block, in bytes. */
  readonly largestFreeBlock: number;
}

export interface AllocatorTotals {
  readonly slabCount: number;
  /** Empty slabs currently kept as spares. */
  readonly emptySlabs: number;
  /** Sum of slab sizes: the device memory this allocator holds. */
  readonly slabBytes: number;
  /** Bytes reserved by live allocations. */
  readonly usedBytes: number;
  /** Bytes requested by live allocations (<= usedBytes). */
  readonly requestedBytes: number;
  readonly freeBytes: number;
  readonly allocationCount: number;
  /** Slabs created / destroyed over the allocator's life. */
  readonly slabsCreated: number;
  readonly slabsDestroyed: number;
}

const MiB = 1024 * 1024;
const DEFAULT_SLAB_BYTES = 256 * MiB;
const DEFAULT_ALIGNMENT = 256;
/** Candidates examined by best fit before jumping to a block that fits whatever its alignment. */
const BEST_FIT_SCAN = 16;

/** Largest value a 64-bit device address can take. */
export const MAX_DEVICE_ADDRESS = (1n << 64n) - 1n;

/**
 * Pool-global 64-bit address of `offset` within a slab whose base device address is `base`.
 * bigint in, bigint out: never goes through a Number. Throws on a negative / non-integer /
 * unsafe offset and on results outside [0, 2^64).
 */
export function deviceAddress(base: bigint, offset: number): bigint {
  if (typeof base !== "bigint") throw new InvalidArgumentError(`device address base must be a bigint, got ${typeof base}`);
  if (base < 0n || base > MAX_DEVICE_ADDRESS) throw new InvalidArgumentError(`device address base ${base} is outside [0, 2^64)`);
  if (!Number.isSafeInteger(offset) || offset < 0) {
    throw new InvalidArgumentError(`offset must be a non-negative safe integer, got ${offset}`);
  }
  const address = base + BigInt(offset);
  if (address > MAX_DEVICE_ADDRESS) throw new InvalidArgumentError(`device address ${base} + ${offset} overflows 64 bits`);
  return address;
}

/** True for 1, 2, 4, ... up to 2^52 (exact above 2^32, where bitwise operators would wrap). */
export function isPowerOfTwo(n: number): boolean {
  if (!Number.isSafeInteger(n) || n <= 0) return false;
  while (n % 2 === 0) n /= 2;
  return n === 1;
}

/** Round `n` up to a multiple of the power of two `a` (exact for safe integers, also above 2^32). */
export function alignUp(n: number, a: number): number {
  const r = n % a;
  return r === 0 ? n : n + (a - r);
}

// ----------------------------------------------------------------------------------------------
// Internals

interface Slab<H> {
  index: number;
  handle: H;
  bytes: number;
  usedBytes: number;
  allocations: number;
  /** First block in address order; blocks tile [0, bytes) exactly. */
  head: Block<H>;
}

/** A range of a slab, free or allocated. Free blocks also live in the best-fit treap. */
class Block<H> {
  slab: Slab<H>;
  offset: number;
  size: number;
  free: boolean;
  prev: Block<H> | null = null;
  next: Block<H> | null = null;
  // treap links (free blocks only)
  left: Block<H> | null = null;
  right: Block<H> | null = null;
  prio = 0;
  allocation: SlabAllocation<H> | null = null;
  constructor(slab: Slab<H>, offset: number, size: number, free: boolean) {
    this.slab = slab;
    this.offset = offset;
    this.size = size;
    this.free = free;
  }
}

/** One live (or freed) allocation: (slabIndex, offset, size) plus the slab handle. */
export class SlabAllocation<H> {
  /** Index of the slab (stable while the allocation lives; indices of destroyed slabs get reused). */
  readonly slabIndex: number;
  /** Byte offset within the slab; a multiple of `alignment`. */
  readonly offset: number;
  /** Requested size in bytes. */
  readonly size: number;
  readonly alignment: number;
  /** The provider's handle of the slab. */
  readonly slab: H;
  /** @internal */
  _block: Block<H> | null;
  /** @internal */
  readonly _owner: SlabAllocator<H>;
  /** @internal */
  constructor(owner: SlabAllocator<H>, block: Block<H>, offset: number, size: number, alignment: number) {
    this._owner = owner;
    this._block = block;
    this.slabIndex = block.slab.index;
    this.slab = block.slab.handle;
    this.offset = offset;
    this.size = size;
    this.alignment = alignment;
  }
  /** False once freed (directly or by disposing the allocator). */
  get live(): boolean {
    return this._block !== null;
  }
}

type Key = { size: number; slab: number; offset: number };

function keyLess<H>(b: Block<H>, k: Key): boolean {
  if (b.size !== k.size) return b.size < k.size;
  if (b.slab.index !== k.slab) return b.slab.index < k.slab;
  return b.offset < k.offset;
}

function blockLess<H>(a: Block<H>, b: Block<H>): boolean {
  if (a.size !== b.size) return a.size < b.size;
  if (a.slab.index !== b.slab.index) return a.slab.index < b.slab.index;
  return a.offset < b.offset;
}

/** Treap of free blocks ordered by (size, slab index, offset). */
class FreeTree<H> {
  root: Block<H> | null = null;
  count = 0;
  private seed = 0x9e3779b9;

  private rand(): number {
    // xorshift32: deterministic, good enough for treap priorities
    let x = this.seed;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.seed = x >>> 0;
    return this.seed;
  }

  insert(node: Block<H>): void {
    node.left = node.right = null;
    node.prio = this.rand();
    this.root = this.insertAt(this.root, node);
    this.count++;
  }

  private insertAt(root: Block<H> | null, node: Block<H>): Block<H> {
    if (root === null) return node;
    if (blockLess(node, root)) {
      root.left = this.insertAt(root.left, node);
      if (root.left.prio > root.prio) {
        const l = root.left;
        root.left = l.right;
        l.right = root;
        return l;
      }
    } else {
      root.right = this.insertAt(root.right, node);
      if (root.right.prio > root.prio) {
        const r = root.right;
        root.right = r.left;
        r.left = root;
        return r;
      }
    }
    return root;
  }

  remove(node: Block<H>): void {
    this.root = this.removeAt(this.root, node);
    node.left = node.right = null;
    this.count--;
  }

  private removeAt(root: Block<H> | null, node: Block<H>): Block<H> | null {
    if (root === null) throw new PoolInvariantError("free block missing from the best-fit tree");
    if (root === node) return this.merge(root.left, root.right);
    if (blockLess(node, root)) root.left = this.removeAt(root.left, node);
    else root.right = this.removeAt(root.right, node);
    return root;
  }

  private merge(a: Block<H> | null, b: Block<H> | null): Block<H> | null {
    if (a === null) return b;
    if (b === null) return a;
    if (a.prio > b.prio) {
      a.right = this.merge(a.right, b);
      return a;
    }
    b.left = this.merge(a, b.left);
    return b;
  }

  /** Smallest block with key >= k. */
  lowerBound(k: Key): Block<H> | null {
    let n = this.root;
    let best: Block<H> | null = null;
    while (n !== null) {
      if (keyLess(n, k)) n = n.right;
      else {
        best = n;
        n = n.left;
      }
    }
    return best;
  }

  *inOrder(): Generator<Block<H>> {
    const stack: Block<H>[] = [];
    let n = this.root;
    while (n !== null || stack.length > 0) {
      while (n !== null) {
        stack.push(n);
        n = n.left;
      }
      const top = stack.pop()!;
      yield top;
      n = top.right;
    }
  }
}

function checkPositiveInt(name: string, v: number): void {
  if (!Number.isSafeInteger(v) || v <= 0) throw new InvalidArgumentError(`${name} must be a positive safe integer, got ${v}`);
}

function checkAlignment(a: number): void {
  if (!Number.isSafeInteger(a) || a <= 0 || !isPowerOfTwo(a)) {
    throw new InvalidArgumentError(`alignment must be a power of two, got ${a}`);
  }
}

// ----------------------------------------------------------------------------------------------

/** Best-fit suballocator over slabs from a {@link SlabProvider}. See the module comment. */
export class SlabAllocator<H> implements Disposable {
  readonly maxSlabBytes: number;
  readonly slabBytes: number;
  readonly alignment: number;
  readonly spareSlabs: number;

  private readonly provider: SlabProvider<H>;
  private readonly slabList: (Slab<H> | undefined)[] = [];
  private readonly freeTree = new FreeTree<H>();
  private liveSlabs = 0;
  private emptySlabCount = 0;
  private totalSlabBytes = 0;
  private usedBytes = 0;
  private requestedBytes = 0;
  private allocationCount = 0;
  private created = 0;
  private destroyed = 0;
  private disposed = false;

  constructor(provider: SlabProvider<H>, options: SlabAllocatorOptions) {
    checkPositiveInt("maxSlabBytes", options.maxSlabBytes);
    const slabBytes = options.slabBytes ?? Math.min(DEFAULT_SLAB_BYTES, options.maxSlabBytes);
    checkPositiveInt("slabBytes", slabBytes);
    if (slabBytes > options.maxSlabBytes) {
      throw new InvalidArgumentError(`slabBytes (${slabBytes}) exceeds maxSlabBytes (${options.maxSlabBytes})`);
    }
    const alignment = options.alignment ?? DEFAULT_ALIGNMENT;
    checkAlignment(alignment);
    const spare = options.spareSlabs ?? 1;
    if (!Number.isSafeInteger(spare) || spare < 0) throw new InvalidArgumentError(`spareSlabs must be >= 0, got ${spare}`);
    this.provider = provider;
    this.maxSlabBytes = options.maxSlabBytes;
    this.slabBytes = slabBytes;
    this.alignment = alignment;
    this.spareSlabs = spare;
  }

  /**
   * Allocate `size` bytes aligned to `alignment` (default: the allocator's). Best fit over the
   * existing slabs; creates a new slab only when none fits. Throws {@link AllocationTooLargeError}
   * when `size` exceeds `maxSlabBytes`, and lets the provider's out-of-memory error through
   * (nothing changes in that case).
   */
  allocate(size: number, alignment: number = this.alignment): SlabAllocation<H> {
    const found = this.tryAllocate(size, alignment);
    if (found !== undefined) return found;
    if (size > this.maxSlabBytes) throw new AllocationTooLargeError(size, this.maxSlabBytes);
    // Normal requests get a standard slab; bigger ones a dedicated slab of their own size.
    const reserve = Math.min(alignUp(size, alignment), this.maxSlabBytes);
    const bytes = reserve <= this.slabBytes ? this.slabBytes : reserve;
    const slab = this.createSlab(bytes);
    return this.carve(slab.head, size, alignment);
  }

  /**
   * Like {@link allocate} but never creates a slab: returns undefined when no existing free
   * block fits. Throws {@link AllocationTooLargeError} for sizes above `maxSlabBytes`.
   */
  tryAllocate(size: number, alignment: number = this.alignment): SlabAllocation<H> | undefined {
    this.checkLive();
    checkPositiveInt("size", size);
    checkAlignment(alignment);
    if (size > this.maxSlabBytes) throw new AllocationTooLargeError(size, this.maxSlabBytes);
    const block = this.bestFit(size, alignment);
    return block === null ? undefined : this.carve(block, size, alignment);
  }

  /** True if `size` bytes at `alignment` fit into an existing slab right now (no slab creation). */
  canFit(size: number, alignment: number = this.alignment): boolean {
    this.checkLive();
    checkPositiveInt("size", size);
    checkAlignment(alignment);
    return size <= this.maxSlabBytes && this.bestFit(size, alignment) !== null;
  }

  /** Free an allocation; coalesces with neighbours and may release the slab if it became empty. */
  free(allocation: SlabAllocation<H>): void {
    this.checkLive();
    if (allocation._owner !== this) throw new InvalidArgumentError("allocation belongs to another allocator");
    let block = allocation._block;
    if (block === null) throw new InvalidArgumentError(`allocation (slab ${allocation.slabIndex}, offset ${allocation.offset}) was already freed`);
    allocation._block = null;
    block.allocation = null;
    block.free = true;
    const slab = block.slab;
    slab.usedBytes -= block.size;
    slab.allocations--;
    this.usedBytes -= block.size;
    this.requestedBytes -= allocation.size;
    this.allocationCount--;

    const prev = block.prev;
    if (prev !== null && prev.free) {
      this.freeTree.remove(prev);
      prev.size += block.size;
      prev.next = block.next;
      if (block.next !== null) block.next.prev = prev;
      block = prev;
    }
    const next = block.next;
    if (next !== null && next.free) {
      this.freeTree.remove(next);
      block.size += next.size;
      block.next = next.next;
      if (next.next !== null) next.next.prev = block;
    }
    this.freeTree.insert(block);

    if (slab.allocations === 0) {
      this.emptySlabCount++;
      if (this.emptySlabCount > this.spareSlabs) this.destroySlab(slab);
    }
  }

  /** Destroy every empty slab (including spares). Returns how many were destroyed. */
  trim(): number {
    this.checkLive();
    let n = 0;
    for (const slab of this.slabList) {
      if (slab !== undefined && slab.allocations === 0) {
        this.destroySlab(slab);
        n++;
      }
    }
    return n;
  }

  /** Per-slab usage, in slab index order. O(blocks). */
  slabs(): SlabUsage<H>[] {
    const out: SlabUsage<H>[] = [];
    for (const slab of this.slabList) {
      if (slab === undefined) continue;
      let largest = 0;
      for (let b: Block<H> | null = slab.head; b !== null; b = b.next) if (b.free && b.size > largest) largest = b.size;
      out.push({
        index: slab.index,
        handle: slab.handle,
        bytes: slab.bytes,
        usedBytes: slab.usedBytes,
        freeBytes: slab.bytes - slab.usedBytes,
        allocations: slab.allocations,
        largestFreeBlock: largest,
      });
    }
    return out;
  }

  totals(): AllocatorTotals {
    return {
      slabCount: this.liveSlabs,
      emptySlabs: this.emptySlabCount,
      slabBytes: this.totalSlabBytes,
      usedBytes: this.usedBytes,
      requestedBytes: this.requestedBytes,
      freeBytes: this.totalSlabBytes - this.usedBytes,
      allocationCount: this.allocationCount,
      slabsCreated: this.created,
      slabsDestroyed: this.destroyed,
    };
  }

  /** The provider handle of live slab `index`. */
  slabHandle(index: number): H {
    const slab = this.slabList[index];
    if (slab === undefined) throw new InvalidArgumentError(`no live slab with index ${index}`);
    return slab.handle;
  }

  /** Whether {@link deviceAddressOf} works: the provider exposes slab device addresses. */
  get hasDeviceAddresses(): boolean {
    return this.provider.slabDeviceAddress !== undefined;
  }

  /** 64-bit device address of an allocation (needs `provider.slabDeviceAddress`). */
  deviceAddressOf(allocation: SlabAllocation<H>): bigint {
    if (!allocation.live) throw new InvalidArgumentError("allocation was freed");
    if (this.provider.slabDeviceAddress === undefined) {
      throw new InvalidArgumentError("the slab provider does not expose device addresses");
    }
    return deviceAddress(this.provider.slabDeviceAddress(allocation.slab), allocation.offset);
  }

  /**
   * Verify the internal structure; throws {@link PoolInvariantError} on the first problem.
   * O(blocks); meant for tests and debugging.
   */
  checkInvariants(): void {
    const fail = (m: string): never => {
      throw new PoolInvariantError(m);
    };
    let freeBlocks = 0, used = 0, requested = 0, allocs = 0, slabBytes = 0, slabs = 0, empty = 0;
    for (let i = 0; i < this.slabList.length; i++) {
      const slab = this.slabList[i];
      if (slab === undefined) continue;
      slabs++;
      slabBytes += slab.bytes;
      if (slab.index !== i) fail(`slab at ${i} has index ${slab.index}`);
      let pos = 0, su = 0, sa = 0;
      let prev: Block<H> | null = null;
      for (let b: Block<H> | null = slab.head; b !== null; b = b.next) {
        if (b.slab !== slab) fail("block points at a foreign slab");
        if (b.prev !== prev) fail("broken prev link");
        if (b.offset !== pos) fail(`slab ${i}: gap or overlap at ${pos} (block at ${b.offset})`);
        if (b.size <= 0) fail(`slab ${i}: empty block at ${b.offset}`);
        if (b.free) {
          freeBlocks++;
          if (prev !== null && prev.free) fail(`slab ${i}: adjacent free blocks at ${b.offset} not coalesced`);
          if (b.allocation !== null) fail("free block holds an allocation");
        } else {
          const a: SlabAllocation<H> | null = b.allocation;
          if (a === null || a._block !== b) fail("used block without its allocation");
          else {
            if (a.offset % a.alignment !== 0) fail(`misaligned allocation at ${a.offset} (alignment ${a.alignment})`);
            if (a.offset < b.offset || a.offset + a.size > b.offset + b.size) fail("allocation outside its block");
            if (a.slabIndex !== i) fail("allocation slab index mismatch");
            requested += a.size;
          }
          su += b.size;
          sa++;
        }
        pos += b.size;
        prev = b;
      }
      if (pos !== slab.bytes) fail(`slab ${i}: blocks cover ${pos} of ${slab.bytes} bytes`);
      if (su !== slab.usedBytes || sa !== slab.allocations) fail(`slab ${i}: usage counters out of date`);
      if (sa === 0) empty++;
      used += su;
      allocs += sa;
    }
    if (freeBlocks !== this.freeTree.count) fail(`free tree holds ${this.freeTree.count} blocks, slabs have ${freeBlocks}`);
    let last: Block<H> | null = null, seen = 0;
    for (const b of this.freeTree.inOrder()) {
      if (!b.free) fail("used block in the free tree");
      if (last !== null && !blockLess(last, b)) fail("free tree out of order");
      if (this.slabList[b.slab.index] !== b.slab) fail("free tree holds a block of a destroyed slab");
      last = b;
      seen++;
    }
    if (seen !== freeBlocks) fail("free tree size mismatch");
    if (used !== this.usedBytes || requested !== this.requestedBytes || allocs !== this.allocationCount) fail("totals out of date");
    if (slabBytes !== this.totalSlabBytes || slabs !== this.liveSlabs || empty !== this.emptySlabCount) fail("slab totals out of date");
    if (this.emptySlabCount > this.spareSlabs) fail(`${this.emptySlabCount} empty slabs kept, spareSlabs is ${this.spareSlabs}`);
  }

  /** Destroy every slab; all outstanding allocations become dead. Idempotent. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    let firstError: unknown = undefined;
    for (const slab of this.slabList) {
      if (slab === undefined) continue;
      for (let b: Block<H> | null = slab.head; b !== null; b = b.next) {
        if (b.allocation !== null) {
          b.allocation._block = null;
          b.allocation = null;
        }
      }
      try {
        this.provider.destroySlab(slab.handle);
      } catch (e) {
        firstError ??= e;
      }
      this.destroyed++;
    }
    this.slabList.length = 0;
    this.freeTree.root = null;
    this.freeTree.count = 0;
    this.liveSlabs = this.emptySlabCount = this.totalSlabBytes = 0;
    this.usedBytes = this.requestedBytes = this.allocationCount = 0;
    if (firstError !== undefined) throw firstError;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  get isDisposed(): boolean {
    return this.disposed;
  }

  // --------------------------------------------------------------------------------------------

  private checkLive(): void {
    if (this.disposed) throw new PoolDisposedError("SlabAllocator");
  }

  private static fits<H>(b: Block<H>, size: number, alignment: number): boolean {
    return alignUp(b.offset, alignment) + size <= b.offset + b.size;
  }

  private bestFit(size: number, alignment: number): Block<H> | null {
    let b = this.freeTree.lowerBound({ size, slab: -1, offset: -1 });
    for (let i = 0; b !== null && i < BEST_FIT_SCAN; i++) {
      if (SlabAllocator.fits(b, size, alignment)) return b;
      b = this.freeTree.lowerBound({ size: b.size, slab: b.slab.index, offset: b.offset + 1 });
    }
    if (b === null) return null;
    // Any block of size >= size + alignment - 1 fits whatever its offset.
    b = this.freeTree.lowerBound({ size: size + alignment - 1, slab: -1, offset: -1 });
    return b;
  }

  /** Split `block` (free) into [pad][allocation][tail]; returns the allocation. */
  private carve(block: Block<H>, size: number, alignment: number): SlabAllocation<H> {
    this.freeTree.remove(block);
    const slab = block.slab;
    const start = alignUp(block.offset, alignment);
    const end = Math.min(start + alignUp(size, alignment), block.offset + block.size);
    if (start > block.offset) {
      const pad = new Block(slab, block.offset, start - block.offset, true);
      pad.prev = block.prev;
      pad.next = block;
      if (block.prev !== null) block.prev.next = pad;
      else slab.head = pad;
      block.prev = pad;
      this.freeTree.insert(pad);
    }
    const blockEnd = block.offset + block.size;
    if (end < blockEnd) {
      const tail = new Block(slab, end, blockEnd - end, true);
      tail.prev = block;
      tail.next = block.next;
      if (block.next !== null) block.next.prev = tail;
      block.next = tail;
      this.freeTree.insert(tail);
    }
    block.offset = start;
    block.size = end - start;
    block.free = false;
    if (slab.allocations === 0) this.emptySlabCount--;
    slab.allocations++;
    slab.usedBytes += block.size;
    this.usedBytes += block.size;
    this.requestedBytes += size;
    this.allocationCount++;
    const allocation = new SlabAllocation(this, block, start, size, alignment);
    block.allocation = allocation;
    return allocation;
  }

  private createSlab(bytes: number): Slab<H> {
    const handle = this.provider.createSlab(bytes); // may throw OOM: nothing changed yet
    let index = this.slabList.indexOf(undefined);
    if (index < 0) index = this.slabList.length;
    const slab = { index, handle, bytes, usedBytes: 0, allocations: 0 } as Slab<H>;
    slab.head = new Block(slab, 0, bytes, true);
    this.slabList[index] = slab;
    this.freeTree.insert(slab.head);
    this.liveSlabs++;
    this.emptySlabCount++;
    this.totalSlabBytes += bytes;
    this.created++;
    return slab;
  }

  private destroySlab(slab: Slab<H>): void {
    // An empty slab is exactly one free block.
    this.freeTree.remove(slab.head);
    this.slabList[slab.index] = undefined;
    while (this.slabList.length > 0 && this.slabList[this.slabList.length - 1] === undefined) this.slabList.pop();
    this.liveSlabs--;
    this.emptySlabCount--;
    this.totalSlabBytes -= slab.bytes;
    this.destroyed++;
    this.provider.destroySlab(slab.handle);
  }
}
