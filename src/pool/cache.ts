/**
 * ExpertCache: which routed experts are resident in device memory.
 *
 * A resident unit ("expert") is everything one (layer, expert) needs on the device, e.g.
 * gate + up + down weights and scales, uploaded into one suballocation of a {@link SlabAllocator}.
 *
 * ## Guarantees
 * - **Budget invariant.** `residentBytes <= budget` whenever no public call is running, with one
 *   exception: after `setBudget` lowered the budget below the bytes pinned by open batches,
 *   `residentBytes === pinnedBytes` (every unpinned expert has been evicted) until enough pins are
 *   released, at which point the budget holds again. A miss evicts *before* it allocates, so not
 *   even a transient overshoot occurs (stronger than "budget + one expert").
 * - **Pins.** An expert ensured through a {@link BatchTicket} is never evicted before the ticket is
 *   released (or disposed). When the budget cannot be met without evicting a pinned expert:
 *   `ensure` throws {@link BudgetExhaustedError}, `tryEnsure` returns
 *   `{ resident: false, reason: "budget-exhausted" }` so the caller can route that expert to the
 *   CPU. Nothing is evicted in that case (the check is done before evicting).
 * - **Device OOM.** If the provider reports out-of-device-memory while allocating, the cache evicts
 *   unpinned experts one by one and retries. If that succeeds and `shrinkBudgetOnOom` (default true)
 *   the budget drops to the bytes actually resident, so later misses evict instead of hitting the
 *   driver again. If nothing evictable is left, the budget drops to the resident bytes and the
 *   miss is reported: `ensure` throws {@link DeviceMemoryExhaustedError}, `tryEnsure` returns
 *   `reason: "device-oom"`. Either way `onBudgetShrink` is called and the cache stays usable.
 * - **Cost.** A hit is O(1) (map lookup + policy touch: O(1) LRU, O(log n) heat) and allocates
 *   nothing, pinned through a batch or not (`tryEnsure` returns the entry's one verdict object;
 *   a batch reopened with `beginBatch(released)` reuses its pin list); a miss is O(log n) per
 *   eviction plus the allocator's O(log F) and the upload. No scans over residents.
 *
 * Errors from the uploader or a source callback propagate after the fresh allocation is freed
 * (the expert is then not resident; nothing leaks).
 */
import { InvalidArgumentError, VkmoeError } from "../errors.ts";
import {
  AllocationTooLargeError,
  BudgetExhaustedError,
  DeviceMemoryExhaustedError,
  isOutOfDeviceMemory,
  PoolDisposedError,
  PoolInvariantError,
} from "./errors.ts";
import { expertKey, type RoutingHistogram } from "./history.ts";
import { createPolicy, type EvictionPolicy, type HeatPolicyOptions, PolicyNode, type PolicyName } from "./policy.ts";
import type { SlabAllocation, SlabAllocator } from "./suballocator.ts";

/** Fills a destination of exactly the expert's size, e.g. by reading from disk straight into mapped memory. */
export type FillCallback = (dest: Uint8Array) => void;

/**
 * Where an expert's bytes come from on a miss:
 * - a typed array / DataView (its bytes are copied);
 * - `{ byteLength, fill }`: `fill(dest)` writes exactly `byteLength` bytes into `dest`;
 * - a bare {@link FillCallback}, when the cache knows the size (`expertBytes` option).
 * Sources are only read on a miss.
 */
export type ExpertSource = ArrayBufferView | { readonly byteLength: number; fill: FillCallback } | FillCallback;

/** Writes an expert into its allocation. The Vulkan backend copies into mapped memory or a staging buffer. */
export interface ExpertUploader<H> {
  /**
   * `data` is either the bytes to copy (length === allocation.size) or a callback to call with a
   * writable view of exactly `allocation.size` bytes at the allocation.
   */
  upload(allocation: SlabAllocation<H>, data: Uint8Array | FillCallback): void;
}

