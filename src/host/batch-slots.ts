/**
 * The server's slots as one SessionBatch (`model.batch`): every slot is a ReusableSession over its
 * row of the batch, so the SessionPool keeps doing prompt-prefix reuse per slot while a batched
 * DecodeStepper steps all active slots in one model call and packs new prompts into shared ones.
 * A slot's session is a view: disposing it empties the slot (truncate to 0) and gives the slot
 * back, so a request that failed in the engine never leaves stale state for the next one; the
 * batch itself is disposed by its owner (the host), after every slot session is back.
 */
import type { BatchPath, BatchStep, PrefillItem } from "../model/session-batch.ts";
import { argmax } from "../sampling/select.ts";
import type { ReusableSession } from "./session-pool.ts";

/** What the host needs of a SessionBatch (tests wrap one to inject faults). */
export interface SlotBatch extends Disposable {
  readonly slots: number;
  readonly ctx: number;
  readonly path: BatchPath;
  prefill(slot: number, ids: ArrayLike<number>): Float32Array;
  /** Several slots' prompts packed into shared model calls: each item's last logits (copies). */
  prefillMany(items: readonly PrefillItem[]): Float32Array[];
  /** Logits row i for steps[i]: views valid until the next call. */
  step(steps: readonly BatchStep[]): Float32Array[];
  tokens(slot: number): readonly number[];
  truncate(slot: number, keep: number): void;
}

export class SlotsExhaustedError extends RangeError {
  constructor(slots: number) {
    super(`all ${slots} slots of the batch are taken`);
  }
}

/** One slot of a batch, as a session: what a Sequence and the SessionPool use. */
export class BatchSlotSession implements ReusableSession {
  private released = false;

  constructor(readonly batch: SlotBatch, readonly slot: number, private readonly giveBack: (slot: number) => void) {}

  get ctx(): number {
    return this.batch.ctx;
  }

  get length(): number {
    return this.batch.tokens(this.slot).length;
  }

  get tokens(): readonly number[] {
    return this.batch.tokens(this.slot);
  }

  truncate(keep: number): void {
    this.batch.truncate(this.slot, keep);
  }

  prefill(ids: ArrayLike<number>): Float32Array {
    return this.batch.prefill(this.slot, ids);
  }

  step(id: number): Float32Array {
    return this.batch.step([{ slot: this.slot, id }])[0]!;
  }

  /** The row's argmax on the host (the engine's tie rule: the lowest id). */
  stepGreedy(id: number): { id: number; value: number } {
    const row = this.step(id);
    const best = argmax(row);
    return { id: best, value: best < 0 ? -Infinity : row[best]! };
  }

  /** Empties the slot and gives it back; idempotent. */
  [Symbol.dispose](): void {
    if (this.released) return;
    this.released = true;
    try {
      this.batch.truncate(this.slot, 0);
    } finally {
      this.giveBack(this.slot);
    }
  }
}

/** Hands out the batch's slots as sessions, at most one live session per slot. */
export class BatchSlots {
  private readonly free: number[];

  constructor(readonly batch: SlotBatch) {
    this.free = Array.from({ length: batch.slots }, (_, i) => i);
  }

  /** The lowest free slot as a session; throws SlotsExhaustedError when none is free (the pool never asks then). */
  open(): BatchSlotSession {
    const slot = this.free.shift();
    if (slot === undefined) throw new SlotsExhaustedError(this.batch.slots);
    return new BatchSlotSession(this.batch, slot, (s) => {
      this.free.push(s);
      this.free.sort((a, b) => a - b);
    });
  }
}
