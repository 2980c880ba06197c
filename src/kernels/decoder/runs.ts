/**
 * The runs table of a batched linear-attention call (shaders/dec_runs.glsl): a batch's tokens
 * grouped by sequence, so that dec_conv1d and dec_delta_rule walk each sequence's tokens in order
 * on that sequence's state, with one workgroup row per sequence (runs in parallel, each run's
 * tokens sequential: the recurrence only orders tokens of one sequence).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { Buffer } from "../../vk/memory.ts";
import { checkRange } from "./common.ts";

/** The most tokens (and so runs) one call takes. */
export const RUNS_MAX_TOKENS = 64;
/** Words of the table: state index, first list position and count of each run, then the token list. */
export const RUN_WORDS = 4 * RUNS_MAX_TOKENS;
const RUN_STATE = 0, RUN_FIRST = RUNS_MAX_TOKENS, RUN_COUNT = 2 * RUNS_MAX_TOKENS, RUN_TOKENS = 3 * RUNS_MAX_TOKENS;

/** A batched call's runs: the table (RUN_WORDS words at element 0 of `table`) and its sequences' states. */
export interface RunsBinding {
  table: Buffer;
  /** Floats between consecutive sequences' states in the state buffer. */
  stateStride: number;
  /** Sequences whose states the buffer holds (state indices 0..states − 1). */
  states: number;
}

/** Throws unless `runs` is a usable binding for states of `stateFloats` floats from `stateOffset` in `state`. */
export function checkRuns(what: string, runs: RunsBinding, state: Buffer, stateOffset: number, stateFloats: number): void {
  checkRange(`${what} runs table`, runs.table, 0, RUN_WORDS);
  if (!Number.isInteger(runs.states) || runs.states < 1) throw new InvalidArgumentError(`${what}: states must be a positive integer, got ${runs.states}`);
  if (!Number.isInteger(runs.stateStride) || (runs.states > 1 && runs.stateStride < stateFloats)) throw new InvalidArgumentError(`${what}: a state stride of ${runs.stateStride} floats overlaps states of ${stateFloats}`);
  checkRange(`${what} state`, state, stateOffset + (runs.states - 1) * runs.stateStride, stateFloats);
}

/**
 * Writes the runs of S tokens whose state indices are `stateOf[0..S)` into `words` (a mapped
 * table of RUN_WORDS words): one run per distinct index, in order of first appearance, listing
 * its tokens in entry order; the rows past the last run get count 0. Returns the run count.
 */
export function writeRuns(words: Uint32Array, stateOf: ArrayLike<number>, S: number): number {
  if (!Number.isInteger(S) || S < 1 || S > RUNS_MAX_TOKENS) throw new InvalidArgumentError(`a batched call runs 1..${RUNS_MAX_TOKENS} tokens, got ${S}`);
  if (words.length < RUN_WORDS) throw new InvalidArgumentError(`the runs table needs ${RUN_WORDS} words, got ${words.length}`);
  const runOf = new Map<number, number>(), counts: number[] = [];
  for (let t = 0; t < S; t++) {
    const s = stateOf[t]!;
    let r = runOf.get(s);
    if (r === undefined) {
      runOf.set(s, (r = counts.length));
      counts.push(0);
      words[RUN_STATE + r] = s;
    }
    counts[r]!++;
  }
  let at = 0;
  const next: number[] = [];
  counts.forEach((n, r) => {
    words[RUN_FIRST + r] = at;
    words[RUN_COUNT + r] = n;
    next.push(at);
    at += n;
  });
  for (let r = counts.length; r < RUNS_MAX_TOKENS; r++) words[RUN_COUNT + r] = 0;
  for (let t = 0; t < S; t++) words[RUN_TOKENS + next[runOf.get(stateOf[t]!)!]!++] = t;
  return counts.length;
}
