/**
 * Who runs next. A bounded queue in front of a fixed number of slots; each slot holds one request's
 * Sequence over a session from the SessionPool (a slot of the server's SessionBatch, or a Session
 * of its own where the host was given `openSession`; one per slot, kept between requests: a new
 * prompt reuses the longest prefix a free session holds and prefills only the rest). Each round
 * the loop fills free slots from the queue and runs their prompts together (in the round's own
 * call where that saves one), then lets the DecodeStepper advance every active sequence by one
 * token, then yields to the event loop so that streams flush and new requests, disconnects and
 * aborts are seen. A request that finishes, fails, is cancelled or runs past its deadline frees
 * its slot at once; its session goes back to the pool, or is disposed where the engine failed in it.
 *
 * The stepper decides how a round calls the model: round-robin makes one call per sequence; the
 * batched stepper makes one call for all of them over the server's SessionBatch, and packs the
 * prompts admitted together into shared calls (decode-stepper.ts).
 */
import { ApiError, RequestTimeoutError } from "./errors.ts";
import type { Sequence, SequenceDelta } from "../engine/index.ts";
import { roundRobinStepper, type DecodeRound, type DecodeStepper, type PrefillRound, type SharedRound, type StepperName } from "./decode-stepper.ts";
import { SessionPool, type ReusableSession, type SessionLease, type SessionPoolStats } from "./session-pool.ts";

export { roundRobinStepper, type DecodeStepper } from "./decode-stepper.ts";

/** Where a job's output goes (the HTTP handler's response). Called from the scheduler's loop. */
export interface JobSink {
  delta(delta: SequenceDelta, sequence: Sequence): void;
  finished(sequence: Sequence): void;
  failed(error: unknown): void;
}

export interface JobRequest {
  promptIds: readonly number[];
  /**
   * Builds the sequence over the slot's session, which holds the prompt's first `heldPrefix` ids
   * already (it may throw: that fails the job).
   */
  start(session: ReusableSession, heldPrefix: number): Sequence;
  /** performance.now() after which the job fails with RequestTimeoutError. */
  deadline: number;
  timeoutSeconds: number;
}

export type JobState = "queued" | "active" | "done";

export interface Job {
  readonly state: JobState;
  /** The client went away: frees the slot (or the queue place) now; the sink hears nothing more. */
  cancel(): void;
}

export interface SchedulerStats {
  queued: number;
  active: number;
  slots: number;
  queueLimit: number;
  sessions: SessionPoolStats;
  stepper: StepperName;
}

export interface Scheduler extends AsyncDisposable {
  /** Queues a job; throws a 429 ApiError when the queue is full, a 503 once closing. */
  submit(request: JobRequest, sink: JobSink): Job;
  stats(): SchedulerStats;
}

export interface SchedulerHooks {
  /** A job's prompt ran: `prefilled` ids run now, `reused` held by its session already. */
  prefilled?(prefilled: number, reused: number): void;
  /** The prompts admitted in one gap between rounds made `modelCalls` model calls for `sequences` sequences. */
  prefillCalls?(modelCalls: number, sequences: number): void;
  /** Tokens picked (for throughput and the token counters). */
  generated?(tokens: number): void;
  /** A decode round made `modelCalls` model calls to advance `sequences` sequences. */
  decoded?(modelCalls: number, sequences: number): void;
  cancelled?(): void;
  timedOut?(): void;
}

export interface SlotSchedulerOptions {
  slots: number;
  queueLimit: number;
  /** Opens one slot's session (called lazily, at most `slots` live at once). */
  openSession: () => ReusableSession;
  /** Changes when the device is lost: sessions opened before are disposed, not reused. */
  deviceEpoch?: () => string;
  stepper?: DecodeStepper;
  hooks?: SchedulerHooks;
}

class SlotJob implements Job {
  state: JobState = "queued";
  lease: SessionLease | undefined;
  sequence: Sequence | undefined;
  startedAt = 0;
  constructor(readonly request: JobRequest, readonly sink: JobSink, private readonly onCancel: (job: SlotJob) => void) {}
  cancel(): void {
    if (this.state !== "done") this.onCancel(this);
  }
}

export class SlotScheduler implements Scheduler {
  private readonly queue: SlotJob[] = [];
  private readonly active: SlotJob[] = [];
  private wake: (() => void) | undefined;
  private closing = false;
  private readonly loopDone: Promise<void>;
  /** Seconds recent jobs held a slot, for Retry-After. */
  private recentSeconds = 1;

