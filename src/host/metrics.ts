/**
 * The server's counters and gauges, rendered as Prometheus text (GET /metrics): requests by route
 * and status, prompt tokens (reused from a slot's cache or prefilled) and completion tokens,
 * decode throughput over the last seconds, the model calls that ran prompts, decode rounds' model
 * calls and the sequences each call advanced (how much batching happens), and the scheduler's
 * queue depth, active sequences and sessions, read live.
 */
import type { StepperName } from "./decode-stepper.ts";
import type { SessionPoolStats } from "./session-pool.ts";

export interface LiveGauges {
  queued: number;
  active: number;
  slots: number;
  queueLimit: number;
  sessions?: SessionPoolStats;
  stepper?: StepperName;
}

/** Seconds of history for the throughput gauge. */
const WINDOW_S = 10;

export class Metrics {
  private readonly requests = new Map<string, number>();
  private promptTokensPrefilled = 0;
  private promptTokensReused = 0;
  private completionTokens = 0;
  private cancelled = 0;
  private streamErrors = 0;
  private timeouts = 0;
  private decodeCalls = 0;
  private decodeSequenceSteps = 0;
  private prefillCalls = 0;
  /** Tokens decoded per whole second (epoch seconds → count), the last WINDOW_S seconds. */
  private readonly perSecond = new Map<number, number>();
  private readonly startedAt = performance.now();

  constructor(private readonly live: () => LiveGauges) {}

  request(route: string, status: number): void {
    const key = `route="${route}",status="${status}"`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
  }

  /** A request's prompt: `tokens` run now, `reused` held by its slot's session already. */
  prefilled(tokens: number, reused = 0): void {
    this.promptTokensPrefilled += tokens;
    this.promptTokensReused += reused;
  }

  /** Tokens generated (any sequence). */
  generated(count: number): void {
    this.completionTokens += count;
    const now = Math.floor(Date.now() / 1000);
    this.perSecond.set(now, (this.perSecond.get(now) ?? 0) + count);
    if (this.perSecond.size > WINDOW_S + 2) for (const s of this.perSecond.keys()) if (s <= now - WINDOW_S) this.perSecond.delete(s);
  }

  /** A decode round: `calls` model calls advanced `sequences` sequences by a token each. */
  decoded(calls: number, sequences: number): void {
    this.decodeCalls += calls;
    this.decodeSequenceSteps += sequences;
  }

  /** The prompts admitted between two rounds: `calls` model calls ran them (several packed into one when batching). */
  prefillsRan(calls: number): void {
    this.prefillCalls += calls;
  }

  cancel(): void {
    this.cancelled++;
  }

  streamError(): void {
    this.streamErrors++;
  }

  timeout(): void {
    this.timeouts++;
  }

  /** Decode tokens per second, all sequences together, over the last WINDOW_S seconds (or since start). */
  tokensPerSecond(): number {
    const now = Date.now() / 1000;
    let sum = 0;
    for (const [s, n] of this.perSecond) if (s > now - WINDOW_S) sum += n;
    const span = Math.min(WINDOW_S, Math.max(1, (performance.now() - this.startedAt) / 1000));
    return sum / span;
  }

  render(): string {
    const g = this.live();
    const lines: string[] = [];
    const metric = (name: string, type: "counter" | "gauge", help: string, samples: [string, number][]) => {
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
      for (const [labels, value] of samples) lines.push(`${name}${labels ? `{${labels}}` : ""} ${Number.isFinite(value) ? value : 0}`);
    };
    metric("vkmoe_requests_total", "counter", "HTTP requests answered, by route and status.", [...this.requests].sort());
    metric("vkmoe_prompt_tokens_total", "counter", "Prompt tokens of the requests that ran (prefilled + reused).", [["", this.promptTokensPrefilled + this.promptTokensReused]]);
    metric("vkmoe_prompt_tokens_prefilled_total", "counter", "Prompt tokens run through the model.", [["", this.promptTokensPrefilled]]);
    metric("vkmoe_prompt_tokens_reused_total", "counter", "Prompt tokens a slot's session held already (its prompt cache), not run again.", [["", this.promptTokensReused]]);
    metric("vkmoe_prefill_calls_total", "counter", "Model calls that ran prompts (batching packs the prompts admitted together into shared calls of up to 64 tokens; one shared with a decode round counts there too).", [["", this.prefillCalls]]);
    metric("vkmoe_completion_tokens_total", "counter", "Tokens generated.", [["", this.completionTokens]]);
    metric("vkmoe_decode_tokens_per_second", "gauge", `Tokens generated per second, all sequences together, over the last ${WINDOW_S} s.`, [["", round(this.tokensPerSecond())]]);
    metric("vkmoe_decode_calls_total", "counter", "Model calls made by decode rounds (one per round when batching, one per sequence per round when not).", [["", this.decodeCalls]]);
    metric("vkmoe_decode_sequence_steps_total", "counter", "Sequences advanced by decode rounds (a token each).", [["", this.decodeSequenceSteps]]);
    metric("vkmoe_decode_sequences_per_call", "gauge", "Mean sequences advanced per decode model call since start (1 without batching).", [["", round(this.decodeCalls ? this.decodeSequenceSteps / this.decodeCalls : 0)]]);
    if (g.stepper) metric("vkmoe_decode_stepper", "gauge", "How decode rounds call the model (--batching): 1 for the stepper in use.", [[`stepper="${g.stepper}"`, 1]]);
    metric("vkmoe_queue_depth", "gauge", "Requests waiting for a slot.", [["", g.queued]]);
    metric("vkmoe_queue_limit", "gauge", "Requests that may wait before new ones get a 429.", [["", g.queueLimit]]);
    metric("vkmoe_active_sequences", "gauge", "Requests holding a slot (a session).", [["", g.active]]);
    metric("vkmoe_slots", "gauge", "Slots (--parallel).", [["", g.slots]]);
    if (g.sessions) {
      metric("vkmoe_sessions_open", "gauge", "Sessions (KV caches) open, one per slot at most, kept between requests.", [["", g.sessions.open]]);
      metric("vkmoe_sessions_opened_total", "counter", "Sessions opened.", [["", g.sessions.opened]]);
      metric("vkmoe_sessions_discarded_total", "counter", "Sessions disposed because the engine failed in them or their device was lost.", [["", g.sessions.discarded]]);
    }
    metric("vkmoe_requests_cancelled_total", "counter", "Requests ended by the client (disconnect or stream cancelled).", [["", this.cancelled]]);
    metric("vkmoe_request_timeouts_total", "counter", "Requests ended by the server's time limit.", [["", this.timeouts]]);
    metric("vkmoe_stream_errors_total", "counter", "Streams that ended with an error event.", [["", this.streamErrors]]);
    return `${lines.join("\n")}\n`;
  }
}

const round = (x: number) => Math.round(x * 100) / 100;
