/**
 * How one decode round advances the active sequences by a token each, and how the prompts of the
 * requests admitted between two rounds run. Round-robin makes one model call per sequence (the
 * reference); batched makes one call for every sequence on the server's SessionBatch
 * (Sequence.pendingInput -> batch.step -> accept / takeDelta), so each weight is read once a round
 * for all of them, and packs the new prompts into shared replays (Sequence.promptInput ->
 * batch.prefillMany -> acceptPrompt). Either way an engine error fails only the sequences of the
 * call that met it; each gets its error and the scheduler goes on.
 */
import { GRAPH_MAX_TOKENS } from "../graph/index.ts";
import type { Sequence, SequenceDelta } from "../engine/index.ts";
import { argmax } from "../sampling/select.ts";
import type { PrefillItem } from "../model/session-batch.ts";
import { BatchSlotSession, type SlotBatch } from "./batch-slots.ts";

export type StepResult = SequenceDelta | { error: unknown };

export interface DecodeRound {
  /** results[i] for sequences[i]: its delta, or the error it met. */
  results: StepResult[];
  /** Model calls the round made (for /metrics: sequences per call shows the batching). */
  modelCalls: number;
}

/** The prompts of newly admitted sequences: each one's first delta (or error), and the model calls made. */
export type PrefillRound = DecodeRound;

/** A decode round and new prompts run in the same model calls: each part's results, each counting the shared calls. */
export interface SharedRound {
  round: DecodeRound;
  prompts: PrefillRound;
}

export type StepperName = "batched" | "round-robin";

export interface DecodeStepper {
  readonly name: StepperName;
  step(sequences: readonly Sequence[]): DecodeRound;
  /** Runs the prompts of sequences not yet prefilled (each picks its first token). */
  prefill(sequences: readonly Sequence[]): PrefillRound;
  /**
   * A decode step of `decoding` and the prompts of `prompting` in shared model calls, where that
   * saves a call; undefined (nothing run) where it does not: then the caller runs them apart.
   */
  stepWithPrompts?(decoding: readonly Sequence[], prompting: readonly Sequence[]): SharedRound | undefined;
}

function stepAlone(s: Sequence): StepResult {
  try {
    return s.step();
  } catch (error) {
    return { error };
  }
}

function prefillAlone(s: Sequence): StepResult {
  try {
    return s.prefill();
  } catch (error) {
    return { error };
  }
}

/** One model call per sequence, in turn. */
export const roundRobinStepper: DecodeStepper = {
  name: "round-robin",
  step: (sequences) => ({ results: sequences.map(stepAlone), modelCalls: sequences.length }),
  prefill: (sequences) => ({ results: sequences.map(prefillAlone), modelCalls: sequences.length }),
};

/**
 * One batch.step for all sequences whose session is a slot of `batch` (in calls of at most a
 * replay's GRAPH_MAX_TOKENS), and one batch.prefillMany for all their prompts; a sequence on any
 * other session steps and prefills alone.
 */
export class BatchedStepper implements DecodeStepper {
  readonly name = "batched";

  constructor(private readonly batch: SlotBatch) {}

  step(sequences: readonly Sequence[]): DecodeRound {
    const results: StepResult[] = new Array(sequences.length);
    const onBatch: number[] = [];
    let modelCalls = 0;
    sequences.forEach((s, i) => {
      if (this.isOnBatch(s)) onBatch.push(i);
      else {
        results[i] = stepAlone(s);
        modelCalls++;
      }
    });
    for (let at = 0; at < onBatch.length; at += GRAPH_MAX_TOKENS) {
      const which = onBatch.slice(at, at + GRAPH_MAX_TOKENS);
      this.stepTogether(sequences, which, results);
      // one replay on the device; a batch on its sessions path (after a lost device) runs each slot in turn
      modelCalls += this.batch.path === "device-batch" ? 1 : which.length;
    }
    return { results, modelCalls };
  }