/** A resident expert. Stays valid while `resident`; do not keep it across evictions. */
export interface ResidentExpert<H> {
  readonly layer: number;
  readonly expert: number;
  readonly bytes: number;
  /** Where it lives: slab index, offset, size, slab handle. */
  readonly allocation: SlabAllocation<H>;
  /** False once evicted (or the cache disposed). */
  readonly resident: boolean;
  /** Number of open batches pinning it. */
  readonly pins: number;
  /**
   * Low and high 32 bits of its device address (`allocator.deviceAddressOf(allocation)`), worked
   * out once when it became resident so a kernel's table is filled without bigint work each call;
   * 0 and 0 when the allocator's provider has no device addresses.
   */
  readonly addressLo: number;
  readonly addressHi: number;
}

export type NotResidentReason = "budget-exhausted" | "too-large" | "device-oom";

export type EnsureResult<H> =
  | { readonly resident: true; readonly hit: boolean; readonly expert: ResidentExpert<H> }
  | { readonly resident: false; readonly reason: NotResidentReason; readonly error: VkmoeError };

export interface CacheStats {
  /** Lookups that found the expert resident. */
  readonly hits: number;
  /** Lookups that did not (including those that ended not resident). hits + misses = lookups. */
  readonly misses: number;
  /** Misses that ended not resident (budget exhausted, too large, device OOM): CPU fallbacks. */
  readonly fallbacks: number;
  readonly evictions: number;
  readonly uploads: number;
  readonly bytesUploaded: number;
  readonly oomEvents: number;
  readonly budgetShrinks: number;
  readonly residentBytes: number;
  readonly residentCount: number;
  readonly pinnedBytes: number;
  readonly budget: number;
  /** Device memory held by the allocator (slab bytes), for comparison with the budget. */
  readonly deviceBytes: number;
}

export interface BudgetShrinkInfo {
  readonly from: number;
  readonly to: number;
  /** "recovered": OOM resolved by evicting; "exhausted": nothing evictable was left. */
  readonly kind: "recovered" | "exhausted";
}

export interface ExpertCacheOptions<H> {
  allocator: SlabAllocator<H>;
  uploader: ExpertUploader<H>;
  /** Budget for resident expert bytes. */
  budgetBytes: number;
  /** A policy instance, or a name (default {@link DEFAULT_POLICY}). */
  policy?: EvictionPolicy | PolicyName;
  /** Options of the heat policy when `policy` is a name. */
  heat?: HeatPolicyOptions;
  /** Allocation alignment per expert (default: the allocator's). */
  alignment?: number;
  /** Size of an expert, needed for bare callback sources; when given, sources must match it. */
  expertBytes?: number | ((layer: number, expert: number) => number);
  /** Source used on a miss when `ensure` gets none. */
  loader?: (layer: number, expert: number) => ExpertSource;
  /** If given, every lookup records one routing of (layer, expert) into it. */
  history?: RoutingHistogram;
  /** Shrink the budget to the resident bytes after an OOM that evicting resolved (default true). */
  shrinkBudgetOnOom?: boolean;
  /** Told whenever an OOM made the budget shrink. */
  onBudgetShrink?: (info: BudgetShrinkInfo) => void;
  /** Dispose the allocator with the cache (default false). */
  ownsAllocator?: boolean;
}

export interface PreloadItem {
  readonly layer: number;
  readonly expert: number;
  /** Default: the cache's loader. */
  readonly source?: ExpertSource;
  /** Routing count; higher is loaded first. Items without a count keep their order, after counted ones. */
  readonly count?: number;
}

export interface PreloadResult {
  readonly loaded: number;
  readonly alreadyResident: number;
  /** Did not fit in the remaining budget (or device memory ran out). */
  readonly skipped: number;
  readonly bytes: number;
}

