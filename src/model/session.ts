/**
 * One sequence's state over a loaded model: its KV cache and position. `prefill(ids)` runs a prompt
 * and `step(id)` one token; each returns the next token's logits (a view reused by the next call).
 *
 * Where the model runs the whole token on the GPU ("resident" mode) the session holds a device
 * sequence (an f16 KV cache in device memory, one submit per token); otherwise the CPU decoder
 * runs chunks of up to 64 tokens with the experts per layer. A device lost mid-generation moves
 * the session to the CPU path: the tokens so far are run again there, with one line.
 */
import type { DeviceDecoder, DeviceSequence } from "../graph/index.ts";
import { deviceLostError, GRAPH_MAX_TOKENS, isDeviceLost } from "../graph/index.ts";
import type { CpuDecoder, DecoderState } from "./cpu-decoder.ts";
import { Decoder, MAX_CHUNK, type DecoderObserver } from "./decoder.ts";
import { HybridDecoder } from "./hybrid-decoder.ts";
import type { ModelConfig } from "./model-config.ts";
import { InvalidArgumentError, VkmoeError } from "../errors.ts";
import { ContextLengthError } from "./errors.ts";
import { argmax } from "../sampling/select.ts";

export interface SessionOptions {
  /** Context length in tokens (prompt + generation); default min(4096, the model's maximum). */
  ctx?: number;
  /** Time each device token with GPU timestamps (benchmarks). */
  timing?: boolean;
  /**
   * The CPU decoder's KV cache: "f32" (default), or "f16", rounding as the GPU's f16 cache does
   * (tests: the CPU decoder as the whole-token GPU path's exact oracle). The device path is f16.
   */
  cpuCache?: "f32" | "f16";
}

/** Where a session's tokens run: the whole token on the GPU, or the CPU decoder (experts per layer). */
export type SessionPath = "device" | "cpu-decoder";

export class Session implements Disposable {
  readonly ctx: number;
  /** The CPU decoder's state of this sequence (its KV cache; Qwen3.5's recurrent states too). */
  private kv: DecoderState | undefined;
  private readonly cpuCache: "f32" | "f16";
  private device: DeviceSequence | undefined;
  private readonly logits: Float32Array;
  /** Taps for tests and debugging (per-layer hidden states on the CPU decoder; routing on both). */
  observer: DecoderObserver | undefined;
  /** The token ids the cache holds, in order. */
  readonly tokens: number[] = [];
  /**
   * Tokens run, GPU submits made (one per replay on the device path; one per MoE layer call on the
   * CPU decoder with GPU experts) and the replays' GPU µs summed (a session opened with timing).
   */
  readonly counts = { tokens: 0, submits: 0, gpuUs: 0 };

  constructor(
    private readonly decoder: CpuDecoder,
    readonly config: ModelConfig,
    options: SessionOptions = {},
    deviceDecoder?: DeviceDecoder,
    private readonly log: (line: string) => void = (line) => console.error(line),
    /** Told when the device is lost (the model drops its GPU paths). */
    private readonly onDeviceLost: (why: string) => void = () => {},
    /** GPU submissions the experts make per chunk of tokens (one per MoE layer while they run on the GPU). */
    private readonly moeCallsPerChunk: () => number = () => 0,
  ) {
    const ctx = options.ctx ?? Math.min(4096, config.maxPositions);
    if (!Number.isInteger(ctx) || ctx < 1) throw new ContextLengthError(`context length must be a positive integer, got ${ctx}`);
    if (ctx > config.maxPositions) throw new ContextLengthError(`context length ${ctx} exceeds the model's maximum of ${config.maxPositions} tokens`);
    this.ctx = ctx;
    this.cpuCache = options.cpuCache ?? "f32";
    if (deviceDecoder) {
      // split runs route through the CPU decoder's routeAndRun (Qwen3-MoE's, Qwen3.5's)
      const router = decoder instanceof Decoder || decoder instanceof HybridDecoder ? decoder : undefined;
      if (deviceDecoder.mode === "split" && !router) throw new InvalidArgumentError(`the split GPU graph does not run ${config.architecture}`);
      try {
        // split runs (experts not all resident): the host routes and runs each layer's experts
        const hostExperts = deviceDecoder.mode === "split"
          ? (l: number, xn: Float32Array, logits: Float32Array, S: number, y: Float32Array) => {
            router!.routeAndRun(l, xn, logits, S, y, this.observer);
            // the MoE layer met a lost device (and went on on the CPU, silently): so did the graph
            if (this.decoder.experts.mode === "cpu") throw deviceLostError("the MoE layer's wait");
          }
          : undefined;
        this.device = deviceDecoder.sequence(ctx, { timing: options.timing, hostExperts });
      } catch (e) {
        if (!(e instanceof VkmoeError)) throw e;
        const mb = (2 * config.layers * ctx * config.kvHeads * config.headDim * 2) / 2 ** 20;
        throw new ContextLengthError(`a context of ${ctx} tokens needs a ${mb.toFixed(0)} MiB KV cache in device memory, which this device cannot give (${e.message}); lower --ctx`);
      }
    }
    else this.kv = decoder.newState(ctx, this.cpuCache);
    this.logits = new Float32Array(config.vocab);
  }