  private readonly slots: number;
  private readonly queueLimit: number;
  private readonly stepper: DecodeStepper;
  private readonly hooks: SchedulerHooks;
  private readonly sessions: SessionPool;

  constructor(options: SlotSchedulerOptions) {
    const { slots, queueLimit } = options;
    if (!Number.isInteger(slots) || slots < 1) throw new RangeError(`slots must be an integer >= 1, got ${slots}`);
    if (!Number.isInteger(queueLimit) || queueLimit < 0) throw new RangeError(`queueLimit must be an integer >= 0, got ${queueLimit}`);
    this.slots = slots;
    this.queueLimit = queueLimit;
    this.stepper = options.stepper ?? roundRobinStepper;
    this.hooks = options.hooks ?? {};
    this.sessions = new SessionPool(slots, options.openSession, options.deviceEpoch);
    this.loopDone = this.loop();
  }

  submit(request: JobRequest, sink: JobSink): Job {
    if (this.closing) throw new ApiError(503, "service_unavailable_error", "the server is shutting down", null, "shutting_down");
    const freeSlots = Math.max(0, this.slots - this.active.length);
    if (this.queue.length >= this.queueLimit + freeSlots) {
      const retry = String(Math.min(60, Math.max(1, Math.ceil(this.recentSeconds))));
      throw new ApiError(429, "rate_limit_error", `the server is busy: ${this.slots} requests running and ${this.queue.length} waiting (the queue's limit); retry after ${retry} s`, null, "queue_full", { "Retry-After": retry });
    }
    const job = new SlotJob(request, sink, (j) => this.cancel(j));
    this.queue.push(job);
    this.wake?.();
    return job;
  }

  stats(): SchedulerStats {
    return { queued: this.queue.length, active: this.active.length, slots: this.slots, queueLimit: this.queueLimit, sessions: this.sessions.stats(), stepper: this.stepper.name };
  }

  /** Stops taking jobs, fails the waiting ones, lets the loop end; then every session is disposed. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.closing) return this.loopDone;
    this.closing = true;
    const closed = new ApiError(503, "service_unavailable_error", "the server is shutting down", null, "shutting_down");
    for (const job of [...this.queue, ...this.active]) this.end(job, () => job.sink.failed(closed));
    this.wake?.();
    await this.loopDone;
    this.sessions[Symbol.dispose]();
  }

  private cancel(job: SlotJob): void {
    this.hooks.cancelled?.();
    this.end(job, () => {});
  }

  /**
   * Takes the job out of the queue or its slot and gives its session back (disposed where the
   * engine failed in it: `engineFailed`), then tells the sink (`notify`).
   */
  private end(job: SlotJob, notify: () => void, engineFailed = false): void {
    if (job.state === "done") return;
    const list = job.state === "queued" ? this.queue : this.active;
    const at = list.indexOf(job);
    if (at >= 0) list.splice(at, 1);
    job.state = "done";
    if (job.lease) this.sessions.release(job.lease.session, { reusable: !engineFailed });
    notify();
  }

  private async loop(): Promise<void> {
    while (!this.closing) {
      this.expire();
      // free slots take waiting jobs now: their prompts run here, together, with or before a decode round
      const admitted = this.admitWaiting();
      if (!this.shareRound(admitted)) {
        this.prefill(admitted);
        this.round();
      }
      if (this.active.length === 0 && this.queue.length === 0) {
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
        continue;
      }
      await yieldToEventLoop();
    }
  }

  /**
   * Moves waiting jobs into the free slots: each takes a session (the one sharing most of its
   * prompt) and builds its sequence. Returns those ready to prefill.
   */
  private admitWaiting(): SlotJob[] {
    const admitted: SlotJob[] = [];
    while (this.active.length < this.slots && this.queue.length > 0) {
      const job = this.queue.shift()!;
      this.active.push(job);
      job.state = "active";
      job.startedAt = performance.now();
      try {
        job.lease = this.sessions.acquire(job.request.promptIds);
        job.sequence = job.request.start(job.lease.session, job.lease.heldPrefix);
        admitted.push(job);
      } catch (error) {
        // opening a session or building the sequence failed: no model call ran, the session is as it was
        this.end(job, () => job.sink.failed(error));
      }
    }
    return admitted;
  }

