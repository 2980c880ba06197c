/**
 * What a Session needs of a CPU decoder, whatever the architecture: a fresh per-sequence state,
 * and a forward pass of a chunk of up to MAX_CHUNK tokens over it. Qwen3-MoE's state is its KV
 * cache (it can drop its last tokens); Qwen3.5's also holds recurrent and conv states, which
 * cannot be rewound, so a session truncating one runs the kept tokens again from a reset state.
 */
import type { DecoderObserver } from "./decoder.ts";
import type { ExpertRunner } from "./experts.ts";

export interface DecoderState {
  /** Positions filled (the next token goes here). */
  length: number;
  readonly bytes: number;
  /** Back to an empty sequence. */
  reset(): void;
}

export interface CpuDecoder {
  readonly experts: ExpertRunner;
  /** Whether `state.length = keep` drops the tokens after keep (false: reset and run them again). */
  readonly rewindable: boolean;
  newState(ctx: number, precision: "f32" | "f16"): DecoderState;
  /**
   * Runs `ids` (1..MAX_CHUNK tokens) at positions state.length.. and appends them. Logits of the
   * last `logitRows` tokens (0: none) go to `logits` [logitRows, vocab].
   */
  forward(ids: ArrayLike<number>, state: DecoderState, logitRows: number, logits: Float32Array | undefined, observer?: DecoderObserver): void;
}
