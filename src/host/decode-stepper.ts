/**
 * How one decode round advances the active sequences by a token each. Round-robin makes one model
 * call per sequence (the reference); batched makes one call for every sequence on the server's
 * SessionBatch (Sequence.pendingInput -> batch.step -> accept / takeDelta), so each weight is read
 * once a round for all of them. Either way an engine error fails only the sequences of the call
 * that met it; each gets its error and the scheduler goes on.
 */
import { GRAPH_MAX_TOKENS } from "../graph/index.ts";
import type { Sequence, SequenceDelta } from "../engine/index.ts";
import { argmax } from "../sampling/select.ts";
import { BatchSlotSession, type SlotBatch } from "./batch-slots.ts";

export type StepResult = SequenceDelta | { error: unknown };

export interface DecodeRound {
  /** results[i] for sequences[i]: its delta, or the error it met. */
  results: StepResult[];
  /** Model calls the round made (for /metrics: sequences per call shows the batching). */
  modelCalls: number;
}

export type StepperName = "batched" | "round-robin";

export interface DecodeStepper {
  readonly name: StepperName;
  step(sequences: readonly Sequence[]): DecodeRound;
}

function stepAlone(s: Sequence): StepResult {
  try {
    return s.step();
  } catch (error) {
    return { error };
  }
}

/** One model call per sequence, in turn. */
export const roundRobinStepper: DecodeStepper = {
  name: "round-robin",
  step: (sequences) => ({ results: sequences.map(stepAlone), modelCalls: sequences.length }),
};

/**
 * One batch.step for all sequences whose session is a slot of `batch` (in calls of at most a
 * replay's GRAPH_MAX_TOKENS); a sequence on any other session steps alone.
 */
export class BatchedStepper implements DecodeStepper {
  readonly name = "batched";

  constructor(private readonly batch: SlotBatch) {}

  step(sequences: readonly Sequence[]): DecodeRound {
    const results: StepResult[] = new Array(sequences.length);
    const onBatch: number[] = [];
    let modelCalls = 0;
    sequences.forEach((s, i) => {
      if (s.session instanceof BatchSlotSession && s.session.batch === this.batch) onBatch.push(i);
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