  /**
   * The admitted jobs' prompts and a decode step of the others in shared model calls, where the
   * stepper says that saves one; false (nothing run) where not.
   */
  private shareRound(admitted: SlotJob[]): boolean {
    if (admitted.length === 0 || !this.stepper.stepWithPrompts) return false;
    const isNew = new Set(admitted);
    const decoding = this.decoding().filter((j) => !isNew.has(j));
    if (decoding.length === 0) return false;
    let shared: SharedRound | undefined;
    try {
      shared = this.stepper.stepWithPrompts(decoding.map((j) => j.sequence!), admitted.map((j) => j.sequence!));
    } catch (error) {
      const failed = (jobs: SlotJob[]): DecodeRound => ({ results: jobs.map(() => ({ error })), modelCalls: 0 });
      shared = { round: failed(decoding), prompts: failed(admitted) };
    }
    if (!shared) return false;
    this.tookPrompts(admitted, shared.prompts);
    this.tookRound(decoding, shared.round);
    return true;
  }

  /** Runs the admitted jobs' prompts through the stepper (packed where it can) and delivers each first token. */
  private prefill(jobs: SlotJob[]): void {
    if (jobs.length === 0) return;
    let round: PrefillRound;
    try {
      round = this.stepper.prefill(jobs.map((j) => j.sequence!));
    } catch (error) {
      // a stepper that fails as a whole fails its call's jobs, not the loop
      round = { results: jobs.map(() => ({ error })), modelCalls: 0 };
    }
    this.tookPrompts(jobs, round);
  }

  /** Each job's prompt result: its first token delivered, or its error ending it (the session discarded). */
  private tookPrompts(jobs: SlotJob[], round: PrefillRound): void {
    this.hooks.prefillCalls?.(round.modelCalls, jobs.length);
    round.results.forEach((r, i) => {
      const job = jobs[i]!;
      if (job.state !== "active") return; // cancelled by a sink meanwhile
      if ("error" in r) return this.end(job, () => job.sink.failed(r.error), true);
      const reused = job.lease!.heldPrefix;
      this.hooks.prefilled?.(job.request.promptIds.length - reused, reused);
      this.deliverSafely(job, r);
    });
  }

  /** The jobs whose sequence prefilled and is not done. */
  private decoding(): SlotJob[] {
    return this.active.filter((j) => j.sequence && !j.sequence.done);
  }

  /** One decode step of every active sequence that prefilled and is not done. */
  private round(): void {
    const jobs = this.decoding();
    if (jobs.length === 0) return;
    let round: DecodeRound;
    try {
      round = this.stepper.step(jobs.map((j) => j.sequence!));
    } catch (error) {
      // a stepper that fails as a whole fails its round's jobs, not the loop
      round = { results: jobs.map(() => ({ error })), modelCalls: 0 };
    }
    this.tookRound(jobs, round);
  }

  /** Each job's step result: its token delivered, or its error ending it (the session discarded). */
  private tookRound(jobs: SlotJob[], round: DecodeRound): void {
    this.hooks.decoded?.(round.modelCalls, jobs.length);
    round.results.forEach((r, i) => {
      const job = jobs[i]!;
      if (job.state !== "active") return; // cancelled by a sink during this round
      if ("error" in r) this.end(job, () => job.sink.failed(r.error), true);
      else this.deliverSafely(job, r);
    });
  }

  /** Delivers; a sink that throws fails its job, not the loop. */
  private deliverSafely(job: SlotJob, delta: SequenceDelta): void {
    try {
      this.deliver(job, delta);
    } catch (error) {
      this.end(job, () => job.sink.failed(error));
    }
  }

  private deliver(job: SlotJob, delta: SequenceDelta): void {
    const seq = job.sequence!;
    if (delta.tokens.length) this.hooks.generated?.(delta.tokens.length);
    if (delta.text || delta.tokens.length) job.sink.delta(delta, seq);
    if (seq.done && job.state === "active") {
      this.recentSeconds = 0.7 * this.recentSeconds + 0.3 * ((performance.now() - job.startedAt) / 1000);
      this.end(job, () => job.sink.finished(seq));
    }
  }

  private expire(): void {
    const now = performance.now();
    for (const job of [...this.queue, ...this.active]) {
      if (now <= job.request.deadline) continue;
      this.hooks.timedOut?.();
      this.end(job, () => job.sink.failed(new RequestTimeoutError(job.request.timeoutSeconds)));
    }
  }
}

/** Lets I/O run (stream writes, new requests, aborts) between rounds; a macrotask, not a microtask. */
function yieldToEventLoop(): Promise<void> {
  const immediate = (globalThis as { setImmediate?: (f: () => void) => unknown }).setImmediate;
  return new Promise((resolve) => (immediate ? immediate(resolve) : setTimeout(resolve, 0)));
}
