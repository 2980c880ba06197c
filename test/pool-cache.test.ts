import { mulberry32 } from "../src/quant/random.ts";
import { describe, expect, test } from "bun:test";
import { InvalidArgumentError, VkmoeError } from "../src/errors.ts";
import {
  AllocationTooLargeError,
  type BatchTicket,
  BudgetExhaustedError,
  type BudgetShrinkInfo,
  createPolicy,
  DEFAULT_HEAT_HALF_LIFE,
  DEFAULT_POLICY,
  DeviceMemoryExhaustedError,
  type EvictionPolicy,
  ExpertCache,
  HeatPolicy,
  type HostSlab,
  HostMemorySlabProvider,
  HostMemoryUploader,
  LruPolicy,
  PolicyNode,
  PoolDisposedError,
  PoolInvariantError,
  type ResidentExpert,
  RoutingHistogram,
  RoutingHistoryFormatError,
  SlabAllocator,
} from "../src/pool/index.ts";

const rng = mulberry32;

const E = 1000; // bytes per expert in most tests

/** Deterministic content of expert (layer, expert). */
function pattern(layer: number, expert: number, bytes = E): Uint8Array {
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) out[i] = (layer * 131 + expert * 31 + i * 7 + 1) & 0xff;
  return out;
}

interface Setup {
  provider: HostMemorySlabProvider;
  allocator: SlabAllocator<HostSlab>;
  uploader: HostMemoryUploader;
  cache: ExpertCache<HostSlab>;
}

function setup(opts: {
  budgetExperts?: number;
  budgetBytes?: number;
  policy?: EvictionPolicy | "lru" | "heat";
  slabBytes?: number;
  spare?: number;
  capacity?: number;
  shrinkBudgetOnOom?: boolean;
  onBudgetShrink?: (i: BudgetShrinkInfo) => void;
  expertBytes?: number;
  history?: RoutingHistogram;
  loader?: (layer: number, expert: number) => Uint8Array;
} = {}): Setup {
  const provider = new HostMemorySlabProvider({ capacityBytes: opts.capacity });
  const allocator = new SlabAllocator(provider, {
    maxSlabBytes: 1 << 20,
    slabBytes: opts.slabBytes ?? 4 * 1024,
    alignment: 8,
    spareSlabs: opts.spare ?? 1,
  });
  const uploader = new HostMemoryUploader();
  const cache = new ExpertCache({
    allocator,
    uploader,
    budgetBytes: opts.budgetBytes ?? (opts.budgetExperts ?? 4) * E,
    policy: opts.policy ?? "lru",
    shrinkBudgetOnOom: opts.shrinkBudgetOnOom,
    onBudgetShrink: opts.onBudgetShrink,
    expertBytes: opts.expertBytes,
    history: opts.history,
    loader: opts.loader,
    ownsAllocator: true,
  });
  return { provider, allocator, uploader, cache };
}

const load = (c: ExpertCache<HostSlab>, l: number, e: number) => c.ensure(l, e, pattern(l, e));
const residentSet = (c: ExpertCache<HostSlab>) =>
  [...c.residents()].map((r) => `${r.layer}:${r.expert}`).sort();

/** Bytes of a resident expert still equal its pattern. */
function intact(r: ResidentExpert<HostSlab>): boolean {
  const got = HostMemoryUploader.view(r.allocation);
  const want = pattern(r.layer, r.expert, r.bytes);
  return got.length === want.length && got.every((x, i) => x === want[i]);
}

/** Every invariant the cache promises, as a list of violations (empty = fine). */
function cacheViolations(s: Setup): string[] {
  const { cache, allocator } = s;
  const v: string[] = [];
  const st = cache.stats();
  let sum = 0, pinned = 0;
  for (const r of cache.residents()) {
    sum += r.bytes;
    if (r.pins > 0) pinned += r.bytes;
    if (!r.resident || !r.allocation.live) v.push(`${r.layer}:${r.expert} listed but not live`);
    if (!intact(r)) v.push(`${r.layer}:${r.expert} bytes corrupted`);
  }
  if (sum !== st.residentBytes) v.push(`residentBytes ${st.residentBytes} != sum ${sum}`);
  if (pinned !== st.pinnedBytes) v.push(`pinnedBytes ${st.pinnedBytes} != sum ${pinned}`);
  if (!(st.residentBytes <= st.budget || st.residentBytes === st.pinnedBytes)) {
    v.push(`budget invariant: resident ${st.residentBytes} > budget ${st.budget} with ${st.residentBytes - st.pinnedBytes} unpinned`);
  }
  if (allocator.totals().requestedBytes !== st.residentBytes) v.push("allocator and cache disagree on live bytes");
  try {
    allocator.checkInvariants();
  } catch (e) {
    v.push(String(e));
  }
  return v;
}

// ------------------------------------------------------------------------------------------------