class Entry<H> extends PolicyNode implements ResidentExpert<H> {
  readonly layer: number;
  readonly expert: number;
  readonly bytes: number;
  readonly allocation: SlabAllocation<H>;
  readonly addressLo: number;
  readonly addressHi: number;
  resident = true;
  pins = 0;
  /** The batch that pinned it last, while that batch holds the pin (fast "already pinned" test). */
  pinMark: BatchTicket<H> | null = null;
  /** The verdict `tryEnsure` returns on a hit: one object per entry, so a hit allocates nothing. */
  readonly hitVerdict: EnsureResult<H>;
  constructor(key: number, layer: number, expert: number, bytes: number, allocation: SlabAllocation<H>, address: bigint | undefined) {
    super(key);
    this.layer = layer;
    this.expert = expert;
    this.bytes = bytes;
    this.allocation = allocation;
    this.addressLo = address === undefined ? 0 : Number(address & 0xffffffffn);
    this.addressHi = address === undefined ? 0 : Number(address >> 32n);
    this.hitVerdict = Object.freeze({ resident: true, hit: true, expert: this });
  }
}

interface Counters {
  hits: number;
  misses: number;
  fallbacks: number;
  evictions: number;
  uploads: number;
  bytesUploaded: number;
  oomEvents: number;
  budgetShrinks: number;
}

const zeroCounters = (): Counters => ({
  hits: 0,
  misses: 0,
  fallbacks: 0,
  evictions: 0,
  uploads: 0,
  bytesUploaded: 0,
  oomEvents: 0,
  budgetShrinks: 0,
});

function checkBudget(b: number): void {
  if (!Number.isSafeInteger(b) || b < 0) throw new InvalidArgumentError(`budget must be a non-negative integer number of bytes, got ${b}`);
}

/**
 * Pins experts for the duration of one batch (e.g. one MoE layer of one token). Experts ensured
 * through the ticket stay resident until `release()` / `[Symbol.dispose]()`. Use with `using`:
 * `using batch = cache.beginBatch();`. A released ticket can be opened again for the next batch
 * with `cache.beginBatch(ticket)` (no allocation).
 */
export class BatchTicket<H> implements Disposable {
  private readonly cache: ExpertCache<H>;
  /** @internal the pinned entries are [0, _count); the rest are null */
  readonly _pinned: (Entry<H> | null)[] = [];
  /** @internal */
  _count = 0;
  /**
   * @internal the pinned entries as a set, built only when an entry this ticket may already pin
   * was pinned by another batch since (then its pinMark no longer answers); null otherwise.
   */
  _index: Set<Entry<H>> | null = null;
  /** @internal index among the cache's open batches; -1 when released */
  _openAt = -1;
  private isReleased = false;

  /** @internal */
  constructor(cache: ExpertCache<H>) {
    this.cache = cache;
  }

  /** Like {@link ExpertCache.ensure}, and pins the expert until release. */
  ensure(layer: number, expert: number, source?: ExpertSource): ResidentExpert<H> {
    this.checkOpen();
    return this.cache._ensure(layer, expert, source, this, true) as ResidentExpert<H>;
  }

  /** Like {@link ExpertCache.tryEnsure}, and pins the expert until release when it is resident. */
  tryEnsure(layer: number, expert: number, source?: ExpertSource): EnsureResult<H> {
    this.checkOpen();
    return this.cache._ensure(layer, expert, source, this, false) as EnsureResult<H>;
  }

  /** Experts pinned by this ticket. */
  get size(): number {
    return this._count;
  }

  /** The experts pinned by this ticket, in the order they were pinned (a copy). */
  pinnedExperts(): ResidentExpert<H>[] {
    return this._pinned.slice(0, this._count) as Entry<H>[];
  }

  get released(): boolean {
    return this.isReleased;
  }

  /** Unpin everything; released experts become evictable (and the budget is enforced). Idempotent. */
  release(): void {
    if (this.isReleased) return;
    this.isReleased = true;
    this.cache._release(this);
  }

  [Symbol.dispose](): void {
    this.release();
  }