  get path(): SessionPath {
    return this.device ? "device" : "cpu-decoder";
  }

  get length(): number {
    return this.tokens.length;
  }

  /** Bytes of the KV cache (device memory on the device path). */
  get cacheBytes(): number {
    return this.device ? this.device.cacheBytes : this.kv!.bytes;
  }

  /** GPU µs of the last device token (with `timing`), 0 on the CPU decoder. */
  get lastGpuUs(): number {
    return this.device?.lastGpuUs ?? 0;
  }

  /** Dispatches per decode token on the device path (0 on the CPU decoder). */
  get dispatchesPerToken(): number {
    return this.device ? this.device.dispatchesOf("logits") : 0;
  }

  /** Runs `ids` after what the session holds; returns the logits after the last one. */
  prefill(ids: ArrayLike<number>): Float32Array {
    if (ids.length === 0) throw new ContextLengthError("prefill needs at least one token");
    this.checkRoom(ids.length);
    this.checkIds(ids);
    if (this.device) {
      // chunks of up to maxChunk tokens a replay, each weight read once per chunk
      const r = this.onDevice(ids, this.device.maxChunk ?? GRAPH_MAX_TOKENS, (d, i, n, pos) => d.runTokens(Array.prototype.slice.call(ids, i, i + n) as number[], pos, i + n === ids.length ? "logits" : "none").logits);
      if (r) return r;
    }
    this.onCpu(ids, (i, n) => (i + n === ids.length ? { rows: 1, into: this.logits } : undefined));
    return this.logits;
  }

  /** Runs one token; returns the logits after it. */
  step(id: number): Float32Array {
    return this.prefill([id]);
  }

  /**
   * Runs one token and returns the greedy next id (and its logit) without reading the logits back
   * on the device path; the CPU decoder takes the sampler's argmax of its logits (ties: the lowest id;
   * -1 when every logit is NaN or -Infinity, as on the device).
   */
  stepGreedy(id: number): { id: number; value: number } {
    this.checkRoom(1);
    this.checkIds([id]);
    if (this.device) {
      const r = this.onDevice([id], 1, (d, _i, _n, pos) => d.run(id, pos, "argmax"));
      if (r) return { id: r.id!, value: r.value! };
    }
    const logits = this.prefill([id]);
    const best = argmax(logits);
    return { id: best, value: best < 0 ? -Infinity : logits[best]! };
  }

  /**
   * Profiling (device path only): runs one token through a recording with a timestamp after every
   * op and returns each op's GPU µs, in order; the token joins the session as a step would.
   */
  profileStep(id: number): { op: string; us: number }[] {
    return this.profileChunk([id]);
  }

  /** As profileStep for a prompt chunk of 1..maxChunk tokens in one replay. */
  profileChunk(ids: readonly number[]): { op: string; us: number }[] {
    if (!this.device) throw new InvalidArgumentError(`profiling needs the whole token on the GPU (this session runs on the ${this.path})`);
    this.checkRoom(ids.length);
    this.checkIds(ids);
    const split = this.device.profile(ids, this.tokens.length, "argmax");
    this.tokens.push(...ids);
    this.counts.tokens += ids.length;
    this.counts.submits++;
    return split;
  }

  /** Logits of every position of `ids` (tests: top-k per position), [ids.length, vocab]. */
  prefillAll(ids: ArrayLike<number>): Float32Array {
    this.checkRoom(ids.length);
    this.checkIds(ids);
    const V = this.config.vocab;
    const out = new Float32Array(ids.length * V);
    if (this.device) {
      const done = this.onDevice(ids, 1, (d, i, _n, pos) => {
        out.set(d.run(ids[i]!, pos, "logits").logits!, i * V);
        return true;
      });
      if (done) return out;
    }
    this.onCpu(ids, (i, n) => ({ rows: n, into: out.subarray(i * V, (i + n) * V) }));
    return out;
  }

  /**
   * Runs `ids` on the CPU decoder in chunks of up to MAX_CHUNK tokens, appending them to the
   * session; `logits(first, count)` says where a chunk's logits go (its last `rows` tokens), if
   * anywhere. `replay` (after a lost device): the tokens are not counted again, no observer.
   */
  private onCpu(ids: ArrayLike<number>, logits: (first: number, count: number) => { rows: number; into: Float32Array } | undefined, replay = false): void {
    for (let i = 0; i < ids.length; i += MAX_CHUNK) {
      const chunk = Array.prototype.slice.call(ids, i, Math.min(ids.length, i + MAX_CHUNK)) as number[];
      const out = logits(i, chunk.length);
      this.decoder.forward(chunk, this.kv!, out?.rows ?? 0, out?.into, replay ? undefined : this.observer);
      for (const id of chunk) this.tokens.push(id);
      if (replay) continue;
      this.counts.tokens += chunk.length;
      this.counts.submits += this.moeCallsPerChunk();
    }
  }