describe("ExpertCache: LRU", () => {
  test("eviction order on a hand-written sequence", () => {
    const s = setup({ budgetExperts: 3, policy: "lru" });
    const { cache } = s;
    const evicted: string[] = [];
    const step = (e: number) => {
      const before = new Set(residentSet(cache));
      load(cache, 0, e);
      for (const k of before) if (!cache.has(0, Number(k.split(":")[1]))) evicted.push(k);
    };
    // A B C | A hit | D evicts B | E evicts C | A hit | B evicts D | C evicts E
    for (const e of [1, 2, 3, 1, 4, 5, 1, 2, 3]) step(e);
    expect(evicted).toEqual(["0:2", "0:3", "0:4", "0:5"]);
    expect(residentSet(cache)).toEqual(["0:1", "0:2", "0:3"]);
    expect(cacheViolations(s)).toEqual([]);
  });

  test("stats are exact on a known sequence, and resetStats zeroes counters only", () => {
    const s = setup({ budgetExperts: 2 });
    const { cache } = s;
    // 1 miss, 2 miss, 1 hit, 3 miss (evicts 2), 2 miss (evicts 1), 2 hit
    for (const e of [1, 2, 1, 3, 2, 2]) load(cache, 5, e);
    expect(cache.stats()).toEqual({
      hits: 2,
      misses: 4,
      fallbacks: 0,
      evictions: 2,
      uploads: 4,
      bytesUploaded: 4 * E,
      oomEvents: 0,
      budgetShrinks: 0,
      residentBytes: 2 * E,
      residentCount: 2,
      pinnedBytes: 0,
      budget: 2 * E,
      deviceBytes: 4096,
    });
    expect(s.uploader.bytes).toBe(4 * E);
    cache.resetStats();
    expect(cache.stats()).toMatchObject({ hits: 0, misses: 0, evictions: 0, bytesUploaded: 0, residentBytes: 2 * E, residentCount: 2 });
    load(cache, 5, 3);
    expect(cache.stats()).toMatchObject({ hits: 1, misses: 0 });
  });
});

describe("ExpertCache: heat with decay", () => {
  test("keeps a hot expert that LRU evicts under a scan", () => {
    const run = (policy: "lru" | "heat") => {
      const s = setup({ budgetExperts: 3, policy });
      for (let i = 0; i < 10; i++) load(s.cache, 0, 0); // expert 0 is hot
      for (const e of [1, 2, 3, 4, 5, 6]) load(s.cache, 0, e); // a scan of one-off experts
      expect(cacheViolations(s)).toEqual([]);
      return s.cache.has(0, 0);
    };
    expect(run("lru")).toBe(false);
    expect(run("heat")).toBe(true);
  });

  test("heat halves every halfLife ticks: a formerly hot expert cools down and goes", () => {
    const policy = new HeatPolicy({ halfLife: 1, clock: "tick", rememberEvicted: false });
    const s = setup({ budgetExperts: 2, policy });
    const { cache } = s;
    for (let i = 0; i < 8; i++) load(cache, 0, 0); // heat 8
    load(cache, 0, 1); // heat 1
    expect(policy.heatOf(cache.get(0, 0) as unknown as PolicyNode)).toBe(8);
    cache.tick(3); // 8 -> 1, 1 -> 0.125
    expect(policy.heatOf(cache.get(0, 0) as unknown as PolicyNode)).toBe(1);
    load(cache, 0, 1); // 0.125 + 1 = 1.125 > 1
    load(cache, 0, 2); // must evict the coldest: expert 0 now
    expect(cache.has(0, 0)).toBe(false);
    expect(cache.has(0, 1)).toBe(true);
  });

  test("the default policy is heat with the measured half-life, counted in accesses", () => {
    const s = setup({ budgetExperts: 2 });
    const c = new ExpertCache({ allocator: s.allocator, uploader: s.uploader, budgetBytes: E });
    expect(c.policy).toBeInstanceOf(HeatPolicy);
    expect(DEFAULT_POLICY).toBe("heat");
    expect((c.policy as HeatPolicy).halfLife).toBe(DEFAULT_HEAT_HALF_LIFE);
    expect((c.policy as HeatPolicy).clockUnit).toBe("access");
    expect(createPolicy("lru")).toBeInstanceOf(LruPolicy);
    expect(() => createPolicy("fifo" as "lru")).toThrow(InvalidArgumentError);
  });

  test("access clock: heat halves every halfLife ensures", () => {
    const policy = new HeatPolicy({ halfLife: 4, rememberEvicted: false });
    const s = setup({ budgetExperts: 8, policy });
    for (let i = 0; i < 4; i++) load(s.cache, 0, 0); // heat 3 after 3 accesses; the 4th starts epoch 1: 3/2 + 1
    const node = s.cache.get(0, 0) as unknown as PolicyNode;
    expect(policy.heatOf(node)).toBe(2.5);
    for (let i = 0; i < 8; i++) load(s.cache, 0, 1); // 8 more accesses: two more halvings
    expect(policy.heatOf(node)).toBe(2.5 / 4);
  });

  test("ties are broken by LRU", () => {
    const s = setup({ budgetExperts: 3, policy: new HeatPolicy({ rememberEvicted: false }) });
    for (const e of [1, 2, 3]) load(s.cache, 0, e); // all heat 1 (same epoch)
    load(s.cache, 0, 4); // evicts 1, the least recent
    expect(residentSet(s.cache)).toEqual(["0:2", "0:3", "0:4"]);
  });

  test("remembered heat: a re-admitted hot expert resumes its history", () => {
    const policy = new HeatPolicy({ halfLife: 1 << 20 });
    const s = setup({ budgetExperts: 1, policy });
    for (let i = 0; i < 5; i++) load(s.cache, 0, 0);
    load(s.cache, 0, 1); // evicts 0 (only one slot)
    load(s.cache, 0, 0); // back, heat 5 + 1
    expect(policy.heatOf(s.cache.get(0, 0) as unknown as PolicyNode)).toBe(6);
  });
});