  /** @internal the cache was disposed */
  _kill(): void {
    this.isReleased = true;
    this._openAt = -1;
    this._pinned.length = 0;
    this._count = 0;
    this._index = null;
  }

  /** @internal opened again by ExpertCache.beginBatch */
  _reopen(): void {
    this.isReleased = false;
  }

  /** @internal whether this ticket pins `e` */
  _holds(e: Entry<H>): boolean {
    if (e.pinMark === this) return true;
    if (e.pins === 0) return false;
    if (this._index === null) {
      this._index = new Set();
      for (let i = 0; i < this._count; i++) this._index.add(this._pinned[i]!);
    }
    return this._index.has(e);
  }

  /** @internal records a pin of `e` (not yet held by this ticket) */
  _add(e: Entry<H>): void {
    this._pinned[this._count++] = e;
    this._index?.add(e);
    e.pinMark = this;
  }

  private checkOpen(): void {
    if (this.isReleased) throw new InvalidArgumentError("batch ticket already released");
  }
}

/** The expert cache. See the module comment for its guarantees. */
export class ExpertCache<H> implements Disposable {
  readonly policy: EvictionPolicy;
  readonly allocator: SlabAllocator<H>;
  private readonly uploader: ExpertUploader<H>;
  private readonly alignment: number;
  private readonly expertBytes: number | ((layer: number, expert: number) => number) | undefined;
  private readonly loader: ((layer: number, expert: number) => ExpertSource) | undefined;
  private readonly history: RoutingHistogram | undefined;
  private readonly shrinkOnOom: boolean;
  private readonly onBudgetShrink: ((info: BudgetShrinkInfo) => void) | undefined;
  private readonly ownsAllocator: boolean;
  /** The policy's {@link EvictionPolicy.keepsPinned}: pinning leaves the policy alone. */
  private readonly keepsPinned: boolean;

  private readonly entries = new Map<number, Entry<H>>();
  /** Open batches in [0, openCount); each knows its index, so closing one is a swap (no allocation, unlike a Set's churn). */
  private readonly open: (BatchTicket<H> | null)[] = [];
  private openCount = 0;
  private budgetBytes: number;
  private resident = 0;
  private pinned = 0;
  private clock = 0;
  private busy = false;
  private disposed = false;
  private counters: Counters = zeroCounters();

  constructor(options: ExpertCacheOptions<H>) {
    checkBudget(options.budgetBytes);
    this.allocator = options.allocator;
    this.uploader = options.uploader;
    this.budgetBytes = options.budgetBytes;
    const p = options.policy;
    this.policy = p === undefined || typeof p === "string" ? createPolicy(p, options.heat) : p;
    this.keepsPinned = this.policy.keepsPinned === true;
    this.alignment = options.alignment ?? options.allocator.alignment;
    this.expertBytes = options.expertBytes;
    this.loader = options.loader;
    this.history = options.history;
    this.shrinkOnOom = options.shrinkBudgetOnOom ?? true;
    this.onBudgetShrink = options.onBudgetShrink;
    this.ownsAllocator = options.ownsAllocator ?? false;
  }

  // ---- lookups ---------------------------------------------------------------------------------

  /**
   * Make (layer, expert) resident and return it. On a miss: evict as needed, allocate, upload
   * from `source` (or the loader). Not pinned: the next miss may evict it; use a
   * {@link beginBatch} ticket to keep experts resident across several calls.
   * Throws {@link BudgetExhaustedError}, {@link AllocationTooLargeError} or
   * {@link DeviceMemoryExhaustedError} when it cannot; see {@link tryEnsure} for a verdict instead.
   */
  ensure(layer: number, expert: number, source?: ExpertSource): ResidentExpert<H> {
    return this._ensure(layer, expert, source, null, true) as ResidentExpert<H>;
  }

  /**
   * Like {@link ensure}, but when the expert cannot be made resident returns
   * `{ resident: false, reason, error }` (route it to the CPU) instead of throwing.
   * Upload errors and invalid arguments still throw.
   */
  tryEnsure(layer: number, expert: number, source?: ExpertSource): EnsureResult<H> {
    return this._ensure(layer, expert, source, null, false) as EnsureResult<H>;
  }

