/**
 * Several sequences ("slots") decoding together, for a server's continuous batching. Where the
 * whole token runs on the GPU, one replay steps every slot given at once (each weight read once
 * for all of them) and prompts run through the same replay, several slots' tokens packed in one;
 * elsewhere (per-layer or cpu mode, a device without room for the batch's cache, or after a lost
 * device) each slot is a Session of its own, stepped in turn: the same API and the same tokens.
 */
import { InvalidArgumentError, VkmoeError } from "../errors.ts";
import { GRAPH_MAX_TOKENS, isDeviceLost, type BatchEntry, type DeviceBatch } from "../graph/index.ts";
import type { ModelConfig } from "./model-config.ts";
import { ContextLengthError } from "./errors.ts";
import { checkTokenIds, type Session } from "./session.ts";

/** One slot's tokens for prefillMany: `ids` run after what slot `slot` holds. */
export interface PrefillItem {
  slot: number;
  ids: ArrayLike<number>;
}

/** One token of a step: the next token `id` of sequence `slot`. */
export interface BatchStep {
  slot: number;
  id: number;
}

export type BatchPath = "device-batch" | "sessions";

export class SessionBatch implements Disposable {
  readonly slots: number;
  readonly ctx: number;
  private device: DeviceBatch | undefined;
  private sessions: Session[] | undefined;
  private readonly held: number[][];
  private disposed = false;
  /** Replays (device) or session calls made so far. */
  readonly counts = { runs: 0, tokens: 0 };

  constructor(
    private readonly config: ModelConfig,
    slots: number,
    ctx: number,
    device: DeviceBatch | undefined,
    /** A slot's own Session (the fallback path). */
    private readonly openSession: (ctx: number) => Session,
    private readonly log: (line: string) => void,
    /** Told when the device is lost (the model drops its GPU paths). */
    private readonly onDeviceLost: (why: string) => void,
  ) {
    if (!Number.isInteger(slots) || slots < 1) throw new InvalidArgumentError(`slots must be a positive integer, got ${slots}`);
    if (!Number.isInteger(ctx) || ctx < 1) throw new ContextLengthError(`context length must be a positive integer, got ${ctx}`);
    if (ctx > config.maxPositions) throw new ContextLengthError(`context length ${ctx} exceeds the model's maximum of ${config.maxPositions} tokens`);
    this.slots = slots;
    this.ctx = ctx;
    this.device = device;
    this.held = Array.from({ length: slots }, () => []);
    if (!device) this.sessions = this.openSessions();
  }

  /** "device-batch": one replay steps every slot; "sessions": a Session per slot, in turn. */
  get path(): BatchPath {
    return this.device ? "device-batch" : "sessions";
  }

  /** The tokens slot `slot` holds (its prompt and generated tokens so far). */
  tokens(slot: number): readonly number[] {
    return this.held[this.checkSlot(slot)]!;
  }

  /** Drops everything after slot `slot`'s first `keep` tokens (a new request on the slot reuses a shared prefix). */
  truncate(slot: number, keep = 0): void {
    const h = this.held[this.checkSlot(slot)]!;
    if (!Number.isInteger(keep) || keep < 0 || keep > h.length) throw new ContextLengthError(`cannot keep ${keep} of ${h.length} tokens`);
    if (this.device && this.device.rewindable === false && keep < h.length) {
      // recurrent states (Qwen3.5) cannot drop tokens: the slot starts over and the kept ones run again
      const kept = h.slice(0, keep);
      h.length = keep; // what the slot holds after; a device lost on the way re-runs it on a session
      this.onDevice(
        (d) => {
          d.reset!(slot);
          for (let at = 0; at < kept.length; at += GRAPH_MAX_TOKENS) {
            d.run(kept.slice(at, at + GRAPH_MAX_TOKENS).map((id, t) => ({ slot, id, position: at + t })));
            this.counts.runs++;
          }
        },
        () => undefined,
      );
      return;
    }
    h.length = keep;
    this.sessions?.[slot]!.truncate(keep);
  }

  /** Runs `ids` after slot `slot`'s tokens; returns the last one's logits (a copy). */
  prefill(slot: number, ids: ArrayLike<number>): Float32Array {
    return this.prefillMany([{ slot, ids }])[0]!;
  }