describe("ExpertCache: pinning", () => {
  /** The pin scenario: returns violations (pinned expert not resident or its bytes changed). */
  function pinScenario(api: {
    beginBatch(): { ensure(l: number, e: number, src: Uint8Array): ResidentExpert<HostSlab>; release(): void };
    ensure(l: number, e: number, src: Uint8Array): ResidentExpert<HostSlab>;
  }): string[] {
    const violations: string[] = [];
    // make the soon-to-be-pinned experts resident and the oldest / coldest, so any policy would pick them
    for (const e of [10, 11, 12]) api.ensure(1, e, pattern(1, e));
    const batch = api.beginBatch();
    const pinned = [10, 11, 12].map((e) => batch.ensure(1, e, pattern(1, e)));
    // heavy traffic through the one unpinned slot while the batch is in flight
    for (let i = 0; i < 50; i++) {
      api.ensure(1, 100 + (i % 7), pattern(1, 100 + (i % 7)));
      for (const p of pinned) {
        if (!p.resident) violations.push(`pinned ${p.layer}:${p.expert} evicted at step ${i}`);
        else if (!intact(p)) violations.push(`pinned ${p.layer}:${p.expert} overwritten at step ${i}`);
      }
    }
    batch.release();
    return violations;
  }

  test("pinned experts are never evicted while the batch is in flight; released ones become evictable", () => {
    for (const policy of ["lru", "heat"] as const) {
      const s = setup({ budgetExperts: 4, policy });
      expect(pinScenario(s.cache)).toEqual([]);
      expect(cacheViolations(s)).toEqual([]);
      // released: now evictable, and eventually evicted by traffic
      expect(s.cache.policy.size).toBe(s.cache.residentCount);
      for (let i = 0; i < 20; i++) for (let j = 0; j < 4; j++) load(s.cache, 1, 300 + i);
      expect([10, 11, 12].some((e) => s.cache.has(1, e))).toBe(false);
    }
  });

  test("budget exhausted by pins: ensure throws BudgetExhaustedError, tryEnsure returns a verdict, nothing is evicted", () => {
    const s = setup({ budgetExperts: 3 });
    const { cache } = s;
    load(cache, 0, 99); // one unpinned resident
    const batch = cache.beginBatch();
    batch.ensure(0, 1, pattern(0, 1));
    batch.ensure(0, 2, pattern(0, 2));
    // third pinned fits by evicting 99
    batch.ensure(0, 3, pattern(0, 3));
    expect(cache.has(0, 99)).toBe(false);
    expect(cache.pinnedBytes).toBe(3 * E);
    const before = cache.stats();
    let err: unknown;
    try {
      batch.ensure(0, 4, pattern(0, 4));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(BudgetExhaustedError);
    expect((err as VkmoeError).code).toBe("BUDGET_EXHAUSTED");
    const verdict = cache.tryEnsure(0, 5, pattern(0, 5));
    expect(verdict.resident).toBe(false);
    if (!verdict.resident) {
      expect(verdict.reason).toBe("budget-exhausted");
      expect(verdict.error).toBeInstanceOf(BudgetExhaustedError);
    }
    const after = cache.stats();
    expect(after.evictions).toBe(before.evictions);
    expect(after.fallbacks).toBe(2);
    expect(after.misses).toBe(before.misses + 2);
    // a hit on a pinned expert still works
    expect(cache.tryEnsure(0, 2, pattern(0, 2))).toMatchObject({ resident: true, hit: true });
    expect(cacheViolations(s)).toEqual([]);
    batch.release();
    expect(batch.released).toBe(true);
    expect(() => batch.ensure(0, 1, pattern(0, 1))).toThrow(InvalidArgumentError);
    expect(cache.tryEnsure(0, 4, pattern(0, 4)).resident).toBe(true);
  });

  test("a pin from two tickets lasts until both are released; `using` releases at scope end", () => {
    const s = setup({ budgetExperts: 2 });
    const { cache } = s;
    const t1 = cache.beginBatch();
    const t2 = cache.beginBatch();
    t1.ensure(0, 1, pattern(0, 1));
    t2.ensure(0, 1, pattern(0, 1));
    t2.ensure(0, 1, pattern(0, 1)); // same ticket twice pins once
    expect(cache.get(0, 1)!.pins).toBe(2);
    t1.release();
    expect(cache.get(0, 1)!.pins).toBe(1);
    load(cache, 0, 2);
    load(cache, 0, 3); // must evict 2, not the pinned 1
    expect(cache.has(0, 1)).toBe(true);
    t2[Symbol.dispose]();
    expect(cache.pinnedBytes).toBe(0);
    {
      using b = cache.beginBatch();
      b.ensure(0, 7, pattern(0, 7));
      expect(cache.pinnedBytes).toBe(E);
    }
    expect(cache.pinnedBytes).toBe(0);
    expect(() => cache.evict(0, 7)).not.toThrow();
    const t3 = cache.beginBatch();
    t3.ensure(0, 8, pattern(0, 8));
    expect(() => cache.evict(0, 8)).toThrow(InvalidArgumentError);
    t3.release();
    expect(cache.evict(0, 8)).toBe(true);
    expect(cache.evict(0, 8)).toBe(false);
  });

  test("setBudget below the pinned bytes evicts all unpinned now and the rest on release", () => {
    const s = setup({ budgetExperts: 6 });
    const { cache } = s;
    for (const e of [1, 2, 3]) load(cache, 0, e);
    const t = cache.beginBatch();
    for (const e of [4, 5]) t.ensure(0, e, pattern(0, e));
    cache.setBudget(1 * E);
    expect(residentSet(cache)).toEqual(["0:4", "0:5"]);
    expect(cacheViolations(s)).toEqual([]);
    t.release();
    expect(cache.residentBytes).toBe(E);
    expect(cacheViolations(s)).toEqual([]);
  });

  describe("negative controls", () => {
    /** LRU that "forgets" to drop pinned experts from its candidates. */
    class PinBlindLru extends LruPolicy {
      override remove(node: PolicyNode): void {
        if ((node as unknown as { pins: number }).pins > 0) return; // bug: pinned experts stay candidates
        super.remove(node);
      }
    }

    test("a policy that offers pinned experts is caught by the cache (PoolInvariantError), not silently obeyed", () => {
      const s = setup({ budgetExperts: 4, policy: new PinBlindLru() });
      let err: unknown;
      try {
        pinScenario(s.cache);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(PoolInvariantError);
      expect(String(err)).toMatch(/offered pinned expert \(1, 1[0-2]\)/);
      // and the same scenario passes with the correct policy (see the test above)
    });

    test("the pin checker detects a cache implementation that ignores pins", () => {
      // A deliberately broken cache: plain LRU over the same allocator + uploader, pins ignored.
      const provider = new HostMemorySlabProvider();
      const allocator = new SlabAllocator(provider, { maxSlabBytes: 1 << 20, slabBytes: 4096, alignment: 8, spareSlabs: 1 });
      const uploader = new HostMemoryUploader();
      const map = new Map<string, { layer: number; expert: number; bytes: number; allocation: ReturnType<typeof allocator.allocate>; resident: boolean; pins: number; addressLo: number; addressHi: number }>();
      const broken = {
        ensure(l: number, e: number, src: Uint8Array) {
          const k = `${l}:${e}`;
          const hit = map.get(k);
          if (hit) {
            map.delete(k);
            map.set(k, hit);
            return hit;
          }
          if (map.size >= 4) {
            const [vk, v] = map.entries().next().value!;
            map.delete(vk);
            v.resident = false;
            allocator.free(v.allocation);
          }
          const allocation = allocator.allocate(src.length);
          uploader.upload(allocation, src);
          const r = { layer: l, expert: e, bytes: src.length, allocation, resident: true, pins: 0, addressLo: 0, addressHi: 0 };
          map.set(k, r);
          return r;
        },
        beginBatch() {
          return { ensure: (l: number, e: number, src: Uint8Array) => broken.ensure(l, e, src), release() {} };
        },
      };
      const violations = pinScenario(broken);
      expect(violations.length).toBeGreaterThan(0);
      expect(violations[0]).toMatch(/pinned 1:1[0-2] evicted/);
    });

    test("the byte check detects a corrupted resident expert", () => {
      const s = setup({ budgetExperts: 3 });
      const r = load(s.cache, 2, 3);
      expect(cacheViolations(s)).toEqual([]);
      HostMemoryUploader.view(r.allocation)[17] ^= 0xff;
      expect(cacheViolations(s)).toEqual(["2:3 bytes corrupted"]);
    });
  });
});

describe("ExpertCache: budget invariant over random traces", () => {
  for (const policy of ["lru", "heat"] as const) {
    test(`${policy}: invariant after every step (ensure, batches, setBudget, variable sizes)`, () => {
      const rand = rng(policy === "lru" ? 7 : 8);
      const s = setup({ budgetBytes: 20_000, policy, slabBytes: 8192 });
      const { cache } = s;
      const sizeOf = (l: number, e: number) => 200 + ((l * 37 + e * 11) % 13) * 150; // 200..2000, fixed per expert
      const src = (l: number, e: number) => pattern(l, e, sizeOf(l, e));
      const open: BatchTicket<HostSlab>[] = [];
      let verdicts = 0, hits = 0, misses = 0, fallbacks = 0;
      for (let step = 0; step < 4000; step++) {
        const r = rand();
        const l = Math.floor(rand() * 4);
        const e = Math.floor(rand() ** 2 * 40);
        if (r < 0.55) {
          const v = cache.tryEnsure(l, e, src(l, e));
          if (v.resident) v.hit ? hits++ : misses++;
          else {
            misses++;
            fallbacks++;
            verdicts++;
          }
        } else if (r < 0.8) {
          if (open.length === 0 || rand() < 0.3) open.push(cache.beginBatch());
          const t = open[Math.floor(rand() * open.length)];
          const v = t.tryEnsure(l, e, src(l, e));
          if (v.resident) {
            v.hit ? hits++ : misses++;
            expect(v.expert.pins).toBeGreaterThan(0);
          } else {
            misses++;
            fallbacks++;
          }
        } else if (r < 0.95) {
          if (open.length > 0) open.splice(Math.floor(rand() * open.length), 1)[0].release();
        } else {
          cache.setBudget(2000 + Math.floor(rand() * 30_000));
        }
        const violations = cacheViolations(s);
        if (violations.length > 0) throw new Error(`step ${step}: ${violations.join("; ")}`);
        // pinned experts of open tickets are resident
        for (const t of open) for (const p of t.pinnedExperts()) expect(p.resident).toBe(true);
      }
      const st = cache.stats();
      expect(st.hits).toBe(hits);
      expect(st.misses).toBe(misses);
      expect(st.fallbacks).toBe(fallbacks);
      expect(st.evictions).toBeGreaterThan(100);
      expect(verdicts).toBeGreaterThanOrEqual(0);
      for (const t of open) t.release();
      expect(cacheViolations(s)).toEqual([]);
    });
  }
});

describe("ExpertCache: device out-of-memory", () => {
  test("OOM on a new slab: evict and retry succeeds, budget adapts to what fits", () => {
    const shrinks: BudgetShrinkInfo[] = [];
    // 4 experts per 4096-byte slab (1000 bytes at 8-byte alignment)
    const s = setup({ budgetExperts: 10, onBudgetShrink: (i) => shrinks.push(i) });
    const { cache, provider } = s;
    for (let e = 0; e < 8; e++) load(cache, 0, e); // 2 slabs, full
    expect(provider.liveSlabs).toBe(2);
    provider.failNext(1);
    const r = load(cache, 0, 8); // needs a 3rd slab -> OOM -> evict LRU (0) -> fits in its hole
    expect(r.resident).toBe(true);
    expect(intact(r)).toBe(true);
    expect(cache.has(0, 0)).toBe(false);
    expect(provider.liveSlabs).toBe(2);
    expect(cache.stats()).toMatchObject({ oomEvents: 1, evictions: 1, budgetShrinks: 1, budget: 8 * E, residentBytes: 8 * E });
    expect(shrinks).toEqual([{ from: 10 * E, to: 8 * E, kind: "recovered" }]);
    // later misses evict by budget, without touching the provider again
    const failedBefore = provider.failedCreates;
    for (let e = 20; e < 30; e++) load(cache, 0, e);
    expect(provider.failedCreates).toBe(failedBefore);
    expect(cacheViolations(s)).toEqual([]);
  });

  test("shrinkBudgetOnOom: false keeps the budget", () => {
    const s = setup({ budgetExperts: 10, shrinkBudgetOnOom: false });
    for (let e = 0; e < 4; e++) load(s.cache, 0, e);
    s.provider.failNext(1);
    load(s.cache, 0, 4);
    expect(s.cache.stats()).toMatchObject({ oomEvents: 1, evictions: 1, budgetShrinks: 0, budget: 10 * E });
  });

  test("evicting may give a whole slab back; the retry then creates a slab", () => {
    // capacity for exactly 2 slabs, no spare: a slab whose experts are all evicted is destroyed
    const s = setup({ budgetExperts: 20, spare: 0, capacity: 2 * 4096 });
    const { cache, provider } = s;
    for (let e = 0; e < 8; e++) load(cache, 0, e);
    const big = pattern(0, 50, 3500); // fits only in an empty slab
    const r = cache.ensure(0, 50, big);
    expect(r.resident).toBe(true);
    expect(provider.liveSlabs).toBe(2);
    expect(cache.stats().oomEvents).toBe(1);
    expect(cache.stats().evictions).toBe(4); // slab 0's four experts
    expect(cacheViolations(s)).toEqual([]);
  });

  test("nothing evictable: budget shrinks to the resident bytes, typed error / verdict, cache keeps working", () => {
    const shrinks: BudgetShrinkInfo[] = [];
    const s = setup({ budgetExperts: 10, onBudgetShrink: (i) => shrinks.push(i) });
    const { cache, provider } = s;
    const t = cache.beginBatch();
    for (let e = 0; e < 4; e++) t.ensure(0, e, pattern(0, e)); // one full slab, all pinned
    provider.failNext(100);
    const v = cache.tryEnsure(0, 9, pattern(0, 9));
    expect(v.resident).toBe(false);
    if (!v.resident) {
      expect(v.reason).toBe("device-oom");
      expect(v.error).toBeInstanceOf(DeviceMemoryExhaustedError);
      expect(v.error.code).toBe("DEVICE_MEMORY_EXHAUSTED");
    }
    expect(cache.budget).toBe(4 * E);
    expect(shrinks).toEqual([{ from: 10 * E, to: 4 * E, kind: "exhausted" }]);
    // now the budget itself says no (pinned), without asking the device
    const failedBefore = provider.failedCreates;
    expect(() => cache.ensure(0, 10, pattern(0, 10))).toThrow(BudgetExhaustedError);
    expect(provider.failedCreates).toBe(failedBefore);
    expect(cacheViolations(s)).toEqual([]);
    t.release();
    // unpinned now: a miss evicts within the shrunk budget and reuses the freed space
    const r = load(cache, 0, 11);
    expect(intact(r)).toBe(true);
    expect(cache.residentBytes).toBe(4 * E);
    // ensure() reports device OOM as a typed error too
    const t2 = cache.beginBatch();
    for (const x of [...cache.residents()]) t2.ensure(x.layer, x.expert, pattern(x.layer, x.expert));
    cache.setBudget(10 * E);
    expect(() => cache.ensure(0, 12, pattern(0, 12))).toThrow(DeviceMemoryExhaustedError);
    t2.release();
    provider.failNext(0);
    cache.setBudget(10 * E);
    expect(load(cache, 0, 12).resident).toBe(true);
    expect(cacheViolations(s)).toEqual([]);
  });

  test("non-OOM provider errors propagate and leave no trace", () => {
    const s = setup({ budgetExperts: 10 });
    const orig = s.provider.createSlab.bind(s.provider);
    let boom = true;
    s.provider.createSlab = (b: number) => {
      if (boom) throw new Error("driver lost");
      return orig(b);
    };
    expect(() => load(s.cache, 0, 0)).toThrow("driver lost");
    expect(s.cache.residentCount).toBe(0);
    boom = false;
    expect(load(s.cache, 0, 0).resident).toBe(true);
  });
});

describe("ExpertCache: sources", () => {
  test("callback sources get a destination of exactly the expert's size and the bytes land", () => {
    const s = setup({ budgetExperts: 4, expertBytes: E });
    const { cache } = s;
    const seen: number[] = [];
    const fillFor = (l: number, e: number) => (dest: Uint8Array) => {
      seen.push(dest.byteLength);
      dest.set(pattern(l, e));
    };
    const a = cache.ensure(3, 4, fillFor(3, 4));
    const b = cache.ensure(3, 5, { byteLength: E, fill: fillFor(3, 5) });
    expect(seen).toEqual([E, E]);
    expect(intact(a) && intact(b)).toBe(true);
    cache.ensure(3, 4, fillFor(3, 4)); // hit: not called
    expect(seen.length).toBe(2);
    // typed arrays of any element type, as views into a larger buffer
    const buf = new ArrayBuffer(E + 64);
    const u8 = new Uint8Array(buf, 64, E);
    u8.set(pattern(3, 6));
    const f32 = new Float32Array(buf, 64, E / 4);
    expect(intact(cache.ensure(3, 6, f32))).toBe(true);
    // size mismatch against expertBytes
    expect(() => cache.ensure(3, 7, new Uint8Array(E + 1))).toThrow(InvalidArgumentError);
    expect(() => cache.ensure(3, 7, { byteLength: 5, fill() {} })).toThrow(InvalidArgumentError);
    expect(() => cache.ensure(3, 7, 42 as unknown as Uint8Array)).toThrow(InvalidArgumentError);
    expect(cacheViolations(s)).toEqual([]);
  });

  test("a bare callback needs expertBytes; a throwing callback frees its allocation", () => {
    const s = setup({ budgetExperts: 4 });
    const { cache, allocator } = s;
    expect(() => cache.ensure(0, 0, () => {})).toThrow(InvalidArgumentError);
    load(cache, 0, 1);
    const before = allocator.totals();
    expect(() =>
      cache.ensure(0, 2, {
        byteLength: E,
        fill() {
          throw new Error("disk read failed");
        },
      }),
    ).toThrow("disk read failed");
    expect(cache.has(0, 2)).toBe(false);
    expect(allocator.totals().allocationCount).toBe(before.allocationCount);
    expect(cache.residentBytes).toBe(E);
    // re-entrancy from a callback is refused
    expect(() => cache.ensure(0, 3, { byteLength: E, fill: () => void cache.ensure(0, 1, pattern(0, 1)) })).toThrow(InvalidArgumentError);
    expect(cacheViolations(s)).toEqual([]);
  });

  test("the loader supplies sources on a miss; too-large experts are a typed verdict", () => {
    const calls: string[] = [];
    const s = setup({ budgetExperts: 2, loader: (l, e) => (calls.push(`${l}:${e}`), pattern(l, e)) });
    expect(intact(s.cache.ensure(1, 1))).toBe(true);
    s.cache.ensure(1, 1);
    expect(calls).toEqual(["1:1"]);
    const v = s.cache.tryEnsure(1, 2, new Uint8Array(2 << 20));
    expect(v).toMatchObject({ resident: false, reason: "too-large" });
    if (!v.resident) expect(v.error).toBeInstanceOf(AllocationTooLargeError);
    const w = s.cache.tryEnsure(1, 3, new Uint8Array(3 * E));
    expect(w).toMatchObject({ resident: false, reason: "budget-exhausted" });
    expect(() => s.cache.ensure(1, 3, new Uint8Array(3 * E))).toThrow(BudgetExhaustedError);
  });
});

describe("ExpertCache: lifetime", () => {
  test("dispose frees everything through the allocator; the provider's live slabs return to 0", () => {
    const s = setup({ budgetExperts: 12 });
    const { cache, provider, allocator } = s;
    for (let e = 0; e < 12; e++) load(cache, 0, e);
    const t = cache.beginBatch();
    t.ensure(0, 1, pattern(0, 1));
    const r = cache.get(0, 2)!;
    expect(provider.liveSlabs).toBe(3);
    cache[Symbol.dispose]();
    expect(provider.liveSlabs).toBe(0);
    expect(provider.created).toBe(provider.destroyed);
    expect(r.resident).toBe(false);
    expect(t.released).toBe(true);
    expect(allocator.isDisposed).toBe(true);
    expect(() => load(cache, 0, 0)).toThrow(PoolDisposedError);
    expect(() => cache.beginBatch()).toThrow(PoolDisposedError);
    t.release(); // harmless
    cache.dispose(); // idempotent
  });

  test("without ownsAllocator, dispose frees the cache's allocations and leaves the allocator alive", () => {
    const provider = new HostMemorySlabProvider();
    const allocator = new SlabAllocator(provider, { maxSlabBytes: 1 << 20, slabBytes: 4096, spareSlabs: 0 });
    const keep = allocator.allocate(100);
    const cache = new ExpertCache({ allocator, uploader: new HostMemoryUploader(), budgetBytes: 10 * E });
    for (let e = 0; e < 8; e++) cache.ensure(0, e, pattern(0, e));
    cache.dispose();
    expect(allocator.totals().allocationCount).toBe(1);
    allocator.free(keep);
    expect(provider.liveSlabs).toBe(0);
  });
});

describe("warm start", () => {
  test("preload loads hottest first up to the budget, never evicts, and leaves the hottest most recent", () => {
    const s = setup({ budgetExperts: 3, policy: "lru" });
    const { cache } = s;
    load(cache, 9, 9);
    const items = [
      { layer: 0, expert: 1, count: 5, source: pattern(0, 1) },
      { layer: 0, expert: 2, count: 50, source: pattern(0, 2) },
      { layer: 0, expert: 3, count: 1, source: pattern(0, 3) },
      { layer: 0, expert: 4, count: 20, source: pattern(0, 4) },
      { layer: 9, expert: 9, count: 100, source: pattern(9, 9) },
    ];
    const res = cache.preload(items);
    expect(res).toEqual({ loaded: 2, alreadyResident: 1, skipped: 2, bytes: 2 * E });
    expect(residentSet(cache)).toEqual(["0:2", "0:4", "9:9"]);
    expect(cache.stats()).toMatchObject({ hits: 0, misses: 1, evictions: 0 });
    // LRU order after preload: 9:9 (older), then 0:4, then 0:2 (hottest, most recent)
    load(cache, 1, 1);
    expect(cache.has(9, 9)).toBe(false);
    load(cache, 1, 2);
    expect(cache.has(0, 4)).toBe(false);
    expect(cache.has(0, 2)).toBe(true);
    expect(cacheViolations(s)).toEqual([]);
  });

  test("preload stops at a device OOM without evicting", () => {
    const s = setup({ budgetExperts: 20 });
    s.provider.failNext(1);
    const items = [0, 1, 2].map((e) => ({ layer: 0, expert: e, count: 3 - e, source: pattern(0, e) }));
    expect(s.cache.preload(items)).toEqual({ loaded: 0, alreadyResident: 0, skipped: 3, bytes: 0 });
    expect(s.cache.stats().oomEvents).toBe(1);
  });

  test("routing histogram: record via the cache, JSON round trip, preload the most routed", () => {
    const history = new RoutingHistogram({ model: "qwen3-30b-a3b" });
    const s = setup({ budgetExperts: 2, history });
    for (const e of [1, 2, 2, 3, 3, 3, 1, 3]) load(s.cache, 4, e);
    expect(history.count(4, 3)).toBe(4);
    expect(history.total).toBe(8);
    const text = history.stringify();
    const json = JSON.parse(text);
    expect(json).toEqual({
      format: "vkmoe.routing-histogram",
      version: 1,
      meta: { model: "qwen3-30b-a3b" },
      entries: [[4, 3, 4], [4, 1, 2], [4, 2, 2]],
    });
    const back = RoutingHistogram.parse(text);
    expect(back.hottest()).toEqual(history.hottest());
    expect(back.meta).toEqual({ model: "qwen3-30b-a3b" });

    // a later run: preload from the saved history through the loader
    const s2 = setup({ budgetExperts: 2, loader: (l, e) => pattern(l, e) });
    const res = s2.cache.preload(back.hottest());
    expect(res.loaded).toBe(2);
    expect(residentSet(s2.cache)).toEqual(["4:1", "4:3"]);
    expect(cacheViolations(s2)).toEqual([]);
  });

  test("histogram JSON is validated", () => {
    const bad = [
      "not json",
      "[]",
      JSON.stringify({ format: "other", version: 1, entries: [] }),
      JSON.stringify({ format: "vkmoe.routing-histogram", version: 2, entries: [] }),
      JSON.stringify({ format: "vkmoe.routing-histogram", version: 1, entries: [[1, 2]] }),
      JSON.stringify({ format: "vkmoe.routing-histogram", version: 1, entries: [[1, 2, -1]] }),
      JSON.stringify({ format: "vkmoe.routing-histogram", version: 1, entries: [[1, 70000, 1]] }),
      JSON.stringify({ format: "vkmoe.routing-histogram", version: 1, entries: [[1, 2, 3]], meta: { a: [] } }),
    ];
    for (const t of bad) expect(() => RoutingHistogram.parse(t)).toThrow(RoutingHistoryFormatError);
    const dup = RoutingHistogram.parse(JSON.stringify({ format: "vkmoe.routing-histogram", version: 1, entries: [[1, 2, 3], [1, 2, 4]] }));
    expect(dup.count(1, 2)).toBe(7);
    const h = new RoutingHistogram();
    expect(() => h.record(-1, 0)).toThrow(InvalidArgumentError);
    h.record(1, 2, 5);
    const other = new RoutingHistogram();
    other.record(1, 2, 1);
    other.record(0, 0, 9);
    h.merge(other);
    expect(h.hottest(1)).toEqual([{ layer: 0, expert: 0, count: 9 }]);
    expect(h.toJSON().meta).toBeUndefined();
  });
});

describe("ExpertCache: arguments", () => {
  test("bad keys and budgets are InvalidArgumentError (VkmoeError)", () => {
    const s = setup();
    expect(() => s.cache.ensure(-1, 0, pattern(0, 0))).toThrow(InvalidArgumentError);
    expect(() => s.cache.ensure(0, 65536, pattern(0, 0))).toThrow(InvalidArgumentError);
    expect(() => s.cache.ensure(0, 0)).toThrow(InvalidArgumentError); // no source, no loader
    expect(() => s.cache.setBudget(-5)).toThrow(InvalidArgumentError);
    expect(() => s.cache.setBudget(1.5)).toThrow(VkmoeError);
  });
});

describe("ExpertCache: the allocation-free hot path (cached addresses, reused batches, pins kept in the heat policy)", () => {
  const words = (s: Setup, r: ResidentExpert<HostSlab>) => {
    const a = s.allocator.deviceAddressOf(r.allocation);
    return [Number(a & 0xffffffffn), Number(a >> 32n)];
  };

  test("addressLo/addressHi equal deviceAddressOf (past 2^32, several slabs) and follow every eviction and re-upload", () => {
    const s = setup({ budgetExperts: 6, policy: "lru" }); // 4 experts per 4096-byte slab, slab bases 2^32 + i * 2^40
    const { cache } = s;
    const rand = rng(21);
    let checked = 0, moved = 0;
    const last = new Map<string, string>();
    for (let step = 0; step < 600; step++) {
      const e = Math.floor(rand() * 14);
      const batch = rand() < 0.5 ? cache.beginBatch() : undefined;
      const r = batch ? batch.ensure(0, e, pattern(0, e)) : load(cache, 0, e);
      batch?.release();
      for (const x of cache.residents()) {
        const [lo, hi] = words(s, x);
        expect([x.addressLo, x.addressHi]).toEqual([lo!, hi!]);
        expect(x.addressHi).toBeGreaterThanOrEqual(1);
        checked++;
      }
      const key = `${r.addressHi}:${r.addressLo}`;
      if (last.has(`${e}`) && last.get(`${e}`) !== key) moved++;
      last.set(`${e}`, key);
    }
    expect(checked).toBeGreaterThan(1000);
    expect(moved).toBeGreaterThan(10); // re-uploads landed elsewhere, and the words followed
    expect(new Set([...cache.residents()].map((x) => x.addressHi)).size).toBeGreaterThan(1); // more than one slab
    expect(cacheViolations(s)).toEqual([]);
  });

  test("a provider without device addresses gives 0 and 0", () => {
    const provider = new HostMemorySlabProvider();
    const bare = { createSlab: (b: number) => provider.createSlab(b), destroySlab: (h: HostSlab) => provider.destroySlab(h) };
    const allocator = new SlabAllocator<HostSlab>(bare, { maxSlabBytes: 1 << 20, slabBytes: 4096, alignment: 8 });
    const cache = new ExpertCache({ allocator, uploader: new HostMemoryUploader(), budgetBytes: 4 * E, ownsAllocator: true });
    expect(allocator.hasDeviceAddresses).toBe(false);
    const r = cache.ensure(0, 1, pattern(0, 1));
    expect([r.addressLo, r.addressHi]).toEqual([0, 0]);
    cache.dispose();
  });

  test("tryEnsure returns the entry's one verdict on a hit; a released batch reopened with beginBatch(batch) pins again", () => {
    const s = setup({ budgetExperts: 4, policy: "heat" });
    const { cache } = s;
    const miss = cache.tryEnsure(0, 1, pattern(0, 1));
    expect(miss).toMatchObject({ resident: true, hit: false });
    const hit = cache.tryEnsure(0, 1, pattern(0, 1));
    expect(hit).toMatchObject({ resident: true, hit: true });
    expect(cache.tryEnsure(0, 1, pattern(0, 1))).toBe(hit);
    expect(Object.isFrozen(hit)).toBe(true);

    const batch = cache.beginBatch();
    expect(() => cache.beginBatch(batch)).toThrow(InvalidArgumentError); // still open
    batch.ensure(0, 1, pattern(0, 1));
    batch.ensure(0, 2, pattern(0, 2));
    expect(batch.size).toBe(2);
    batch.release();
    expect(cache.pinnedBytes).toBe(0);
    for (let round = 0; round < 3; round++) {
      expect(cache.beginBatch(batch)).toBe(batch);
      expect(batch.released).toBe(false);
      expect(batch.size).toBe(0);
      for (const e of [1, 2, 3]) expect(batch.tryEnsure(0, e, pattern(0, e)).resident).toBe(true);
      expect(batch.pinnedExperts().map((x) => x.expert)).toEqual([1, 2, 3]);
      expect(cache.pinnedBytes).toBe(3 * E);
      expect(cache.get(0, 2)!.pins).toBe(1);
      // only one unpinned slot is left: traffic through it never evicts the pinned three
      for (let i = 0; i < 6; i++) load(cache, 0, 10 + i + round * 10);
      expect([1, 2, 3].every((e) => cache.has(0, e))).toBe(true);
      batch.release();
      expect(cache.pinnedBytes).toBe(0);
      expect(cacheViolations(s)).toEqual([]);
    }
    const other = setup().cache.beginBatch();
    other.release();
    expect(() => cache.beginBatch(other as unknown as BatchTicket<HostSlab>)).toThrow(InvalidArgumentError); // another cache's
    expect(() => batch.ensure(0, 1, pattern(0, 1))).toThrow(InvalidArgumentError); // released
  });

  test("pins interleaved between two batches are counted once per batch", () => {
    for (const policy of ["lru", "heat"] as const) {
      const s = setup({ budgetExperts: 4, policy });
      const { cache } = s;
      const a = cache.beginBatch(), b = cache.beginBatch();
      for (const e of [1, 2, 3]) a.ensure(0, e, pattern(0, e));
      for (const e of [3, 2, 1]) b.ensure(0, e, pattern(0, e)); // b pins each after a did
      for (const e of [1, 2, 3, 1]) a.ensure(0, e, pattern(0, e)); // a again: already pinned by a
      for (const e of [2, 2]) b.ensure(0, e, pattern(0, e));
      for (const e of [1, 2, 3]) expect(cache.get(0, e)!.pins).toBe(2);
      expect(a.size).toBe(3);
      expect(b.size).toBe(3);
      a.release();
      for (const e of [1, 2, 3]) expect(cache.get(0, e)!.pins).toBe(1);
      b.release();
      expect(cache.pinnedBytes).toBe(0);
      expect(cache.policy.size).toBe(cache.residentCount);
      expect(cacheViolations(s)).toEqual([]);
    }
  });

  test("heat keeps pinned experts in its heap: the same evictions as removing them on every pin", () => {
    /** The heat policy with pinned experts removed and re-added, as the cache does for other policies. */
    class StrictHeat extends HeatPolicy {
      override readonly keepsPinned = false;
    }
    for (const seed of [31, 32, 33]) {
      const traces: string[][] = [];
      for (const policy of [new HeatPolicy({ halfLife: 40 }), new StrictHeat({ halfLife: 40 })]) {
        const rand = rng(seed);
        const s = setup({ budgetBytes: 12 * E, policy });
        const { cache } = s;
        const trace: string[] = [];
        const open: BatchTicket<HostSlab>[] = [];
        for (let step = 0; step < 3000; step++) {
          const r = rand();
          const l = Math.floor(rand() * 2);
          const e = Math.floor(rand() ** 2 * 30);
          if (r < 0.45) {
            const v = cache.tryEnsure(l, e, pattern(l, e));
            trace.push(v.resident ? `${v.hit ? "h" : "m"}${l}:${e}` : `x${l}:${e}`);
          } else if (r < 0.85) {
            if (open.length === 0 || rand() < 0.2) open.push(cache.beginBatch());
            const t = open[Math.floor(rand() * open.length)]!;
            const v = t.tryEnsure(l, e, pattern(l, e));
            trace.push(v.resident ? `p${v.hit ? "h" : "m"}${l}:${e}` : `px${l}:${e}`);
          } else if (open.length > 0) {
            const i = Math.floor(rand() * open.length);
            const t = open.splice(i, 1)[0]!;
            t.release();
            if (rand() < 0.5) open.push(cache.beginBatch(t)); // reopened
          }
          trace.push(residentSet(cache).join(","));
          const violations = cacheViolations(s);
          if (violations.length > 0) throw new Error(`seed ${seed}, step ${step}: ${violations.join("; ")}`);
          for (const t of open) for (const p of t.pinnedExperts()) expect(p.resident).toBe(true);
        }
        for (const t of open) t.release();
        expect(cache.policy.size).toBe(cache.residentCount);
        expect(cache.stats().evictions).toBeGreaterThan(200);
        traces.push(trace);
      }
      expect(traces[0]).toEqual(traces[1]!);
    }
  });
});
