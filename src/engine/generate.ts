/**
 * The generation loop over a session: prefill the prompt, then sample, stream text and stop at an
 * EOS id, a stop string, the token limit or the context's end. A generator of text deltas, so a
 * CLI can print them and a server can stream them; the result carries ids, text and timings.
 */
import { InvalidArgumentError } from "../errors.ts";
import type { Model } from "../model/model.ts";
import type { Session } from "../model/session.ts";
import { Sampler } from "../sampling/sampler.ts";
import type { SamplingOptions } from "../sampling/options.ts";
import { StopStringMatcher } from "../sampling/stop.ts";
import { TokenTextStream } from "../tokenizer/stream.ts";

export type FinishReason = "stop" | "length";

export interface GenerateOptions {
  maxTokens: number;
  sampling?: SamplingOptions;
  /** Texts that end the generation; the stop text itself is not returned. */
  stop?: readonly string[];
  /** Stop at the model's EOS ids (default true). */
  stopAtEos?: boolean;
}

export interface GenerateResult {
  promptIds: number[];
  /** Generated ids, the EOS id that ended it included. */
  ids: number[];
  text: string;
  finishReason: FinishReason;
  /** Which stop ended it: an EOS id or a stop string. */
  stoppedBy?: { eos: number } | { text: string };
  seed: number;
  /** decodeSubmits: GPU submissions of the decode tokens (one per token resident, one per MoE layer per-layer, 0 on the CPU). */
  timings: { promptSeconds: number; decodeSeconds: number; promptTokens: number; decodeTokens: number; decodeSubmits: number };
  /** Logits after the last prompt token (a copy). */
  promptLogits: Float32Array;
}

/**
 * Runs a generation; yields text deltas as they become safe to print (UTF-8 complete and not a
 * possible start of a stop string); returns the result.
 */
export function* generate(model: Model, session: Session, promptIds: readonly number[], options: GenerateOptions): Generator<string, GenerateResult> {
  if (!Number.isInteger(options.maxTokens) || options.maxTokens < 0) throw new InvalidArgumentError(`maxTokens must be an integer >= 0, got ${options.maxTokens}`);
  const sampler = new Sampler(options.sampling);
  const tokenizer = model.tokenizer;
  const eos = new Set(options.stopAtEos === false ? [] : tokenizer.eosIds);
  const stream = new TokenTextStream(tokenizer);
  const stops = new StopStringMatcher(options.stop ?? []);
  const history: number[] = [...promptIds];
  const ids: number[] = [];
  let text = "";
  let finishReason: FinishReason = "length";
  let stoppedBy: GenerateResult["stoppedBy"];

  const t0 = performance.now();
  let logits = session.prefill(promptIds);
  const promptLogits = logits.slice();
  const t1 = performance.now();
  const submitsAfterPrompt = session.counts.submits;
  let decodeTokens = 0;
  const emit = function* (delta: string): Generator<string, boolean> {
    const r = stops.push(delta);
    if (r.text) {
      text += r.text;
      yield r.text;
    }
    if (r.stopped !== undefined) {
      stoppedBy = { text: r.stopped };
      return true;
    }
    return false;
  };
  // Greedy without penalties: the device returns the argmax itself, and no logits are read back.
  const argmaxOnDevice = sampler.argmaxOnly;
  let nextId: number | undefined;
  while (ids.length < options.maxTokens) {
    const id = nextId ?? sampler.sample(logits, history);
    if (id < 0) throw new InvalidArgumentError("no token can be chosen: every logit is NaN or -Infinity");
    ids.push(id);
    history.push(id);
    if (eos.has(id)) {
      finishReason = "stop";
      stoppedBy = { eos: id };
      break;
    }
    if (yield* emit(stream.push(id))) {
      finishReason = "stop";
      break;
    }
    if (ids.length >= options.maxTokens || session.length >= session.ctx) break;
    if (argmaxOnDevice) nextId = session.stepGreedy(id).id;
    else logits = session.step(id);
    decodeTokens++;
  }
  if (stoppedBy === undefined || "eos" in stoppedBy) {
    if (!(yield* emit(stream.flush()))) {
      const rest = stops.flush();
      if (rest) {
        text += rest;
        yield rest;
      }
    } else finishReason = "stop";
  }
  const t2 = performance.now();
  return {
    promptIds: [...promptIds],
    ids,
    text,
    finishReason,
    stoppedBy,
    seed: sampler.seed,
    timings: { promptSeconds: (t1 - t0) / 1000, decodeSeconds: (t2 - t1) / 1000, promptTokens: promptIds.length, decodeTokens, decodeSubmits: session.counts.submits - submitsAfterPrompt },
    promptLogits,
  };
}