  /**
   * Open a batch: experts ensured through the ticket stay pinned until it is released. `reuse`, a
   * released ticket of this cache, is opened again instead of allocating a new one.
   */
  beginBatch(reuse?: BatchTicket<H>): BatchTicket<H> {
    this.checkLive();
    let t: BatchTicket<H>;
    if (reuse === undefined) t = new BatchTicket<H>(this);
    else {
      if (!reuse.released) throw new InvalidArgumentError("beginBatch(ticket): the ticket is still open (release it first)");
      if ((reuse as unknown as { cache: unknown }).cache !== this) throw new InvalidArgumentError("beginBatch(ticket): the ticket belongs to another cache");
      reuse._reopen();
      t = reuse;
    }
    t._openAt = this.openCount;
    this.open[this.openCount++] = t;
    return t;
  }

  /** Resident entry for (layer, expert) or undefined. No stats, no policy update. */
  get(layer: number, expert: number): ResidentExpert<H> | undefined {
    return this.entries.get(expertKey(layer, expert));
  }

  has(layer: number, expert: number): boolean {
    return this.entries.has(expertKey(layer, expert));
  }

  /** Every resident expert (in insertion order). */
  residents(): IterableIterator<ResidentExpert<H>> {
    return this.entries.values();
  }

  /**
   * Evict (layer, expert) now. Returns false if it was not resident; throws
   * {@link InvalidArgumentError} if it is pinned.
   */
  evict(layer: number, expert: number): boolean {
    this.checkLive();
    const e = this.entries.get(expertKey(layer, expert));
    if (e === undefined) return false;
    if (e.pins > 0) throw new InvalidArgumentError(`expert (${layer}, ${expert}) is pinned by an open batch`);
    this.evictEntry(e);
    return true;
  }

  // ---- budget ----------------------------------------------------------------------------------

  get budget(): number {
    return this.budgetBytes;
  }

  get residentBytes(): number {
    return this.resident;
  }

  get pinnedBytes(): number {
    return this.pinned;
  }

  get residentCount(): number {
    return this.entries.size;
  }

  /** Change the budget. Lowering it evicts unpinned experts (policy order) until it holds or none are left. */
  setBudget(bytes: number): void {
    this.checkLive();
    checkBudget(bytes);
    this.budgetBytes = bytes;
    this.enforceBudget();
  }

  /** Advance the policy's manual clock (heat policy with `clock: "tick"`), e.g. once per token. */
  tick(n: number = 1): void {
    this.policy.tick?.(n);
  }

  // ---- warm start ------------------------------------------------------------------------------

  /**
   * Warm start: load experts, hottest (highest `count`) first, while they fit in the remaining
   * budget. Never evicts; stops at the first device OOM. Does not count as hits/misses. After
   * loading, the recency order puts the hottest last (most recently used).
   */
  preload(items: Iterable<PreloadItem>): PreloadResult {
    this.checkLive();
    const list = [...items].map((item, i) => ({ item, i }));
    list.sort((a, b) => {
      const ca = a.item.count ?? -1, cb = b.item.count ?? -1;
      return cb - ca || a.i - b.i;
    });
    const fresh: Entry<H>[] = [];
    let alreadyResident = 0, skipped = 0, bytes = 0, oom = false;
    try {
      for (const { item } of list) {
        const key = expertKey(item.layer, item.expert);
        if (this.entries.has(key)) {
          alreadyResident++;
          continue;
        }
        if (oom) {
          skipped++;
          continue;
        }
        const src = this.resolveSource(item.layer, item.expert, item.source);
        if (this.resident + src.bytes > this.budgetBytes || src.bytes > this.allocator.maxSlabBytes) {
          skipped++;
          continue;
        }
        let allocation: SlabAllocation<H>;
        try {
          allocation = this.allocator.allocate(src.bytes, this.alignment);
        } catch (e) {
          if (!isOutOfDeviceMemory(e)) throw e;
          this.counters.oomEvents++;
          oom = true;
          skipped++;
          continue;
        }
        const entry = this.install(key, item.layer, item.expert, src, allocation);
        fresh.push(entry);
        bytes += src.bytes;
      }
    } finally {
      // Make the hottest the most recent: add coldest first. (Also when a source threw midway.)
      for (let i = fresh.length - 1; i >= 0; i--) {
        const e = fresh[i];
        e.lastUse = ++this.clock;
        this.policy.touch(e);
        this.policy.add(e);
      }
    }
    return { loaded: fresh.length, alreadyResident, skipped, bytes };
  }

