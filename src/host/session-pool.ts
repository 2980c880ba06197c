/**
 * The slots' sessions, kept between requests: the server's prompt cache. At most `size` sessions
 * are open (one per slot), opened only when a request finds none to reuse. A request takes the
 * free session whose held ids share the longest prefix with its prompt, cut back to that prefix
 * (at most prompt.length - 1, so that one token always runs), and prefills only the rest: a
 * multi-turn chat re-sends the conversation, which then costs only the new turn. A session that
 * failed, or was opened before the device was lost, is disposed, never reused.
 */
import { reusablePrefix, type SequenceSession } from "../engine/index.ts";

/** A session the pool can reuse: it says what it holds and can drop what follows a prefix. */
export interface ReusableSession extends SequenceSession {
  readonly tokens: readonly number[];
  truncate(keep: number): void;
}

/** A session taken for one request, and how many of its prompt's ids it already holds. */
export interface SessionLease {
  readonly session: ReusableSession;
  readonly heldPrefix: number;
}

export interface SessionPoolStats {
  /** Sessions open (taken or free). */
  open: number;
  /** Sessions opened since start. */
  opened: number;
  /** Sessions disposed because they failed or outlived their device. */
  discarded: number;
}

interface Entry {
  session: ReusableSession;
  /** The device's state when it was opened (see `epoch`). */
  epoch: string;
  /** When it was last given back (least recently used goes first when nothing is shared). */
  freedAt: number;
}

export class SessionPool implements Disposable {
  private readonly free: Entry[] = [];
  private readonly taken = new Map<ReusableSession, Entry>();
  private opened = 0;
  private discarded = 0;
  private clock = 0;
  private disposed = false;

  constructor(
    private readonly size: number,
    private readonly open: () => ReusableSession,
    /** Changes when the device is lost (the model's run mode): sessions of an older epoch are not reused. */
    private readonly epoch: () => string = () => "",
  ) {
    if (!Number.isInteger(size) || size < 1) throw new RangeError(`size must be an integer >= 1, got ${size}`);
  }

  /**
   * A session for `prompt`, cut back to the longest prefix it shares with it. Throws what opening
   * a session throws; a RangeError when every session is taken (the scheduler never asks then).
   */
  acquire(prompt: readonly number[]): SessionLease {
    if (this.disposed) throw new RangeError("the session pool is disposed");
    this.dropStale();
    let best: Entry | undefined;
    let bestPrefix = 0;
    for (const e of this.free) {
      const n = reusablePrefix(e.session.tokens, prompt);
      if (best === undefined || n > bestPrefix || (n === bestPrefix && e.freedAt < best.freedAt)) [best, bestPrefix] = [e, n];
    }
    // nothing shared and room for another session: open one, keeping the free ones' caches for later
    if ((best === undefined || bestPrefix === 0) && this.count() < this.size) best = this.openEntry();
    if (best === undefined) throw new RangeError(`all ${this.size} sessions are taken`);
    const at = this.free.indexOf(best);
    if (at >= 0) this.free.splice(at, 1);
    this.taken.set(best.session, best);
    const heldPrefix = bestPrefix;
    try {
      best.session.truncate(heldPrefix);
    } catch (e) {
      this.release(best.session, { reusable: false });
      throw e;
    }
    return { session: best.session, heldPrefix };
  }

  /** Gives a session back: kept for reuse, or disposed where its request failed in the engine. */
  release(session: ReusableSession, { reusable }: { reusable: boolean }): void {
    const entry = this.taken.get(session);
    if (!entry) return;
    this.taken.delete(session);
    const keep = reusable && entry.epoch === this.epoch();
    if (keep && !this.disposed) {
      entry.freedAt = ++this.clock;
      this.free.push(entry);
      return;
    }
    if (!keep) this.discarded++;
    disposeQuietly(session);
  }

  stats(): SessionPoolStats {
    return { open: this.count(), opened: this.opened, discarded: this.discarded };
  }

  /** Disposes the free sessions now and each taken one as it comes back. */
  [Symbol.dispose](): void {
    this.disposed = true;
    for (const e of this.free.splice(0)) disposeQuietly(e.session);
  }

  private count(): number {
    return this.free.length + this.taken.size;
  }

  private openEntry(): Entry {
    const entry: Entry = { session: this.open(), epoch: this.epoch(), freedAt: 0 };
    this.opened++;
    this.free.push(entry);
    return entry;
  }

  /** Free sessions opened before the device was lost hold caches of a path that is gone. */
  private dropStale(): void {
    const now = this.epoch();
    for (let i = this.free.length - 1; i >= 0; i--) {
      if (this.free[i]!.epoch === now) continue;
      const [e] = this.free.splice(i, 1);
      this.discarded++;
      disposeQuietly(e!.session);
    }
  }
}

function disposeQuietly(session: ReusableSession): void {
  try {
    session[Symbol.dispose]();
  } catch {
    // a session that cannot free its device memory (a lost device) has nothing more to give back
  }
}
