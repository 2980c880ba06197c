/**
 * Several sequences decoding together (continuous batching): one KV cache of `slots` x ctx rows
 * per layer, sequence i's from row i * ctx, and one recorded replay per batch size S that runs S
 * tokens of any sequences at any positions through every layer at once (each weight read once
 * for all of them), their positions and cache rows read from mapped words the host writes. It
 * returns every token's logits. A prompt goes through the same replay as a batch of one
 * sequence's consecutive tokens. Batches run one at a time on the graph's scratch, as sequences do.
 */
import { InvalidArgumentError } from "../errors.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import { DeviceLostError } from "../vk/errors.ts";
import { Buffer } from "../vk/memory.ts";
import { Fence, Submission } from "../vk/sync.ts";
import { GRAPH_MAX_TOKENS, openSequenceCache, type BatchOutputs, type DecodeGraph, type SequenceCache } from "./decode-graph.ts";
import { GraphUnsupportedError } from "./errors.ts";
import { fenceWaitMode, ReplayWaiter } from "./replay-wait.ts";

/** One token of a batch: sequence `slot`'s token `id` at `position` (its keys and values go to that row). */
export interface BatchEntry {
  slot: number;
  id: number;
  position: number;
}

export class GraphBatch implements Disposable {
  readonly slots: number;
  readonly ctx: number;
  /** Bytes of the KV cache in device memory (every slot). */
  readonly cacheBytes: number;
  private readonly cache: SequenceCache;
  private readonly outputs: BatchOutputs;
  private readonly logitsView: Float32Array;
  private readonly owned = new DisposableStack();
  private readonly commands: CommandPool;
  private readonly fence: Fence;
  private readonly waiter: ReplayWaiter;
  /** Recordings by S. */
  private readonly recorded: ({ cb: CommandBuffer; submission: Submission } | undefined)[] = [];
  private disposed = false;
  private readonly ids = new Uint32Array(GRAPH_MAX_TOKENS);
  private readonly positions = new Uint32Array(GRAPH_MAX_TOKENS);
  private readonly rows = new Uint32Array(GRAPH_MAX_TOKENS);

  constructor(private readonly graph: DecodeGraph, slots: number, ctx: number) {
    if (!graph.stage) throw new GraphUnsupportedError("a batch needs every expert resident (the graph runs split)");
    if (!Number.isInteger(slots) || slots < 1) throw new InvalidArgumentError(`slots must be a positive integer, got ${slots}`);
    if (!Number.isInteger(ctx) || ctx < 1) throw new InvalidArgumentError(`ctx must be a positive integer, got ${ctx}`);
    this.slots = slots;
    this.ctx = ctx;
    const device = graph.device, V = graph.cfg.vocab;
    try {
      const buf = (bytes: number, memory: "device" | "readback" = "device") => this.owned.use(new Buffer(device, { size: BigInt(Math.ceil(bytes / 16) * 16), memory, priority: 1 }));
      this.cache = openSequenceCache(graph, slots, ctx, this.owned);
      this.cacheBytes = this.cache.bytes;
      this.outputs = { logits: buf(4 * GRAPH_MAX_TOKENS * V), logitsHost: buf(4 * GRAPH_MAX_TOKENS * V, "readback") };
      this.logitsView = new Float32Array(this.outputs.logitsHost.host(), 0, GRAPH_MAX_TOKENS * V);
      this.commands = this.owned.use(new CommandPool(device));
      this.fence = this.owned.use(new Fence(device));
      this.waiter = new ReplayWaiter(this.fence, fenceWaitMode(device));
      graph.liveBatches.add(this);
    } catch (e) {
      this.owned.dispose();
      throw e;
    }
  }

  /**
   * Runs 1..GRAPH_MAX_TOKENS tokens in one replay: one submit, one wait. Returns their logits,
   * [S][vocab] in host memory (valid until the next run). Throws DeviceLostError when the device is lost.
   */
  run(entries: readonly BatchEntry[]): Float32Array {
    if (this.disposed) throw new InvalidArgumentError("this batch (or its model) is disposed");
    const S = entries.length;
    if (S < 1 || S > GRAPH_MAX_TOKENS) throw new InvalidArgumentError(`a batch runs 1..${GRAPH_MAX_TOKENS} tokens, got ${S}`);
    entries.forEach((e, t) => {
      if (!Number.isInteger(e.slot) || e.slot < 0 || e.slot >= this.slots) throw new InvalidArgumentError(`slot ${e.slot} is outside 0..${this.slots - 1}`);
      if (!Number.isInteger(e.position) || e.position < 0 || e.position >= this.ctx) throw new InvalidArgumentError(`position ${e.position} is outside the context 0..${this.ctx - 1}`);
      this.ids[t] = e.id;
      this.positions[t] = e.position;
      this.rows[t] = e.slot * this.ctx + e.position;
    });
    this.graph.writeBatchInput(this.ids.subarray(0, S), this.positions, this.rows);
    const r = this.recording(S);
    const done = this.waiter.run(r.submission);
    if (!done) throw new Error("decode graph: the GPU did not finish a batch within the timeout");
    if (this.graph.injectDeviceLost) {
      this.graph.injectDeviceLost = false;
      throw new DeviceLostError("vkWaitForFences (injected)");
    }
    return this.logitsView.subarray(0, S * this.graph.cfg.vocab);
  }

  private recording(S: number) {
    let r = this.recorded[S];
    if (!r) {
      const cb = this.commands.allocate().begin();
      this.graph.recordRange(cb, this.cache, S, { first: 0, end: this.graph.cfg.layers, start: true, split: false, batch: this.outputs });
      cb.end();
      this.recorded[S] = r = { cb, submission: this.owned.use(new Submission(this.graph.device, [cb], { fence: this.fence })) };
    }
    return r;
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    try {
      this.graph.device.waitIdle();
    } catch {
      // a lost device: destroying is still valid
    }
    this.recorded.length = 0;
    this.owned.dispose();
    this.graph.liveBatches.delete(this);
  }
}