  // ---- stats & lifetime ------------------------------------------------------------------------

  stats(): CacheStats {
    return {
      ...this.counters,
      residentBytes: this.resident,
      residentCount: this.entries.size,
      pinnedBytes: this.pinned,
      budget: this.budgetBytes,
      deviceBytes: this.allocator.isDisposed ? 0 : this.allocator.totals().slabBytes,
    };
  }

  /** Zero the counters (hits, misses, ...); residency, budget and policy state are untouched. */
  resetStats(): void {
    this.counters = zeroCounters();
  }

  /**
   * Free every allocation through the allocator (and dispose the allocator if the cache owns it).
   * Open tickets become released. Idempotent.
   */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (let i = 0; i < this.openCount; i++) this.open[i]!._kill();
    this.open.length = 0;
    this.openCount = 0;
    this.policy.clear();
    const allocatorAlive = !this.allocator.isDisposed;
    for (const e of this.entries.values()) {
      e.resident = false;
      e.pins = 0;
      if (allocatorAlive && e.allocation.live) this.allocator.free(e.allocation);
    }
    this.entries.clear();
    this.resident = this.pinned = 0;
    if (this.ownsAllocator && allocatorAlive) this.allocator.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  get isDisposed(): boolean {
    return this.disposed;
  }

  // ---- internals -------------------------------------------------------------------------------

  /** @internal shared by ensure / tryEnsure / ticket methods. */
  _ensure(
    layer: number,
    expert: number,
    source: ExpertSource | undefined,
    ticket: BatchTicket<H> | null,
    throwing: boolean,
  ): ResidentExpert<H> | EnsureResult<H> {
    this.checkLive();
    if (this.busy) throw new InvalidArgumentError("re-entrant ExpertCache call (from an upload or source callback)");
    const key = expertKey(layer, expert);
    this.history?.recordKey(key);
    const hitEntry = this.entries.get(key);
    if (hitEntry !== undefined) {
      this.counters.hits++;
      hitEntry.lastUse = ++this.clock;
      this.policy.touch(hitEntry);
      if (ticket !== null) this.pin(hitEntry, ticket);
      return throwing ? hitEntry : hitEntry.hitVerdict;
    }
    this.counters.misses++;
    const src = this.resolveSource(layer, expert, source);
    const bytes = src.bytes;

    let failure: VkmoeError | undefined;
    let reason: NotResidentReason = "budget-exhausted";
    if (bytes > this.allocator.maxSlabBytes) {
      failure = new AllocationTooLargeError(bytes, this.allocator.maxSlabBytes);
      reason = "too-large";
    } else if (bytes > this.budgetBytes) {
      failure = new BudgetExhaustedError(layer, expert, bytes, this.budgetBytes, this.pinned, "larger than the whole budget");
    } else if (this.pinned + bytes > this.budgetBytes) {
      failure = new BudgetExhaustedError(layer, expert, bytes, this.budgetBytes, this.pinned, "the rest of the budget is pinned");
    }
    let allocation: SlabAllocation<H> | undefined;
    if (failure === undefined) {
      // Evict before allocating: the budget is never exceeded, not even transiently.
      while (this.resident + bytes > this.budgetBytes) this.evictEntry(this.nextVictim());
      const got = this.allocateWithOom(layer, expert, bytes);
      if (got instanceof VkmoeError) {
        failure = got;
        reason = "device-oom";
      } else allocation = got;
    }
    if (allocation === undefined) {
      this.counters.fallbacks++;
      if (throwing) throw failure!;
      return { resident: false, reason, error: failure! };
    }

    const entry = this.install(key, layer, expert, src, allocation);
    entry.lastUse = ++this.clock;
    this.policy.touch(entry);
    if (ticket !== null) {
      entry.pins = 1;
      ticket._add(entry);
      this.pinned += bytes;
    } else this.policy.add(entry);
    return throwing ? entry : { resident: true, hit: false, expert: entry };
  }