  /**
   * Runs each item's `ids` after its slot's tokens (distinct slots), all of them packed in order
   * into replays of up to GRAPH_MAX_TOKENS tokens of any slots, so that several short prompts
   * share one pass over the weights (a long one spans replays; a replay's cache appends run
   * before its attention, so a token sees its own slot's earlier tokens of the same replay).
   * Returns each item's last logits (copies), out[i] for items[i].
   */
  prefillMany(items: readonly PrefillItem[]): Float32Array[] {
    this.checkLive();
    if (items.length < 1) throw new InvalidArgumentError("prefillMany needs at least one item");
    const seen = new Set<number>();
    for (const { slot, ids } of items) {
      this.checkSlot(slot);
      if (seen.has(slot)) throw new InvalidArgumentError(`slot ${slot} appears twice in one prefill`);
      seen.add(slot);
      if (ids.length < 1) throw new InvalidArgumentError("prefill needs at least one token");
      this.checkRoom(slot, ids.length);
      this.checkIds(ids);
    }
    const V = this.config.vocab;
    const lists = items.map((item) => Array.from(item.ids));
    const out = this.onDevice(
      (d) => {
        // every token in item order, each at its slot's next position; `last` marks an item's final token
        const entries: (BatchEntry & { last?: number })[] = [];
        lists.forEach((list, i) => {
          const { slot } = items[i]!, from = this.held[slot]!.length;
          list.forEach((id, t) => entries.push({ slot, id, position: from + t, last: t === list.length - 1 ? i : undefined }));
        });
        const rows: Float32Array[] = new Array(items.length);
        for (let at = 0; at < entries.length; at += GRAPH_MAX_TOKENS) {
          const chunk = entries.slice(at, at + GRAPH_MAX_TOKENS);
          const logits = d.run(chunk);
          this.counts.runs++;
          chunk.forEach((e, r) => {
            if (e.last !== undefined) rows[e.last] = logits.slice(r * V, (r + 1) * V);
          });
        }
        return rows;
      },
      (sessions) => lists.map((list, i) => sessions[items[i]!.slot]!.prefill(list).slice()),
    );
    lists.forEach((list, i) => {
      this.held[items[i]!.slot]!.push(...list);
      this.counts.tokens += list.length;
    });
    return out;
  }

  /**
   * One token for each step (distinct slots), in one replay on the device: their logits, row i
   * for steps[i] (views valid until the next call on this batch).
   */
  step(steps: readonly BatchStep[]): Float32Array[] {
    this.checkLive();
    if (steps.length < 1 || steps.length > GRAPH_MAX_TOKENS) throw new InvalidArgumentError(`a step takes 1..${GRAPH_MAX_TOKENS} sequences, got ${steps.length}`);
    const seen = new Set<number>();
    for (const s of steps) {
      this.checkSlot(s.slot);
      if (seen.has(s.slot)) throw new InvalidArgumentError(`slot ${s.slot} appears twice in one step`);
      seen.add(s.slot);
      this.checkRoom(s.slot, 1);
    }
    this.checkIds(steps.map((s) => s.id));
    const V = this.config.vocab;
    const rows = this.onDevice(
      (d) => {
        const logits = d.run(steps.map((s) => ({ slot: s.slot, id: s.id, position: this.held[s.slot]!.length })));
        this.counts.runs++;
        return steps.map((_, i) => logits.subarray(i * V, (i + 1) * V));
      },
      // a CPU session's logits are its own buffer; device sessions share the graph's, so those are copied
      (sessions) => steps.map((s) => {
        const session = sessions[s.slot]!;
        const row = session.step(s.id);
        return session.path === "device" ? row.slice() : row;
      }),
    );
    for (const s of steps) this.held[s.slot]!.push(s.id);
    this.counts.tokens += steps.length;
    return rows;
  }

  /** Runs `device` on the batch's device path, or `cpu` on the slots' sessions; a lost device moves the batch to sessions, once, and runs `cpu`. */
  private onDevice<T>(device: (d: DeviceBatch) => T, cpu: (sessions: Session[]) => T): T {
    if (this.device) {
      try {
        return device(this.device);
      } catch (e) {
        if (!isDeviceLost(e)) throw e;
        const tokens = this.held.reduce((n, h) => n + h.length, 0);
        this.log(`vkmoe: device lost; the batch continues on the CPU path (${tokens} tokens of ${this.held.filter((h) => h.length > 0).length} sequences run again there)`);
        try {
          this.device[Symbol.dispose]();
        } catch {
          // nothing more to free on a lost device
        }
        this.device = undefined;
        this.onDeviceLost("device lost");
        this.sessions = this.openSessions();
        this.held.forEach((h, slot) => {
          if (h.length > 0) this.sessions![slot]!.prefill(h);
        });
      }
    }
    return cpu(this.sessions!);
  }

  private openSessions(): Session[] {
    const sessions: Session[] = [];
    try {
      for (let i = 0; i < this.slots; i++) sessions.push(this.openSession(this.ctx));
    } catch (e) {
      for (const s of sessions) s[Symbol.dispose]();
      throw e;
    }
    return sessions;
  }

  private checkSlot(slot: number): number {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.slots) throw new InvalidArgumentError(`slot ${slot} is outside 0..${this.slots - 1}`);
    return slot;
  }

  private checkRoom(slot: number, n: number): void {
    const held = this.held[slot]!.length;
    if (held + n > this.ctx) throw new ContextLengthError(`${held + n} tokens do not fit the context of ${this.ctx} (${held} held, ${n} more); raise --ctx (model maximum ${this.config.maxPositions})`);
  }

  private checkIds(ids: ArrayLike<number>): void {
    checkTokenIds(ids, this.config.vocab);
  }

  private checkLive(): void {
    if (this.disposed) throw new InvalidArgumentError("this batch (or its model) is disposed");
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.device?.[Symbol.dispose]();
    this.device = undefined;
    for (const s of this.sessions ?? []) s[Symbol.dispose]();
    this.sessions = undefined;
  }
}

/** Opens the batch's device path where the model runs resident, or says in `why` why not. */
export function openDeviceBatch(open: () => DeviceBatch): { device?: DeviceBatch; why?: string } {
  try {
    return { device: open() };
  } catch (e) {
    if (e instanceof VkmoeError) return { why: e.message };
    throw e;
  }
}
