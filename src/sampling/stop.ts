/**
 * Streaming stop strings. Fed text deltas, it hands back what is safe to show now and holds back the longest
 * tail that could still grow into a stop string. When a stop string completes, the text before it is released,
 * the stop string and everything after it are not (OpenAI's `stop`), and the matcher is done.
 *
 * When several stop strings could complete, the one that completes first (ends earliest) wins, the longer one
 * on a tie: a streaming decision has to be made the moment a stop string is complete, so this is the only rule
 * under which the result does not depend on how the text was split into deltas.
 */
import { InvalidArgumentError } from "../errors.ts";

export interface StopResult {
  /** Text to emit now. */
  text: string;
  /** The stop string that completed; absent while none has. */
  stopped?: string;
}

export class StopStringMatcher {
  private readonly stops: readonly string[];
  private readonly longest: number;
  private held = "";
  private completed: string | undefined;

  constructor(stops: readonly string[]) {
    if (!Array.isArray(stops)) throw new InvalidArgumentError(`stop strings must be an array of strings, got ${String(stops)}`);
    for (const [i, stop] of stops.entries()) {
      if (typeof stop !== "string" || stop.length === 0) {
        throw new InvalidArgumentError(`stop[${i}] must be a non-empty string, got ${JSON.stringify(stop)}`);
      }
    }
    this.stops = [...new Set(stops)];
    this.longest = this.stops.reduce((n, stop) => Math.max(n, stop.length), 0);
  }

  /** The stop string that ended the text, if one has. */
  get stopped(): string | undefined {
    return this.completed;
  }

  /** Takes the next delta. Once a stop string has completed, further text is dropped. */
  push(delta: string): StopResult {
    if (this.completed !== undefined) return { text: "", stopped: this.completed };
    const text = this.held + delta;
    const match = this.firstCompleted(text);
    if (match !== null) {
      this.held = "";
      this.completed = match.stop;
      return { text: text.slice(0, match.start), stopped: match.stop };
    }
    const hold = this.partialTail(text);
    this.held = text.slice(text.length - hold);
    return { text: text.slice(0, text.length - hold) };
  }

  /** End of generation: releases the held tail (nothing if a stop string completed). */
  flush(): string {
    const text = this.held;
    this.held = "";
    return this.completed === undefined ? text : "";
  }

  private firstCompleted(text: string): { start: number; stop: string } | null {
    let best: { start: number; stop: string } | null = null;
    let bestEnd = Infinity;
    for (const stop of this.stops) {
      const start = text.indexOf(stop);
      if (start < 0) continue;
      const end = start + stop.length;
      if (end < bestEnd || (end === bestEnd && start < best!.start)) {
        best = { start, stop };
        bestEnd = end;
      }
    }
    return best;
  }

  /** Length of the longest tail of `text` that is a proper prefix of some stop string. */
  private partialTail(text: string): number {
    for (let length = Math.min(this.longest - 1, text.length); length > 0; length--) {
      const tail = text.slice(text.length - length);
      if (this.stops.some((stop) => stop.length > length && stop.startsWith(tail))) return length;
    }
    return 0;
  }
}