  /** @internal called by BatchTicket.release */
  _release(ticket: BatchTicket<H>): void {
    const at = ticket._openAt;
    if (at >= 0) {
      const last = this.open[--this.openCount]!;
      this.open[at] = last;
      last._openAt = at;
      this.open[this.openCount] = null;
      ticket._openAt = -1;
    }
    if (this.disposed) return;
    const list = ticket._pinned;
    for (let i = 0; i < ticket._count; i++) {
      const e = list[i]!;
      list[i] = null;
      if (e.pinMark === ticket) e.pinMark = null;
      if (--e.pins === 0) {
        this.pinned -= e.bytes;
        if (e.resident) this.policy.add(e); // a no-op for a node a keepsPinned policy still holds
      }
    }
    ticket._count = 0;
    ticket._index = null;
    this.enforceBudget();
  }

  private pin(e: Entry<H>, ticket: BatchTicket<H>): void {
    if (ticket._holds(e)) return;
    ticket._add(e);
    if (e.pins++ === 0) {
      this.pinned += e.bytes;
      if (!this.keepsPinned) this.policy.remove(e);
    }
  }

  /** Upload into a fresh allocation and register the entry (not yet in the policy). */
  private install(
    key: number,
    layer: number,
    expert: number,
    src: { bytes: number; data: Uint8Array | FillCallback },
    allocation: SlabAllocation<H>,
  ): Entry<H> {
    this.busy = true;
    try {
      this.uploader.upload(allocation, src.data);
    } catch (e) {
      this.allocator.free(allocation);
      throw e;
    } finally {
      this.busy = false;
    }
    this.counters.uploads++;
    this.counters.bytesUploaded += src.bytes;
    const address = this.allocator.hasDeviceAddresses ? this.allocator.deviceAddressOf(allocation) : undefined;
    const entry = new Entry<H>(key, layer, expert, src.bytes, allocation, address);
    this.entries.set(key, entry);
    this.resident += src.bytes;
    return entry;
  }

  private nextVictim(): Entry<H> {
    for (;;) {
      const v = this.policy.victim() as Entry<H> | undefined;
      if (v === undefined) {
        throw new PoolInvariantError(`policy ${this.policy.name} offers no victim while ${this.resident - this.pinned} unpinned bytes are resident`);
      }
      if (!v.resident || this.entries.get(v.key) !== v) throw new PoolInvariantError(`policy ${this.policy.name} offered a non-resident entry`);
      if (v.pins === 0) return v;
      if (!this.keepsPinned) throw new PoolInvariantError(`policy ${this.policy.name} offered pinned expert (${v.layer}, ${v.expert}) as a victim`);
      // A keepsPinned policy holds pinned entries until one comes up as the victim: it leaves
      // now, and comes back with add() when its last pin is released.
      this.policy.remove(v);
    }
  }

  private evictEntry(e: Entry<H>): void {
    this.policy.remove(e);
    this.policy.evicted?.(e);
    this.entries.delete(e.key);
    e.resident = false;
    this.resident -= e.bytes;
    this.counters.evictions++;
    this.allocator.free(e.allocation);
  }

