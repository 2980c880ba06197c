/**
 * Routing history: how often each (layer, expert) was routed to, saved as JSON so a later run can
 * preload the most frequently routed experts (warm start).
 *
 * JSON format (version 1):
 * ```json
 * { "format": "vkmoe.routing-histogram", "version": 1, "meta": { "model": "..." },
 *   "entries": [[layer, expert, count], ...] }
 * ```
 * `entries` is sorted by count, descending; `meta` is free-form (strings / numbers) and optional.
 */
import { InvalidArgumentError } from "../errors.ts";
import { RoutingHistoryFormatError } from "./errors.ts";

export const ROUTING_HISTOGRAM_FORMAT = "vkmoe.routing-histogram";
export const ROUTING_HISTOGRAM_VERSION = 1;

/** Experts per layer the packed key can address. */
export const MAX_EXPERTS_PER_LAYER = 65536;

/** Pack (layer, expert) into one exact number key. Validates both. */
export function expertKey(layer: number, expert: number): number {
  if (!Number.isSafeInteger(layer) || layer < 0 || layer >= 2 ** 36) {
    throw new InvalidArgumentError(`layer must be an integer in [0, 2^36), got ${layer}`);
  }
  if (!Number.isSafeInteger(expert) || expert < 0 || expert >= MAX_EXPERTS_PER_LAYER) {
    throw new InvalidArgumentError(`expert must be an integer in [0, ${MAX_EXPERTS_PER_LAYER}), got ${expert}`);
  }
  return layer * MAX_EXPERTS_PER_LAYER + expert;
}

export function keyLayer(key: number): number {
  return Math.floor(key / MAX_EXPERTS_PER_LAYER);
}

export function keyExpert(key: number): number {
  return key % MAX_EXPERTS_PER_LAYER;
}

export interface RoutedCount {
  readonly layer: number;
  readonly expert: number;
  readonly count: number;
}

export interface RoutingHistogramJson {
  format: typeof ROUTING_HISTOGRAM_FORMAT;
  version: typeof ROUTING_HISTOGRAM_VERSION;
  meta?: Record<string, string | number>;
  entries: [number, number, number][];
}

/** Counts per (layer, expert). O(1) per record. */
export class RoutingHistogram {
  readonly meta: Record<string, string | number>;
  private readonly counts = new Map<number, number>();
  private totalCount = 0;

  constructor(meta: Record<string, string | number> = {}) {
    this.meta = { ...meta };
  }

  /** Add `n` (default 1) routings of (layer, expert). */
  record(layer: number, expert: number, n: number = 1): void {
    this.recordKey(expertKey(layer, expert), n);
  }

  /** @internal record by packed key (already validated). */
  recordKey(key: number, n: number = 1): void {
    if (!Number.isSafeInteger(n) || n < 0) throw new InvalidArgumentError(`count must be a non-negative integer, got ${n}`);
    if (n === 0) return;
    this.counts.set(key, (this.counts.get(key) ?? 0) + n);
    this.totalCount += n;
  }

  count(layer: number, expert: number): number {
    return this.counts.get(expertKey(layer, expert)) ?? 0;
  }

  /** Distinct (layer, expert) pairs seen. */
  get size(): number {
    return this.counts.size;
  }

  /** Sum of all counts. */
  get total(): number {
    return this.totalCount;
  }

  /** All entries, most routed first (ties: lower layer, then lower expert). Optionally the first `limit`. */
  hottest(limit?: number): RoutedCount[] {
    const out: RoutedCount[] = [];
    for (const [key, count] of this.counts) out.push({ layer: keyLayer(key), expert: keyExpert(key), count });
    out.sort((a, b) => b.count - a.count || a.layer - b.layer || a.expert - b.expert);
    return limit === undefined ? out : out.slice(0, limit);
  }

  /** Add every count of `other` into this histogram. */
  merge(other: RoutingHistogram): void {
    for (const [key, count] of other.counts) this.recordKey(key, count);
  }

  clear(): void {
    this.counts.clear();
    this.totalCount = 0;
  }

  toJSON(): RoutingHistogramJson {
    const json: RoutingHistogramJson = {
      format: ROUTING_HISTOGRAM_FORMAT,
      version: ROUTING_HISTOGRAM_VERSION,
      entries: this.hottest().map((e) => [e.layer, e.expert, e.count]),
    };
    if (Object.keys(this.meta).length > 0) json.meta = { ...this.meta };
    return json;
  }

  stringify(): string {
    return JSON.stringify(this.toJSON());
  }

  /** Parse a JSON text (see the module comment); throws {@link RoutingHistoryFormatError}. */
  static parse(text: string): RoutingHistogram {
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (e) {
      throw new RoutingHistoryFormatError(`routing history is not valid JSON: ${(e as Error).message}`, { cause: e });
    }
    return RoutingHistogram.fromJSON(value);
  }

  /** Validate and load a parsed JSON value; throws {@link RoutingHistoryFormatError}. Duplicate pairs add up. */
  static fromJSON(value: unknown): RoutingHistogram {
    const bad = (m: string): never => {
      throw new RoutingHistoryFormatError(`routing history: ${m}`);
    };
    if (typeof value !== "object" || value === null || Array.isArray(value)) bad("not an object");
    const v = value as Record<string, unknown>;
    if (v.format !== ROUTING_HISTOGRAM_FORMAT) bad(`format must be "${ROUTING_HISTOGRAM_FORMAT}", got ${JSON.stringify(v.format)}`);
    if (v.version !== ROUTING_HISTOGRAM_VERSION) bad(`unsupported version ${JSON.stringify(v.version)}`);
    const meta: Record<string, string | number> = {};
    if (v.meta !== undefined) {
      if (typeof v.meta !== "object" || v.meta === null || Array.isArray(v.meta)) bad("meta must be an object");
      for (const [k, x] of Object.entries(v.meta as Record<string, unknown>)) {
        if (typeof x !== "string" && typeof x !== "number") bad(`meta.${k} must be a string or number`);
        meta[k] = x as string | number;
      }
    }
    if (!Array.isArray(v.entries)) bad("entries must be an array");
    const h = new RoutingHistogram(meta);
    (v.entries as unknown[]).forEach((e, i) => {
      if (!Array.isArray(e) || e.length !== 3) bad(`entries[${i}] must be [layer, expert, count]`);
      const [layer, expert, count] = e as unknown[];
      if (typeof layer !== "number" || typeof expert !== "number" || typeof count !== "number") {
        bad(`entries[${i}] must hold three numbers`);
      }
      if (!Number.isSafeInteger(count) || (count as number) < 0) bad(`entries[${i}]: count must be a non-negative integer`);
      let key = 0;
      try {
        key = expertKey(layer as number, expert as number);
      } catch (err) {
        bad(`entries[${i}]: ${(err as Error).message}`);
      }
      h.recordKey(key, count as number);
    });
    return h;
  }
}
