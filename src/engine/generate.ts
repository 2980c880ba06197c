/**
 * The generation loop over a session: a Sequence (src/engine/sequence.ts) makes every decision
 * (sampling, EOS ids, stop strings, the token limit, the context's end); this drives it to the end.
 * A generator of text deltas, so a CLI can print them and a server can stream them; the result
 * carries ids, text and timings.
 */
import type { Model } from "../model/model.ts";
import type { Session } from "../model/session.ts";
import type { SamplingOptions } from "../sampling/options.ts";
import { Sequence, type FinishReason, type StoppedBy } from "./sequence.ts";

export type { FinishReason } from "./sequence.ts";

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
  stoppedBy?: StoppedBy;
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
  const sequence = new Sequence(model.tokenizer, session, promptIds, { ...options, keepPromptLogits: true });
  let delta = sequence.prefill();
  const submitsAfterPrompt = session.counts.submits;
  for (;;) {
    if (delta.text) yield delta.text;
    if (sequence.done) break;
    // greedy without penalties steps with the device's argmax (Session.stepGreedy): no logits read back
    delta = sequence.step();
  }
  return {
    promptIds: [...promptIds],
    ids: sequence.ids,
    text: sequence.text,
    finishReason: sequence.finishReason!,
    stoppedBy: sequence.stoppedBy,
    seed: sequence.seed,
    timings: { ...sequence.timings, promptTokens: promptIds.length, decodeSubmits: session.counts.submits - submitsAfterPrompt },
    promptLogits: sequence.promptLogits!,
  };
}
