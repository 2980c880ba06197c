/**
 * One generation's decisions, one model call at a time: `prefill()` runs the prompt and picks the
 * first token; each `step()` runs the model on the last token and picks the next. Each pick samples
 * (penalties over the prompt and what was generated), then stops at an EOS id, a stop string, the
 * token limit or the context's end; text is released as it becomes safe to show (UTF-8 complete,
 * not a possible start of a stop string). generate() is a loop over this; a server's scheduler
 * interleaves many, and a batched stepper can make the model calls itself (`promptInput`,
 * `acceptPrompt`, `pendingInput`, `wantsLogits`, `accept`, `takeDelta`). The session is the
 * caller's: a sequence never disposes it.
 *
 * A session may already hold the start of the prompt (`heldPrefix`: a server's slot reusing the
 * KV cache of its last request, as a multi-turn chat re-sends the conversation): then only the
 * rest of the prompt runs, and the penalties still count the whole prompt, as in a fresh run.
 */
import { InvalidArgumentError } from "../errors.ts";
import type { SamplingOptions } from "../sampling/options.ts";
import { Sampler, type TokenLogprob } from "../sampling/sampler.ts";
import { StopStringMatcher } from "../sampling/stop.ts";
import { TokenTextStream } from "../tokenizer/stream.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";

export type FinishReason = "stop" | "length";

/** Which stop ended a sequence: an EOS id or a stop string. */
export type StoppedBy = { eos: number } | { text: string };

/** What a sequence needs of an engine Session (a Session is one; tests wrap one to inject faults). */
export interface SequenceSession extends Disposable {
  readonly ctx: number;
  readonly length: number;
  /** The ids the session holds (checked against the prompt where `heldPrefix` is set). */
  readonly tokens?: readonly number[];
  prefill(ids: ArrayLike<number>): Float32Array;
  step(id: number): Float32Array;
  stepGreedy(id: number): { id: number; value: number };
}

export interface SequenceOptions {
  maxTokens: number;
  sampling?: SamplingOptions;
  /** Texts that end the generation; the stop text itself is not returned. */
  stop?: readonly string[];
  /** Stop at the tokenizer's EOS ids (default true). */
  stopAtEos?: boolean;
  /** Report each token's logprob and this many alternatives (undefined: no logprobs). */
  topLogprobs?: number;
  /** Keep a copy of the logits after the prompt (`promptLogits`); the session's own view is reused by the next call. */
  keepPromptLogits?: boolean;
  /**
   * How many of the prompt's first ids the session already holds (default 0); prefill runs the
   * rest. At most promptIds.length - 1: the last prompt token must run to give the first logits.
   */
  heldPrefix?: number;
}

/**
 * How much of `held` (the ids a session holds) a new prompt can keep: their common prefix, at most
 * prompt.length - 1 so that at least one prompt token runs and gives logits to pick from.
 */
