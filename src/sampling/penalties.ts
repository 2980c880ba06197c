/**
 * Repetition penalties over the last tokens of the history, as llama.cpp's `penalties` sampler applies them:
 * for each distinct token t seen `count` times in the window,
 *   logit_t = logit_t <= 0 ? logit_t * repeat : logit_t / repeat        (repeatPenalty; CTRL's, sign-aware)
 *   logit_t -= frequency * count + presence * (count > 0)                (OpenAI's frequency/presence penalties)
 */
import { InvalidArgumentError } from "../errors.ts";

export interface PenaltySettings {
  repeatPenalty: number;
  presencePenalty: number;
  frequencyPenalty: number;
  /** How many of the last history tokens count: -1 = all of them, 0 = none. */
  repeatLastN: number;
}

export function penaltiesActive(settings: PenaltySettings): boolean {
  return settings.repeatLastN !== 0 && (settings.repeatPenalty !== 1 || settings.presencePenalty !== 0 || settings.frequencyPenalty !== 0);
}

/** Index of the first history token inside the penalty window. */
export function windowStart(historyLength: number, repeatLastN: number): number {
  if (repeatLastN === -1) return 0;
  return Math.max(0, historyLength - repeatLastN);
}

/**
 * Writes `logits` with the penalties applied into `out` and returns it. `counts` is a zeroed per-token
 * scratch array as long as the vocabulary; it is zeroed again on return, so the caller can keep reusing it
 * (the work is O(vocab) for the copy plus O(window), with no allocation).
 */
export function applyPenalties(
  logits: Float32Array,
  history: ArrayLike<number>,
  settings: PenaltySettings,
  out: Float32Array,
  counts: Uint32Array,
): Float32Array {
  const vocab = logits.length;
  out.set(logits);
  if (!penaltiesActive(settings)) return out;
  const start = windowStart(history.length, settings.repeatLastN);
  for (let i = start; i < history.length; i++) {
    const token = history[i];
    if (!(Number.isInteger(token) && token >= 0 && token < vocab)) {
      for (let j = start; j < i; j++) counts[history[j]] = 0; // leave the scratch clean for the next call
      throw new InvalidArgumentError(`history[${i}] = ${token} is not a token id in [0, ${vocab - 1}]`);
    }
    counts[token]++;
  }
  const { repeatPenalty, presencePenalty, frequencyPenalty } = settings;
  for (let i = start; i < history.length; i++) {
    const token = history[i];
    const count = counts[token];
    if (count === 0) continue; // a repeat of a token already penalized
    counts[token] = 0;
    let logit = out[token];
    logit = logit <= 0 ? logit * repeatPenalty : logit / repeatPenalty;
    out[token] = logit - (frequencyPenalty * count + presencePenalty);
  }
  return out;
}