  prefill(sequences: readonly Sequence[]): PrefillRound {
    const results: StepResult[] = new Array(sequences.length);
    const packed: { at: number; slot: number; ids: readonly number[] }[] = [];
    let modelCalls = 0;
    sequences.forEach((s, i) => {
      let ids: readonly number[];
      try {
        ids = s.promptInput();
      } catch (error) {
        results[i] = { error }; // its own check (the held prefix): no model call, the others go on
        return;
      }
      // one that does not fit its context fails alone, with its own error, not the packed call
      if (this.isOnBatch(s) && s.session.length + ids.length <= s.session.ctx) packed.push({ at: i, slot: (s.session as BatchSlotSession).slot, ids });
      else {
        results[i] = prefillAlone(s);
        modelCalls++;
      }
    });
    if (packed.length === 0) return { results, modelCalls };
    let rows: Float32Array[];
    const t0 = performance.now();
    try {
      rows = this.batch.prefillMany(packed.map(({ slot, ids }) => ({ slot, ids })));
    } catch (error) {
      for (const p of packed) results[p.at] = { error };
      return { results, modelCalls: modelCalls + 1 };
    }
    const seconds = (performance.now() - t0) / 1000;
    const tokens = packed.reduce((n, p) => n + p.ids.length, 0);
    // replays of up to GRAPH_MAX_TOKENS tokens on the device; a batch on its sessions path runs each slot in turn
    modelCalls += this.batch.path === "device-batch" ? Math.ceil(tokens / GRAPH_MAX_TOKENS) : packed.length;
    packed.forEach((p, r) => {
      const s = sequences[p.at]!;
      try {
        s.acceptPrompt(rows[r]!, seconds);
        results[p.at] = s.takeDelta();
      } catch (error) {
        results[p.at] = { error };
      }
    });
    return { results, modelCalls };
  }

  /**
   * The round's tokens, then the new prompts, in one prefillMany (llama-server's mixed batches):
   * where they fit fewer replays together than apart, a gap's prompts cost no replay of their own
   * beside the round's. Only on the device path with every sequence on the batch, ready and in
   * its context (else undefined: the separate calls run them and report their errors).
   */
  stepWithPrompts(decoding: readonly Sequence[], prompting: readonly Sequence[]): SharedRound | undefined {
    if (this.batch.path !== "device-batch" || decoding.length === 0 || prompting.length === 0) return undefined;
    const items: PrefillItem[] = [];
    const fits = (s: Sequence, n: number) => this.isOnBatch(s) && s.session.length + n <= s.session.ctx;
    for (const s of decoding) {
      const id = s.pendingInput;
      if (id === undefined || !fits(s, 1)) return undefined;
      items.push({ slot: (s.session as BatchSlotSession).slot, ids: [id] });
    }
    let promptTokens = 0;
    for (const s of prompting) {
      let ids: readonly number[];
      try {
        ids = s.promptInput();
      } catch {
        return undefined;
      }
      if (!fits(s, ids.length)) return undefined;
      items.push({ slot: (s.session as BatchSlotSession).slot, ids });
      promptTokens += ids.length;
    }
    const replays = (n: number) => Math.ceil(n / GRAPH_MAX_TOKENS);
    const calls = replays(decoding.length + promptTokens);
    if (calls >= replays(decoding.length) + replays(promptTokens)) return undefined; // apart: the round's rows stay views, no copies
    const failAll = (n: number, error: unknown): DecodeRound => ({ results: Array.from({ length: n }, () => ({ error })), modelCalls: 1 });
    let rows: Float32Array[];
    const t0 = performance.now();
    try {
      rows = this.batch.prefillMany(items);
    } catch (error) {
      return { round: failAll(decoding.length, error), prompts: failAll(prompting.length, error) };
    }
    const seconds = (performance.now() - t0) / 1000;
    const modelCalls = this.batch.path === "device-batch" ? calls : items.length; // a device lost during the call: each slot in turn
    const results = (list: readonly Sequence[], offset: number, accept: (s: Sequence, row: Float32Array) => void): StepResult[] =>
      list.map((s, i) => {
        try {
          accept(s, rows[offset + i]!);
          return s.takeDelta();
        } catch (error) {
          return { error };
        }
      });
    return {
      round: { results: results(decoding, 0, (s, row) => s.accept(s.wantsLogits ? { logits: row } : { greedyId: argmax(row) })), modelCalls },
      prompts: { results: results(prompting, decoding.length, (s, row) => s.acceptPrompt(row, seconds)), modelCalls },
    };
  }

  private isOnBatch(s: Sequence): boolean {
    return s.session instanceof BatchSlotSession && s.session.batch === this.batch;
  }

  /** One call for the sequences at `which`; their rows are read before the next call (they are views). */
  private stepTogether(sequences: readonly Sequence[], which: number[], results: StepResult[]): void {
    let rows: Float32Array[];
    try {
      rows = this.batch.step(which.map((i) => {
        const s = sequences[i]!;
        const id = s.pendingInput;
        if (id === undefined) throw new RangeError("a batched step needs prefilled sequences that are not done");
        return { slot: (s.session as BatchSlotSession).slot, id };
      }));
    } catch (error) {
      for (const i of which) results[i] = { error };
      return;
    }
    which.forEach((i, r) => {
      const s = sequences[i]!;
      const row = rows[r]!;
      try {
        // greedy without logprobs takes the argmax id, as round-robin's stepGreedy does
        s.accept(s.wantsLogits ? { logits: row } : { greedyId: argmax(row) });
        results[i] = s.takeDelta();
      } catch (error) {
        results[i] = { error };
      }
    });
  }
}
