/**
 * One sequence's state over a loaded model: its KV cache and position. `prefill(ids)` runs a prompt
 * (in chunks of up to 64 tokens, through the same layer calls as decode) and `step(id)` one token;
 * each returns the next token's logits (a view reused by the next call).
 */
import type { Qwen3MoeConfig } from "./config.ts";
import { Decoder, MAX_CHUNK, type DecoderObserver } from "./decoder.ts";
import { InvalidArgumentError } from "../errors.ts";
import { ContextLengthError } from "./errors.ts";
import { KvCache } from "./kv-cache.ts";

export interface SessionOptions {
  /** Context length in tokens (prompt + generation); default min(4096, the model's maximum). */
  ctx?: number;
}

export class Session {
  readonly ctx: number;
  private readonly kv: KvCache;
  private readonly logits: Float32Array;
  /** Taps for tests and debugging (per-layer hidden states, routing). */
  observer: DecoderObserver | undefined;
  /** The token ids the cache holds, in order. */
  readonly tokens: number[] = [];

  constructor(private readonly decoder: Decoder, readonly config: Qwen3MoeConfig, options: SessionOptions = {}) {
    const ctx = options.ctx ?? Math.min(4096, config.maxPositions);
    if (!Number.isInteger(ctx) || ctx < 1) throw new ContextLengthError(`context length must be a positive integer, got ${ctx}`);
    if (ctx > config.maxPositions) throw new ContextLengthError(`context length ${ctx} exceeds the model's maximum of ${config.maxPositions} tokens`);
    this.ctx = ctx;
    this.kv = new KvCache(config.layers, ctx, config.kvHeads, config.headDim);
    this.logits = new Float32Array(config.vocab);
  }

  get length(): number {
    return this.kv.length;
  }

  /** Bytes of the KV cache. */
  get cacheBytes(): number {
    return this.kv.bytes;
  }

  /** Runs `ids` after what the session holds; returns the logits after the last one. */
  prefill(ids: ArrayLike<number>): Float32Array {
    if (ids.length === 0) throw new ContextLengthError("prefill needs at least one token");
    this.checkRoom(ids.length);
    this.checkIds(ids);
    for (let i = 0; i < ids.length; i += MAX_CHUNK) {
      const chunk = Array.prototype.slice.call(ids, i, Math.min(ids.length, i + MAX_CHUNK)) as number[];
      const last = i + MAX_CHUNK >= ids.length;
      this.decoder.forward(chunk, this.kv, last ? 1 : 0, last ? this.logits : undefined, this.observer);
      for (const id of chunk) this.tokens.push(id);
    }
    return this.logits;
  }

  /** Runs one token; returns the logits after it. */
  step(id: number): Float32Array {
    return this.prefill([id]);
  }

  /** Logits of every position of `ids` (tests: top-k per position), [ids.length, vocab]. */
  prefillAll(ids: ArrayLike<number>): Float32Array {
    this.checkRoom(ids.length);
    this.checkIds(ids);
    const V = this.config.vocab;
    const out = new Float32Array(ids.length * V);
    for (let i = 0; i < ids.length; i += MAX_CHUNK) {
      const chunk = Array.prototype.slice.call(ids, i, Math.min(ids.length, i + MAX_CHUNK)) as number[];
      this.decoder.forward(chunk, this.kv, chunk.length, out.subarray(i * V, (i + chunk.length) * V), this.observer);
      for (const id of chunk) this.tokens.push(id);
    }
    return out;
  }

  /** Drops everything after the first `keep` tokens (a chat turn reuses its shared prefix). */
  truncate(keep = 0): void {
    if (keep < 0 || keep > this.kv.length) throw new ContextLengthError(`cannot keep ${keep} of ${this.kv.length} tokens`);
    this.kv.length = keep;
    this.tokens.length = keep;
  }

  private checkRoom(n: number): void {
    if (this.kv.length + n > this.ctx) {
      throw new ContextLengthError(`${this.kv.length + n} tokens do not fit the context of ${this.ctx} (${this.kv.length} held, ${n} more); raise --ctx (model maximum ${this.config.maxPositions})`);
    }
  }

  private checkIds(ids: ArrayLike<number>): void {
    const V = this.config.vocab;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (!Number.isInteger(id) || id < 0 || id >= V) throw new InvalidArgumentError(`token id ${id} at ${i} is outside the vocabulary 0..${V - 1}`);
    }
  }
}