  /**
   * Runs `ids` on the device in chunks of up to `chunk` tokens, one submit each (`run(d, first,
   * count, position)`); returns the last result. On a lost device the session moves to the CPU
   * decoder (the tokens before this call run again there) and returns undefined: the caller then
   * runs `ids` on the CPU path.
   */
  private onDevice<T>(ids: ArrayLike<number>, chunk: number, run: (d: DeviceSequence, first: number, count: number, position: number) => T): T | undefined {
    const d = this.device!;
    const start = this.tokens.length;
    let result: T | undefined;
    try {
      if (this.observer?.hidden) throw new InvalidArgumentError("hidden-state observers need the CPU decoder (VKMOE_GRAPH=off)");
      for (let i = 0; i < ids.length; i += chunk) {
        const n = Math.min(chunk, ids.length - i);
        result = run(d, i, n, start + i);
        for (let j = i; j < i + n; j++) this.tokens.push(ids[j]!);
        this.counts.tokens += n;
        this.counts.submits += d.submitsPerRun + this.splitExpertSubmits();
        this.counts.gpuUs += d.lastGpuUs;
        if (this.observer?.routing && d.submitsPerRun === 1) this.reportRouting(d, n); // split runs report through routeAndRun
      }
      return result;
    } catch (e) {
      if (!isDeviceLost(e)) {
        this.tokens.length = start; // the failed call's tokens are not in the cache
        throw e;
      }
      this.toCpu(start);
      return undefined;
    }
  }

  /** A split run's expert calls: one per MoE layer while the experts run on the GPU. */
  private splitExpertSubmits(): number {
    return this.device && this.device.submitsPerRun > 1 ? this.moeCallsPerChunk() : 0;
  }

  private reportRouting(d: DeviceSequence, S: number): void {
    const k = this.config.topK, chosen = d.lastRouting(), per = (d.maxChunk ?? GRAPH_MAX_TOKENS) * k;
    this.config.moeLayers.forEach((moe, l) => {
      if (moe) this.observer!.routing!(l, chosen.subarray(l * per, l * per + S * k), S, k);
    });
  }

  /** After a lost device: the first `keep` tokens run again on the CPU decoder, which holds the session from now on. */
  private toCpu(keep: number): void {
    this.log(`vkmoe: device lost; continuing on the CPU path (${keep} tokens run again there)`);
    try {
      this.device?.[Symbol.dispose]();
    } catch {
      // the device is gone: nothing more to free
    }
    this.device = undefined;
    this.onDeviceLost("device lost");
    const tokens = this.tokens.slice(0, keep);
    this.tokens.length = 0;
    this.kv = this.decoder.newState(this.ctx, this.cpuCache);
    this.onCpu(tokens, () => undefined, true);
  }

  /** Drops everything after the first `keep` tokens (a chat turn reuses its shared prefix). */
  truncate(keep = 0): void {
    if (keep < 0 || keep > this.tokens.length) throw new ContextLengthError(`cannot keep ${keep} of ${this.tokens.length} tokens`);
    if (this.device && this.device.rewindable === false && keep < this.tokens.length) {
      // as on the CPU below: the device's recurrent states start over and the kept tokens run again
      const kept = this.tokens.slice(0, keep);
      const counts = { ...this.counts };
      this.tokens.length = 0;
      try {
        this.device.reset!();
      } catch (e) {
        if (!isDeviceLost(e)) throw e;
        this.toCpu(0);
      }
      if (this.device && kept.length > 0) this.onDevice(kept, this.device.maxChunk ?? GRAPH_MAX_TOKENS, (d, i, n, pos) => d.runTokens(kept.slice(i, i + n), pos, "none"));
      if (this.device) {
        Object.assign(this.counts, counts); // a re-run, not new tokens
        return;
      }
      // the device was lost on the way: onDevice moved the session to the CPU (empty); run the kept tokens there
      this.onCpu(kept, () => undefined, true);
      return;
    }
    if (this.kv && !this.decoder.rewindable && keep < this.tokens.length) {
      // recurrent states cannot drop tokens: the kept ones run again from an empty state
      const kept = this.tokens.slice(0, keep);
      this.kv.reset();
      this.tokens.length = 0;
      this.onCpu(kept, () => undefined, true);
      return;
    }
    if (this.kv) this.kv.length = keep;
    this.tokens.length = keep;
  }

  private checkRoom(n: number): void {
    if (this.tokens.length + n > this.ctx) {
      throw new ContextLengthError(`${this.tokens.length + n} tokens do not fit the context of ${this.ctx} (${this.tokens.length} held, ${n} more); raise --ctx (model maximum ${this.config.maxPositions})`);
    }
  }

  private checkIds(ids: ArrayLike<number>): void {
    checkTokenIds(ids, this.config.vocab);
  }

  [Symbol.dispose](): void {
    this.device?.[Symbol.dispose]();
    this.device = undefined;
  }
}

/** Throws InvalidArgumentError naming the first id outside the vocabulary 0..V-1. */
export function checkTokenIds(ids: ArrayLike<number>, V: number): void {
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    if (!Number.isInteger(id) || id < 0 || id >= V) throw new InvalidArgumentError(`token id ${id} at ${i} is outside the vocabulary 0..${V - 1}`);
  }
}
