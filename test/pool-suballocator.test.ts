import { mulberry32 } from "../src/quant/random.ts";
import { describe, expect, test } from "bun:test";
import { InvalidArgumentError, VkmoeError } from "../src/errors.ts";
import {
  AllocationTooLargeError,
  alignUp,
  deviceAddress,
  HostMemorySlabProvider,
  HostMemoryUploader,
  isPowerOfTwo,
  MAX_DEVICE_ADDRESS,
  OutOfDeviceMemoryError,
  PoolDisposedError,
  type SlabAllocation,
  SlabAllocator,
  type HostSlab,
} from "../src/pool/index.ts";

const rng = mulberry32;

const GiB = 1024 ** 3;

function make(opts: { max?: number; slab?: number; align?: number; spare?: number; backed?: boolean } = {}) {
  const provider = new HostMemorySlabProvider({ backed: opts.backed ?? true });
  const allocator = new SlabAllocator(provider, {
    maxSlabBytes: opts.max ?? 4096,
    slabBytes: opts.slab,
    alignment: opts.align ?? 16,
    spareSlabs: opts.spare ?? 0,
  });
  return { provider, allocator };
}

describe("SlabAllocator basics", () => {
  test("alignment is respected for every power of two", () => {
    const { allocator } = make({ max: 1 << 20, align: 1 });
    for (const a of [1, 2, 4, 8, 64, 256, 4096, 65536]) {
      for (const size of [1, 3, 17, 1000]) {
        const x = allocator.allocate(size, a);
        expect(x.offset % a).toBe(0);
        expect(x.alignment).toBe(a);
        expect(x.size).toBe(size);
      }
    }
    allocator.checkInvariants();
  });

  test("rejects bad alignment and size", () => {
    const { allocator } = make();
    expect(() => allocator.allocate(16, 3)).toThrow(InvalidArgumentError);
    expect(() => allocator.allocate(0)).toThrow(InvalidArgumentError);
    expect(() => allocator.allocate(1.5)).toThrow(InvalidArgumentError);
    expect(() => new SlabAllocator(new HostMemorySlabProvider(), { maxSlabBytes: 100, slabBytes: 200 })).toThrow(InvalidArgumentError);
    expect(isPowerOfTwo(2 ** 40)).toBe(true);
    expect(isPowerOfTwo(2 ** 40 + 2 ** 33)).toBe(false);
    expect(alignUp(2 ** 33 + 1, 2 ** 32)).toBe(2 ** 33 + 2 ** 32);
  });

  test("request larger than the max slab is a typed error and creates nothing", () => {
    const { allocator, provider } = make({ max: 1024 });
    let err: unknown;
    try {
      allocator.allocate(1025);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(AllocationTooLargeError);
    expect(err).toBeInstanceOf(VkmoeError);
    expect((err as AllocationTooLargeError).code).toBe("ALLOCATION_TOO_LARGE");
    expect((err as AllocationTooLargeError).maxBytes).toBe(1024);
    expect(provider.created).toBe(0);
    expect(() => allocator.tryAllocate(5000)).toThrow(AllocationTooLargeError);
    // exactly the max is fine
    expect(allocator.allocate(1024).size).toBe(1024);
  });

  test("never straddles slabs: an allocation that does not fit the rest of a slab opens a new one", () => {
    const { allocator } = make({ max: 1000, align: 8 });
    const a = allocator.allocate(600);
    const b = allocator.allocate(600);
    expect(a.slabIndex).toBe(0);
    expect(b.slabIndex).toBe(1);
    expect(b.offset).toBe(0);
    const c = allocator.allocate(400); // fits the tail of slab 0 (600..1000)
    expect(c.slabIndex).toBe(0);
    expect(c.offset).toBe(600);
    for (const x of [a, b, c]) expect(x.offset + x.size).toBeLessThanOrEqual(1000);
    allocator.checkInvariants();
  });

  test("best fit: the smallest hole that fits, and existing slabs before a new one", () => {
    const { allocator, provider } = make({ max: 4096, align: 1 });
    const xs = [300, 10, 200, 10, 500, 10].map((s) => allocator.allocate(s));
    allocator.free(xs[0]); // hole 300 at 0
    allocator.free(xs[2]); // hole 200 at 310
    allocator.free(xs[4]); // hole 500 at 520
    const y = allocator.allocate(180);
    expect(y.offset).toBe(310);
    const z = allocator.allocate(250);
    expect(z.offset).toBe(0);
    expect(provider.created).toBe(1);
    // the tail of the slab (1030..4096) is the largest hole; 3000 fits there, no new slab
    const w = allocator.allocate(3000);
    expect(w.slabIndex).toBe(0);
    expect(provider.created).toBe(1);
    allocator.checkInvariants();
  });

  test("coalescing: freeing in any order merges back into one block", () => {
    const { allocator } = make({ max: 3000, align: 1, spare: 1 });
    const a = allocator.allocate(1000);
    const b = allocator.allocate(1000);
    const c = allocator.allocate(1000);
    allocator.free(a);
    allocator.free(c);
    let s = allocator.slabs()[0];
    expect(s.largestFreeBlock).toBe(1000);
    allocator.checkInvariants();
    allocator.free(b);
    s = allocator.slabs()[0];
    expect(s.largestFreeBlock).toBe(3000);
    expect(s.usedBytes).toBe(0);
    allocator.checkInvariants();
    // the whole slab is usable again, without a new slab
    const d = allocator.allocate(3000);
    expect(d.slabIndex).toBe(0);
    expect(allocator.totals().slabsCreated).toBe(1);
  });

  test("sizes are reserved in alignment granules, so neighbours stay aligned", () => {
    const { allocator } = make({ max: 4096, align: 256 });
    const a = allocator.allocate(100);
    const b = allocator.allocate(100);
    expect(b.offset).toBe(256);
    expect(allocator.slabs()[0].usedBytes).toBe(512);
    expect(allocator.totals().requestedBytes).toBe(200);
    allocator.free(a);
    allocator.free(b);
  });

  test("dedicated slab for requests above slabBytes (up to maxSlabBytes)", () => {
    const { allocator } = make({ max: 8192, slab: 1024, align: 256 });
    const small = allocator.allocate(100);
    const big = allocator.allocate(3000);
    expect(allocator.slabs().map((s) => s.bytes)).toEqual([1024, 3072]);
    expect(big.slabIndex).toBe(1);
    expect(small.slabIndex).toBe(0);
  });

  test("empty slabs are released; one spare kept when asked; trim releases spares", () => {
    {
      const { allocator, provider } = make({ max: 1000, spare: 0 });
      const a = allocator.allocate(800);
      const b = allocator.allocate(800);
      expect(provider.liveSlabs).toBe(2);
      allocator.free(a);
      expect(provider.liveSlabs).toBe(1);
      allocator.free(b);
      expect(provider.liveSlabs).toBe(0);
      expect(allocator.totals().slabCount).toBe(0);
      allocator.checkInvariants();
    }
    {
      const { allocator, provider } = make({ max: 1000, spare: 1 });
      const xs = [800, 800, 800].map((s) => allocator.allocate(s));
      expect(provider.liveSlabs).toBe(3);
      for (const x of xs) allocator.free(x);
      expect(provider.liveSlabs).toBe(1);
      expect(allocator.totals().emptySlabs).toBe(1);
      allocator.checkInvariants();
      // the spare is reused, not a new slab
      allocator.allocate(800);
      expect(provider.created).toBe(3);
      allocator.free(allocator.allocate(10));
      allocator.checkInvariants();
      const { allocator: a2, provider: p2 } = make({ max: 1000, spare: 1 });
      a2.free(a2.allocate(10));
      expect(p2.liveSlabs).toBe(1);
      expect(a2.trim()).toBe(1);
      expect(p2.liveSlabs).toBe(0);
    }
  });

  test("provider OOM propagates unchanged and leaves the allocator untouched", () => {
    const { allocator, provider } = make({ max: 1000, align: 4 });
    allocator.allocate(900);
    provider.failNext(1);
    expect(() => allocator.allocate(900)).toThrow(OutOfDeviceMemoryError);
    expect(allocator.totals().slabCount).toBe(1);
    allocator.checkInvariants();
    expect(allocator.allocate(900).slabIndex).toBe(1);
    expect(allocator.tryAllocate(900)).toBeUndefined();
    expect(allocator.canFit(100)).toBe(true);
    expect(allocator.canFit(101)).toBe(false);
  });

  test("double free and foreign free are rejected", () => {
    const { allocator } = make();
    const { allocator: other } = make();
    const a = allocator.allocate(10);
    allocator.free(a);
    expect(a.live).toBe(false);
    expect(() => allocator.free(a)).toThrow(InvalidArgumentError);
    const b = other.allocate(10);
    expect(() => allocator.free(b)).toThrow(InvalidArgumentError);
  });

  test("dispose destroys every slab and kills live allocations", () => {
    const { allocator, provider } = make({ max: 1000, align: 4, spare: 1 });
    const xs = [500, 500, 500, 500].map((s) => allocator.allocate(s));
    expect(provider.liveSlabs).toBe(2);
    allocator[Symbol.dispose]();
    expect(provider.liveSlabs).toBe(0);
    expect(xs.every((x) => !x.live)).toBe(true);
    expect(() => allocator.allocate(1)).toThrow(PoolDisposedError);
    allocator.dispose(); // idempotent
  });

  test("per-slab usage and totals", () => {
    const { allocator } = make({ max: 1024, align: 64 });
    const a = allocator.allocate(100);
    allocator.allocate(1000);
    const usage = allocator.slabs();
    expect(usage.length).toBe(2);
    expect(usage[0]).toMatchObject({ index: 0, bytes: 1024, usedBytes: 128, freeBytes: 896, allocations: 1, largestFreeBlock: 896 });
    expect(usage[1]).toMatchObject({ index: 1, bytes: 1024, usedBytes: 1024, allocations: 1, largestFreeBlock: 0 });
    const t = allocator.totals();
    expect(t).toMatchObject({ slabCount: 2, slabBytes: 2048, usedBytes: 1152, requestedBytes: 1100, freeBytes: 896, allocationCount: 2 });
    allocator.free(a);
    expect(allocator.totals().slabCount).toBe(1);
    expect(allocator.slabHandle(1).bytes).toBe(1024);
    expect(() => allocator.slabHandle(0)).toThrow(InvalidArgumentError);
  });
});

describe("64-bit device addresses", () => {
  test("base + offset is exact past 2^32 (bigint end to end)", () => {
    const base = 0x1_0000_0000n * 5n;
    expect(deviceAddress(base, 0)).toBe(0x5_0000_0000n);
    expect(deviceAddress(base, 2 ** 32 + 12345)).toBe(0x6_0000_3039n);
    const off = 3 * GiB + 7 * 256;
    const addr = deviceAddress(base, off);
    expect(addr).toBe(21474836480n + 3221225472n + 1792n);
    // the lo/hi u32 words a shader table would hold
    expect(Number(addr & 0xffff_ffffn)).toBe((0x4_0000_0000 + off) % 2 ** 32);
    expect(Number(addr >> 32n)).toBe(5);
    // near the top of the 64-bit space
    expect(deviceAddress(MAX_DEVICE_ADDRESS - 10n, 10)).toBe(MAX_DEVICE_ADDRESS);
    expect(() => deviceAddress(MAX_DEVICE_ADDRESS - 10n, 11)).toThrow(InvalidArgumentError);
    expect(() => deviceAddress(-1n, 0)).toThrow(InvalidArgumentError);
    expect(() => deviceAddress(base, -1)).toThrow(InvalidArgumentError);
    expect(() => deviceAddress(base, 0.5)).toThrow(InvalidArgumentError);
    expect(() => deviceAddress(base, 2 ** 53)).toThrow(InvalidArgumentError);
    expect(() => deviceAddress(5 as unknown as bigint, 0)).toThrow(InvalidArgumentError);
  });

  test("allocations past 4 GiB inside a big slab get exact offsets and addresses", () => {
    const provider = new HostMemorySlabProvider({ backed: false, baseAddress: 0x1_0000_0000n * 5n });
    const allocator = new SlabAllocator(provider, { maxSlabBytes: 8 * GiB, slabBytes: 8 * GiB, alignment: 256 });
    const a = allocator.allocate(5 * GiB + 1);
    const b = allocator.allocate(2 * GiB);
    expect(a.offset).toBe(0);
    expect(b.slabIndex).toBe(0);
    expect(b.offset).toBe(5 * GiB + 256);
    expect(b.offset).toBeGreaterThan(2 ** 32);
    expect(allocator.deviceAddressOf(b)).toBe(0x5_0000_0000n + 5n * 1073741824n + 256n);
    allocator.checkInvariants();
    allocator.free(a);
    const c = allocator.allocate(4 * GiB);
    expect(c.offset).toBe(0);
    allocator.dispose();
    expect(provider.liveSlabs).toBe(0);
  });
});

describe("SlabAllocator fuzz against a byte-map model", () => {
  /**
   * Model: one owner id per byte of each slab. Sizes are multiples of their alignment so the
   * allocator reserves exactly `size` bytes and the model's maximal free runs must equal the
   * allocator's free blocks. Checked on every op: no overlap, bounds, alignment, existing slabs
   * preferred, best fit, counters; periodically the full structural self-check.
   */
  for (const seed of [1, 2, 3]) {
    test(`seed ${seed}: 5000 ops, exact best fit and no overlaps`, () => {
      const SLAB = 8192;
      const rand = rng(seed);
      const { allocator, provider } = make({ max: SLAB, align: 16, spare: seed % 2 });
      const model = new Map<HostSlab, Int32Array>(); // owner id + 1 per byte, 0 = free
      const live: { a: SlabAllocation<HostSlab>; id: number }[] = [];
      let nextId = 1;
      const gapsOf = (m: Int32Array) => {
        const gaps: { start: number; len: number }[] = [];
        for (let i = 0; i < m.length; ) {
          if (m[i] !== 0) {
            i++;
            continue;
          }
          let j = i;
          while (j < m.length && m[j] === 0) j++;
          gaps.push({ start: i, len: j - i });
          i = j;
        }
        return gaps;
      };
      for (let op = 0; op < 5000; op++) {
        if (live.length === 0 || rand() < 0.55) {
          const align = 2 ** Math.floor(rand() * 9); // 1..256
          const units = 1 + Math.floor(rand() ** 3 * 40);
          const size = Math.min(align * units, SLAB);
          // what the model says: smallest maximal free run that fits with alignment
          let bestLen = Infinity;
          for (const [slab, m] of model) {
            if (slab.destroyed) continue;
            for (const g of gapsOf(m)) if (alignUp(g.start, align) + size <= g.start + g.len) bestLen = Math.min(bestLen, g.len);
          }
          const createdBefore = provider.created;
          const a = allocator.allocate(size, align);
          let m = model.get(a.slab);
          if (m === undefined) {
            expect(provider.created).toBe(createdBefore + 1); // fresh slab
            expect(bestLen).toBe(Infinity); // ...only when nothing existing fit
            m = new Int32Array(a.slab.bytes);
            model.set(a.slab, m);
          } else if (provider.created === createdBefore) {
            // chosen block = the model gap containing the allocation
            let s = a.offset;
            while (s > 0 && m[s - 1] === 0) s--;
            let e = a.offset;
            while (e < m.length && m[e] === 0) e++;
            expect(e - s).toBe(bestLen);
          }
          expect(a.offset % align).toBe(0);
          expect(a.offset + a.size).toBeLessThanOrEqual(a.slab.bytes);
          const id = nextId++;
          for (let i = a.offset; i < a.offset + size; i++) {
            if (m[i] !== 0) throw new Error(`overlap at slab ${a.slabIndex} byte ${i}`);
            m[i] = id;
          }
          a.slab.memory!.fill(id & 0xff, a.offset, a.offset + size);
          live.push({ a, id });
        } else {
          const k = Math.floor(rand() * live.length);
          const { a, id } = live[k];
          live[k] = live[live.length - 1];
          live.pop();
          const m = model.get(a.slab)!;
          const bytes = HostMemoryUploader.view(a);
          expect(bytes.every((x) => x === (id & 0xff))).toBe(true); // nobody overwrote it
          for (let i = a.offset; i < a.offset + a.size; i++) m[i] = 0;
          allocator.free(a);
        }
        for (const slab of [...model.keys()]) if (slab.destroyed) model.delete(slab);
        const t = allocator.totals();
        expect(t.allocationCount).toBe(live.length);
        expect(t.requestedBytes).toBe(live.reduce((s, x) => s + x.a.size, 0));
        expect(t.usedBytes).toBe(t.requestedBytes);
        expect(provider.liveSlabs).toBe(t.slabCount);
        expect(t.emptySlabs).toBeLessThanOrEqual(seed % 2);
        if (op % 97 === 0) allocator.checkInvariants();
      }
      allocator.checkInvariants();
      // model free runs == allocator free blocks (coalescing), slab by slab
      for (const u of allocator.slabs()) {
        const gaps = gapsOf(model.get(u.handle)!);
        expect(u.largestFreeBlock).toBe(gaps.reduce((x, g) => Math.max(x, g.len), 0));
        expect(u.freeBytes).toBe(gaps.reduce((x, g) => x + g.len, 0));
      }
      for (const { a } of live) allocator.free(a);
      allocator.trim();
      expect(provider.liveSlabs).toBe(0);
    });
  }

  test("arbitrary sizes and alignments: invariants and byte integrity over 4000 ops", () => {
    const rand = rng(42);
    const { allocator, provider } = make({ max: 1 << 16, slab: 1 << 14, align: 64, spare: 1 });
    const live: { a: SlabAllocation<HostSlab>; tag: number }[] = [];
    for (let op = 0; op < 4000; op++) {
      if (live.length === 0 || rand() < 0.6) {
        const align = 2 ** Math.floor(rand() * 13);
        const size = rand() < 0.02 ? 20000 + Math.floor(rand() * 40000) : 1 + Math.floor(rand() * 3000);
        const a = allocator.allocate(size, align);
        expect(a.offset % align).toBe(0);
        expect(a.offset + size).toBeLessThanOrEqual(a.slab.bytes);
        const tag = (op * 7 + 1) & 0xff;
        HostMemoryUploader.view(a).fill(tag);
        live.push({ a, tag });
      } else {
        const k = Math.floor(rand() * live.length);
        const { a, tag } = live.splice(k, 1)[0];
        expect(HostMemoryUploader.view(a).every((x) => x === tag)).toBe(true);
        allocator.free(a);
      }
      if (op % 50 === 0) allocator.checkInvariants();
    }
    for (const { a, tag } of live) expect(HostMemoryUploader.view(a).every((x) => x === tag)).toBe(true);
    allocator.dispose();
    expect(provider.liveSlabs).toBe(0);
  });
});