export function reusablePrefix(held: readonly number[], prompt: readonly number[]): number {
  const limit = Math.min(held.length, prompt.length - 1);
  let n = 0;
  while (n < limit && held[n] === prompt[n]) n++;
  return n;
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
  /** Generated ids, the EOS id that ended it included. */
  readonly ids: number[] = [];
  /** All text released so far (the whole reply once done). */
  text = "";
  finishReason: FinishReason | undefined;
  stoppedBy: StoppedBy | undefined;
  /** Logits after the last prompt token, where `keepPromptLogits` asked for them. */
  promptLogits: Float32Array | undefined;
  /** Prompt ids the session held already (not run again). */
  readonly heldPrefix: number;
  /** decodeTokens: model calls after the prompt (one per token picked after the first). */
  readonly timings = { promptSeconds: 0, decodeSeconds: 0, decodeTokens: 0 };
  private readonly sampler: Sampler;
  private readonly eos: Set<number>;
  private readonly stream: TokenTextStream;
  private readonly stops: StopStringMatcher;
  /** Prompt and generated ids: what the penalties count. */
  private readonly history: number[];
  private readonly argmaxOnDevice: boolean;
  /** The token the next model call runs (the last one picked). */
  private pending: number | undefined;
  private prefilled = false;
  private delta: SequenceDelta = { text: "", tokens: [] };
  private decodeStart = 0;

  constructor(
    tokenizer: TextTokenizer,
    readonly session: SequenceSession,
    readonly promptIds: readonly number[],
    private readonly options: SequenceOptions,
  ) {
    if (!Number.isInteger(options.maxTokens) || options.maxTokens < 0) throw new InvalidArgumentError(`maxTokens must be an integer >= 0, got ${options.maxTokens}`);
    this.heldPrefix = options.heldPrefix ?? 0;
    if (!Number.isInteger(this.heldPrefix) || this.heldPrefix < 0 || (this.heldPrefix > 0 && this.heldPrefix >= promptIds.length)) {
      throw new InvalidArgumentError(`heldPrefix must be an integer from 0 to the prompt's length - 1 (${promptIds.length - 1}), got ${options.heldPrefix}`);
    }
    this.sampler = new Sampler(options.sampling);
    this.eos = new Set(options.stopAtEos === false ? [] : tokenizer.eosIds);
    this.stream = new TokenTextStream(tokenizer);
    this.stops = new StopStringMatcher(options.stop ?? []);
    this.history = [...promptIds];
    // Greedy without penalties: the device returns the argmax itself and no logits are read back.
    // Logprobs need the logits, so they turn the shortcut off (the same id either way).
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

  /** Whether accept() needs logits (false: the argmax id suffices). */
  get wantsLogits(): boolean {
    return !this.argmaxOnDevice;
  }

  /** Runs the prompt and picks the first token: promptInput() through the session, then acceptPrompt(). */
  prefill(): SequenceDelta {
    const input = this.promptInput();
    const t0 = performance.now();
    const logits = this.session.prefill(input);
    this.acceptPrompt(logits, (performance.now() - t0) / 1000);
    return this.takeDelta();
  }

  /**
   * The prompt ids the prefill runs (those after `heldPrefix`), for a caller that makes the model
   * call itself (a batched stepper packing several prompts into one); checks that the session
   * holds the prefix it was said to hold.
   */
  promptInput(): readonly number[] {
    if (this.prefilled) throw new InvalidArgumentError("prefill runs once, first");
    this.checkHeldPrefix();
    return this.heldPrefix > 0 ? this.promptIds.slice(this.heldPrefix) : this.promptIds;
  }

  /**
   * The result of the prompt's model call made by someone else: the logits after its last token,
   * and the seconds that call took (a shared call's whole time: this prompt waited for all of it).
   * Picks the first token (takeDelta() then has it).
   */
  acceptPrompt(logits: Float32Array, seconds: number): void {
    if (this.prefilled) throw new InvalidArgumentError("prefill runs once, first");
    this.prefilled = true;
    this.timings.promptSeconds = seconds;
    if (this.options.keepPromptLogits) this.promptLogits = logits.slice();
    this.decodeStart = performance.now();
    if (this.options.maxTokens === 0) this.finish("length");
    else this.consume(logits, undefined);
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
    if (this.pendingInput === undefined) throw new InvalidArgumentError("accept needs a prefilled sequence that is not done");
    this.timings.decodeTokens++;
    if ("greedyId" in output) this.consume(undefined, output.greedyId);
    else this.consume(output.logits, undefined);
  }

  /** What was produced since the last call (prefill() and step() return it themselves). */
  takeDelta(): SequenceDelta {
    const d = this.delta;
    this.delta = { text: "", tokens: [] };
    return d;
  }

  /** A reused session must hold exactly the prompt's first `heldPrefix` ids: anything else would be another conversation's cache. */
  private checkHeldPrefix(): void {
    if (this.heldPrefix === 0) return;
    const s = this.session;
    if (s.length !== this.heldPrefix) throw new InvalidArgumentError(`the session holds ${s.length} tokens, not the ${this.heldPrefix} of the prompt it was said to hold`);
    if (s.tokens && reusablePrefix(s.tokens, this.promptIds) < this.heldPrefix) throw new InvalidArgumentError(`the session's ${this.heldPrefix} tokens are not the prompt's first ${this.heldPrefix}`);
  }

  private consume(logits: Float32Array | undefined, greedyId: number | undefined): void {
    const token = greedyId !== undefined ? { id: greedyId } : this.pick(logits!);
    const id = token.id;
    if (id < 0) throw new InvalidArgumentError("no token can be chosen: every logit is NaN or -Infinity");
    this.ids.push(id);
    this.history.push(id);
    this.delta.tokens.push(token);
    this.pending = id;
    if (this.eos.has(id)) {
      this.stoppedBy = { eos: id };
      return this.finish("stop");
    }
    if (this.emit(this.stream.push(id))) return this.finish("stop");
    if (this.ids.length >= this.options.maxTokens || this.session.length >= this.session.ctx) this.finish("length");
  }

  private pick(logits: Float32Array): GeneratedToken {
    if (this.options.topLogprobs === undefined) return { id: this.sampler.sample(logits, this.history) };
    const s = this.sampler.sampleWithInfo(logits, this.history, { topLogprobs: this.options.topLogprobs });
    return { id: s.token, logprob: s.logprob, topLogprobs: s.topLogprobs };
  }

  /** Passes text through the stop strings; true when one completed (it is then `stoppedBy`). */
  private emit(text: string): boolean {
    const r = this.stops.push(text);
    this.release(r.text);
    if (r.stopped === undefined) return false;
    this.stoppedBy = { text: r.stopped };
    return true;
  }

  private release(text: string): void {
    if (!text) return;
    this.text += text;
    this.delta.text += text;
  }

  private finish(reason: FinishReason): void {
    if (this.stoppedBy === undefined || "eos" in this.stoppedBy) {
      // the detokenizer's held bytes may still complete a stop string; else the matcher's held tail is text
      if (this.emit(this.stream.flush())) reason = "stop";
      else this.release(this.stops.flush());
    }
    this.finishReason = reason;
    this.timings.decodeSeconds = (performance.now() - this.decodeStart) / 1000;
  }
}
