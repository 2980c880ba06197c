/**
 * One request's generation, advanced one model call at a time so that a scheduler can interleave
 * many: `prefill()` runs the prompt and picks the first token, each `step()` runs the model on the
 * last token and picks the next. The decisions are the engine's generate() (src/engine/generate.ts)
 * made in the same order (sampling, EOS ids, stop strings, the token limit, the context's end), so
 * a sequence gives generate()'s text for the same prompt and options; the test holds them equal.
 * It is here and not in the engine because generate() is one uninterruptible generator that picks
 * its own model calls; a batched stepper needs to make the calls itself (`pendingInput` + `accept`).
 */
import type { FinishReason } from "../engine/index.ts";
import { InvalidArgumentError } from "../errors.ts";
import type { SamplingOptions } from "../sampling/options.ts";
import { Sampler, type TokenLogprob } from "../sampling/sampler.ts";
import { StopStringMatcher } from "../sampling/stop.ts";
import { TokenTextStream } from "../tokenizer/stream.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";

/** What a sequence needs of an engine Session (a Session is one; tests wrap one to inject faults). */
export interface SequenceSession extends Disposable {
  readonly ctx: number;
  readonly length: number;
  prefill(ids: ArrayLike<number>): Float32Array;
  step(id: number): Float32Array;
  stepGreedy(id: number): { id: number; value: number };
}

export interface SequenceOptions {
  maxTokens: number;
  sampling: SamplingOptions;
  stop: readonly string[];
  /** Report each token's logprob and this many alternatives (undefined: no logprobs). */
  topLogprobs?: number;
}

/** One generated token, with its logprobs when they were asked for. */
export interface GeneratedToken {
  id: number;
  logprob?: number;
  topLogprobs?: TokenLogprob[];
}

/** What one prefill() or step() produced: text now safe to show, and the token(s) picked. */
export interface SequenceDelta {
  text: string;
  tokens: GeneratedToken[];
}

export class Sequence {
  readonly ids: number[] = [];
  text = "";
  finishReason: FinishReason | undefined;
  readonly timings = { promptSeconds: 0, decodeSeconds: 0, decodeTokens: 0 };
  private readonly sampler: Sampler;
  private readonly eos: Set<number>;
  private readonly stream: TokenTextStream;
  private readonly stops: StopStringMatcher;
  private readonly history: number[];
  private readonly argmaxOnDevice: boolean;
  private stoppedByText = false;
  /** The token the next model call runs (the last one picked). */
  private pending: number | undefined;
  private delta: SequenceDelta = { text: "", tokens: [] };
  private decodeStart = 0;

  constructor(
    private readonly tokenizer: TextTokenizer,
    readonly session: SequenceSession,
    readonly promptIds: readonly number[],
    private readonly options: SequenceOptions,
  ) {
    if (!Number.isInteger(options.maxTokens) || options.maxTokens < 0) throw new InvalidArgumentError(`maxTokens must be an integer >= 0, got ${options.maxTokens}`);
    this.sampler = new Sampler(options.sampling);
    this.eos = new Set(tokenizer.eosIds);
    this.stream = new TokenTextStream(tokenizer);
    this.stops = new StopStringMatcher(options.stop);
    this.history = [...promptIds];
    // logprobs need the logits: then the device's argmax shortcut is not taken (the same id either way)
    this.argmaxOnDevice = this.sampler.argmaxOnly && options.topLogprobs === undefined;
  }

  get seed(): number {
    return this.sampler.seed;
  }

  get done(): boolean {
    return this.finishReason !== undefined;
  }

  /** The token the next model call runs; undefined before prefill and once done. */
  get pendingInput(): number | undefined {
    return this.done ? undefined : this.pending;
  }

  /** Runs the prompt and picks the first token. */
  prefill(): SequenceDelta {
    if (this.pending !== undefined || this.done || this.ids.length > 0) throw new InvalidArgumentError("prefill runs once, first");
    const t0 = performance.now();
    const logits = this.session.prefill(this.promptIds);
    this.timings.promptSeconds = (performance.now() - t0) / 1000;
    this.decodeStart = performance.now();
    if (this.options.maxTokens === 0) {
      this.finish("length");
      return this.takeDelta();
    }
    this.consume(logits, undefined);
    return this.takeDelta();
  }

  /** One model call on the last token, and the next token picked. */
  step(): SequenceDelta {
    const id = this.pendingInput;
    if (id === undefined) throw new InvalidArgumentError("step needs a prefilled sequence that is not done");
    if (this.argmaxOnDevice) this.accept({ greedyId: this.session.stepGreedy(id).id });
    else this.accept({ logits: this.session.step(id) });
    return this.takeDelta();
  }

  /**
   * The result of a model call on `pendingInput` made by someone else (a batched stepper): the
   * logits, or the argmax id where `wantsLogits` is false.
   */
  accept(output: { logits: Float32Array } | { greedyId: number }): void {
    this.timings.decodeTokens++;
    this.consume("logits" in output ? output.logits : undefined, "greedyId" in output ? output.greedyId : undefined);
  }

  /** Whether accept() needs logits (false: the argmax id suffices). */
  get wantsLogits(): boolean {
    return !this.argmaxOnDevice;
  }

  /** What accept() produced since the last call (for a batched stepper). */
  takeDelta(): SequenceDelta {
    const d = this.delta;
    this.delta = { text: "", tokens: [] };
    return d;
  }

  private consume(logits: Float32Array | undefined, greedyId: number | undefined): void {
    let token: GeneratedToken;
    if (greedyId !== undefined) token = { id: greedyId };
    else if (this.options.topLogprobs !== undefined) {
      const s = this.sampler.sampleWithInfo(logits!, this.history, { topLogprobs: this.options.topLogprobs });
      token = { id: s.token, logprob: s.logprob, topLogprobs: s.topLogprobs };
    } else token = { id: this.sampler.sample(logits!, this.history) };
    const id = token.id;
    if (id < 0) throw new InvalidArgumentError("no token can be chosen: every logit is NaN or -Infinity");
    this.ids.push(id);
    this.history.push(id);
    this.delta.tokens.push(token);
    this.pending = id;
    if (this.eos.has(id)) return this.finish("stop");
    if (this.emit(this.stream.push(id))) {
      this.stoppedByText = true;
      return this.finish("stop");
    }
    if (this.ids.length >= this.options.maxTokens || this.session.length >= this.session.ctx) return this.finish("length");
  }

  /** Passes text through the stop strings; true when one completed. */
  private emit(text: string): boolean {
    const r = this.stops.push(text);
    if (r.text) {
      this.text += r.text;
      this.delta.text += r.text;
    }
    return r.stopped !== undefined;
  }

  private finish(reason: FinishReason): void {
    if (!this.stoppedByText) {
      // the detokenizer's held bytes, then the stop matcher's held tail, as generate() releases them
      if (this.emit(this.stream.flush())) reason = "stop";
      else {
        const rest = this.stops.flush();
        if (rest) {
          this.text += rest;
          this.delta.text += rest;
        }
      }
    }
    this.finishReason = reason;
    this.timings.decodeSeconds = (performance.now() - this.decodeStart) / 1000;
  }
}
