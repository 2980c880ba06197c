/**
 * Typed errors of the expert pool (suballocator + expert cache).
 *
 * Every class derives from {@link VkmoeError} and carries a stable `code`.
 */
import { VkmoeError } from "../errors.ts";

/** Code a memory provider uses to say "the device has no memory for this slab". */
export const OUT_OF_DEVICE_MEMORY = "OUT_OF_DEVICE_MEMORY";

/**
 * Thrown by a {@link SlabProvider} when the device cannot back a new slab
 * (VK_ERROR_OUT_OF_DEVICE_MEMORY, or a budget the provider enforces itself).
 * The allocator propagates it unchanged; the expert cache catches it and evicts.
 *
 * A provider may also throw any other `VkmoeError` whose `code` is
 * {@link OUT_OF_DEVICE_MEMORY}; {@link isOutOfDeviceMemory} accepts both.
 */
export class OutOfDeviceMemoryError extends VkmoeError {
  /** Bytes that were requested when the device refused. */
  readonly requestedBytes: number;
  constructor(requestedBytes: number, message?: string, options?: ErrorOptions) {
    super(OUT_OF_DEVICE_MEMORY, message ?? `out of device memory allocating a slab of ${requestedBytes} bytes`, options);
    this.requestedBytes = requestedBytes;
  }
}

/** True when `err` means "device out of memory" (class or code match). */
export function isOutOfDeviceMemory(err: unknown): boolean {
  return err instanceof OutOfDeviceMemoryError || (err instanceof VkmoeError && err.code === OUT_OF_DEVICE_MEMORY);
}

/** A single allocation is larger than the largest slab the device allows. */
export class AllocationTooLargeError extends VkmoeError {
  readonly requestedBytes: number;
  readonly maxBytes: number;
  constructor(requestedBytes: number, maxBytes: number) {
    super("ALLOCATION_TOO_LARGE", `allocation of ${requestedBytes} bytes exceeds the largest slab (${maxBytes} bytes)`);
    this.requestedBytes = requestedBytes;
    this.maxBytes = maxBytes;
  }
}

/**
 * `ExpertCache.ensure` could not make an expert resident within the byte budget:
 * the expert is larger than the budget, or everything that could be evicted is pinned.
 * `tryEnsure` reports the same situation as a `{ resident: false }` verdict instead.
 */
export class BudgetExhaustedError extends VkmoeError {
  readonly layer: number;
  readonly expert: number;
  readonly bytes: number;
  readonly budget: number;
  readonly pinnedBytes: number;
  constructor(layer: number, expert: number, bytes: number, budget: number, pinnedBytes: number, detail: string) {
    super(
      "BUDGET_EXHAUSTED",
      `expert (${layer}, ${expert}) of ${bytes} bytes cannot be made resident: ${detail} (budget ${budget} bytes, ${pinnedBytes} pinned)`,
    );
    this.layer = layer;
    this.expert = expert;
    this.bytes = bytes;
    this.budget = budget;
    this.pinnedBytes = pinnedBytes;
  }
}

/**
 * The device ran out of memory and nothing evictable was left; the cache has already
 * shrunk its budget to the bytes it still holds. Reported by `ensure` (thrown) or
 * `tryEnsure` (verdict `reason: "device-oom"`). The cache stays fully usable.
 */
export class DeviceMemoryExhaustedError extends VkmoeError {
  readonly layer: number;
  readonly expert: number;
  readonly bytes: number;
  /** The budget after shrinking. */
  readonly budget: number;
  constructor(layer: number, expert: number, bytes: number, budget: number, options?: ErrorOptions) {
    super(
      "DEVICE_MEMORY_EXHAUSTED",
      `device out of memory for expert (${layer}, ${expert}) of ${bytes} bytes with nothing left to evict; budget shrunk to ${budget} bytes`,
      options,
    );
    this.layer = layer;
    this.expert = expert;
    this.bytes = bytes;
    this.budget = budget;
  }
}

/** Use of a pool object (allocator, cache, batch ticket) after `dispose()`. */
export class PoolDisposedError extends VkmoeError {
  constructor(what: string) {
    super("POOL_DISPOSED", `${what} has been disposed`);
  }
}

/**
 * An internal consistency check failed, e.g. an eviction policy offered a pinned entry
 * as a victim. Indicates a bug (usually in a custom policy), never a runtime condition.
 */
export class PoolInvariantError extends VkmoeError {
  constructor(message: string) {
    super("POOL_INVARIANT", message);
  }
}

/** A routing-history JSON document is malformed. */
export class RoutingHistoryFormatError extends VkmoeError {
  constructor(message: string, options?: ErrorOptions) {
    super("ROUTING_HISTORY_FORMAT", message, options);
  }
}