  /** Evict unpinned experts until the budget holds or nothing unpinned is left. */
  private enforceBudget(): void {
    while (this.resident > this.budgetBytes && this.resident > this.pinned) this.evictEntry(this.nextVictim());
  }

  /** Allocate; on device OOM evict and retry; on final failure shrink the budget and return the error. */
  private allocateWithOom(layer: number, expert: number, bytes: number): SlabAllocation<H> | VkmoeError {
    let firstError: unknown;
    try {
      return this.allocator.allocate(bytes, this.alignment);
    } catch (e) {
      if (!isOutOfDeviceMemory(e)) throw e;
      firstError = e;
    }
    this.counters.oomEvents++;
    while (this.resident > this.pinned) {
      const destroyedBefore = this.allocator.totals().slabsDestroyed;
      this.evictEntry(this.nextVictim());
      let a = this.allocator.tryAllocate(bytes, this.alignment);
      if (a === undefined && this.allocator.totals().slabsDestroyed !== destroyedBefore) {
        // The eviction gave a whole slab back to the device: a new slab may now succeed.
        try {
          a = this.allocator.allocate(bytes, this.alignment);
        } catch (e) {
          if (!isOutOfDeviceMemory(e)) throw e;
        }
      }
      if (a !== undefined) {
        if (this.shrinkOnOom) this.shrinkBudget(this.resident + bytes, "recovered");
        return a;
      }
    }
    // Nothing evictable left: one last attempt (memory may have been freed elsewhere), then give up.
    try {
      const a = this.allocator.allocate(bytes, this.alignment);
      if (this.shrinkOnOom) this.shrinkBudget(this.resident + bytes, "recovered");
      return a;
    } catch (e) {
      if (!isOutOfDeviceMemory(e)) throw e;
    }
    this.shrinkBudget(this.resident, "exhausted");
    return new DeviceMemoryExhaustedError(layer, expert, bytes, this.budgetBytes, { cause: firstError });
  }

  private shrinkBudget(to: number, kind: BudgetShrinkInfo["kind"]): void {
    if (to >= this.budgetBytes) return;
    const from = this.budgetBytes;
    this.budgetBytes = to;
    this.counters.budgetShrinks++;
    this.onBudgetShrink?.({ from, to, kind });
  }

  private resolveSource(
    layer: number,
    expert: number,
    source: ExpertSource | undefined,
  ): { bytes: number; data: Uint8Array | FillCallback } {
    const s = source ?? this.loader?.(layer, expert);
    if (s === undefined) throw new InvalidArgumentError(`no source for expert (${layer}, ${expert}) and no loader configured`);
    const eb = this.expertBytes;
    const expected = typeof eb === "function" ? eb(layer, expert) : eb;
    let bytes: number;
    let data: Uint8Array | FillCallback;
    if (typeof s === "function") {
      if (expected === undefined) throw new InvalidArgumentError("a bare fill callback needs the cache's expertBytes option");
      bytes = expected;
      data = s;
    } else if (ArrayBuffer.isView(s)) {
      bytes = s.byteLength;
      data = s instanceof Uint8Array ? s : new Uint8Array(s.buffer, s.byteOffset, s.byteLength);
    } else if (typeof s === "object" && s !== null && typeof s.fill === "function") {
      bytes = s.byteLength;
      const fill = s.fill;
      data = (dest: Uint8Array) => fill.call(s, dest);
    } else {
      throw new InvalidArgumentError(`invalid source for expert (${layer}, ${expert})`);
    }
    if (!Number.isSafeInteger(bytes) || bytes <= 0) throw new InvalidArgumentError(`expert (${layer}, ${expert}) has invalid size ${bytes}`);
    if (expected !== undefined && bytes !== expected) {
      throw new InvalidArgumentError(`source for expert (${layer}, ${expert}) has ${bytes} bytes, expected ${expected}`);
    }
    return { bytes, data };
  }

  private checkLive(): void {
    if (this.disposed) throw new PoolDisposedError("ExpertCache");
  }
}
