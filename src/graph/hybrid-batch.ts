/**
 * Several Qwen3.5 sequences decoding together on the GPU (continuous batching, as GraphBatch is
 * for Qwen3-MoE): one KV cache of `slots` x ctx rows per full layer (sequence i's from row i · ctx)
 * and `slots` conv and recurrent states per linear layer, and one recorded replay per batch size
 * S that runs S tokens of any sequences through every layer at once: the dense matrices, the
 * router, the experts, attention and lm_head once over all S tokens (each weight read once for
 * all of them), every token's logits back. The host writes each token's position and cache row
 * (the positions words) and groups the tokens by sequence (the runs table, kernels/decoder/runs.ts):
 * dec_conv1d and dec_delta_rule run a workgroup row per sequence, each walking its own tokens in
 * entry order on its own states, so a decode round of S sequences is S independent recurrences
 * side by side, and a prompt chunk packed with other sequences' decode tokens stays in order.
 *
 * The recurrent states cannot drop tokens (`rewindable: false`): the batch counts what each slot's
 * states hold and takes a slot's next tokens only at the positions that follow; a slot starts
 * over from reset(slot) (its states zeroed; its cache rows are overwritten as it grows again).
 * Batches run one at a time on the graph's scratch, as sequences do.
 */
import { InvalidArgumentError } from "../errors.ts";
import { submitAndWait } from "../kernels/decoder/common.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import { DeviceLostError } from "../vk/errors.ts";
import { Buffer } from "../vk/memory.ts";
import { Fence, Submission } from "../vk/sync.ts";
import { GRAPH_MAX_TOKENS, type BatchOutputs } from "./decode-graph.ts";
import type { BatchEntry } from "./graph-batch.ts";
import { openSequenceState, type HybridGraph, type SequenceState } from "./hybrid-graph.ts";
import { fenceWaitMode, ReplayWaiter } from "./replay-wait.ts";

export class HybridBatch implements Disposable {
  readonly slots: number;
  readonly ctx: number;
  /** Bytes of the KV cache and the states in device memory (every slot). */
  readonly cacheBytes: number;
  /** A slot's states cannot drop tokens: truncating it means reset(slot) and running the kept tokens again. */
  readonly rewindable = false;
  /** Replays run and tokens they took (resets excluded). */
  readonly counts = { runs: 0, tokens: 0 };
  private readonly state: SequenceState;
  private readonly outputs: BatchOutputs;
  private readonly logitsView: Float32Array;
  private readonly owned = new DisposableStack();
  private readonly commands: CommandPool;
  private readonly fence: Fence;
  private readonly waiter: ReplayWaiter;
  /** Recordings by S. */
  private readonly recorded: ({ cb: CommandBuffer; submission: Submission } | undefined)[] = [];
  /** Tokens each slot's states hold: its next token's position. */
  private readonly lengths: number[];
  private disposed = false;
  private readonly positions = new Uint32Array(GRAPH_MAX_TOKENS);
  private readonly rows = new Uint32Array(GRAPH_MAX_TOKENS);
  private readonly stateOf = new Uint32Array(GRAPH_MAX_TOKENS);

  constructor(private readonly graph: HybridGraph, slots: number, ctx: number) {
    if (!Number.isInteger(slots) || slots < 1) throw new InvalidArgumentError(`slots must be a positive integer, got ${slots}`);
    if (!Number.isInteger(ctx) || ctx < 1) throw new InvalidArgumentError(`ctx must be a positive integer, got ${ctx}`);
    this.slots = slots;
    this.ctx = ctx;
    this.lengths = new Array<number>(slots).fill(0);
    const device = graph.device, V = graph.cfg.vocab;
    try {
      const buf = (bytes: number, memory: "device" | "readback") => this.owned.use(new Buffer(device, { size: BigInt(Math.ceil(bytes / 16) * 16), memory, priority: 1 }));
      this.state = openSequenceState(graph, ctx, this.owned, slots);
      this.cacheBytes = this.state.bytes;
      this.outputs = { logits: buf(4 * GRAPH_MAX_TOKENS * V, "device"), logitsHost: buf(4 * GRAPH_MAX_TOKENS * V, "readback") };
      this.logitsView = new Float32Array(this.outputs.logitsHost.host(), 0, GRAPH_MAX_TOKENS * V);
      this.commands = this.owned.use(new CommandPool(device));
      this.fence = this.owned.use(new Fence(device));
      this.waiter = new ReplayWaiter(this.fence, fenceWaitMode(device));
      // every slot starts empty
      submitAndWait(device, (cb) => cb.fillBuffer(this.state.conv, 0).fillBuffer(this.state.delta, 0).barrier("transferToCompute"));
      graph.liveBatches.add(this);
    } catch (e) {
      this.owned.dispose();
      throw e;
    }
  }

  /** Tokens slot `slot`'s states hold (the position its next token takes). */
  length(slot: number): number {
    return this.lengths[this.checkSlot(slot)]!;
  }

  /**
   * Runs 1..GRAPH_MAX_TOKENS tokens of any slots in one replay: one submit, one wait. A slot's
   * tokens are taken in entry order at the positions that follow what its states hold (a decode
   * round: one token per slot; a prompt: consecutive tokens). Returns their logits, [S][vocab]
   * in host memory (valid until the next run). Throws DeviceLostError when the device is lost.
   */
  run(entries: readonly BatchEntry[]): Float32Array {
    this.checkLive();
    const S = entries.length, V = this.graph.cfg.vocab;
    if (S < 1 || S > GRAPH_MAX_TOKENS) throw new InvalidArgumentError(`a batch runs 1..${GRAPH_MAX_TOKENS} tokens, got ${S}`);
    const next = new Map<number, number>();
    entries.forEach((e, t) => {
      this.checkSlot(e.slot);
      if (!Number.isInteger(e.id) || e.id < 0 || e.id >= V) throw new InvalidArgumentError(`token id ${e.id} is outside the vocabulary 0..${V - 1}`);
      if (!Number.isInteger(e.position) || e.position < 0 || e.position >= this.ctx) throw new InvalidArgumentError(`position ${e.position} is outside the context 0..${this.ctx - 1}`);
      const expected = next.get(e.slot) ?? this.lengths[e.slot]!;
      if (e.position !== expected) {
        throw new InvalidArgumentError(`slot ${e.slot}'s states hold ${expected} tokens, so its next token is at position ${expected}, got ${e.position} (recurrent states cannot rewind: reset the slot and run the kept tokens again)`);
      }
      next.set(e.slot, expected + 1);
      this.positions[t] = e.position;
      this.rows[t] = e.slot * this.ctx + e.position;
      this.stateOf[t] = e.slot;
    });
    this.graph.writeBatchInput(entries.map((e) => e.id), this.positions, this.rows, this.stateOf.subarray(0, S));
    const r = this.recording(S);
    const done = this.waiter.run(r.submission);
    if (!done) throw new Error("hybrid graph: the GPU did not finish a batch within the timeout");
    if (this.graph.injectDeviceLost) {
      this.graph.injectDeviceLost = false;
      throw new DeviceLostError("vkWaitForFences (injected)");
    }
    for (const [slot, n] of next) this.lengths[slot] = n;
    this.counts.runs++;
    this.counts.tokens += S;
    return this.logitsView.subarray(0, S * V);
  }

  /** Slot `slot` back to an empty sequence: its conv and recurrent states zeroed (one submit, one wait). */
  reset(slot: number): void {
    this.checkLive();
    this.checkSlot(slot);
    const st = this.state, f = 4n;
    submitAndWait(this.graph.device, (cb) =>
      cb
        .barrier("computeToTransfer")
        .fillBuffer(st.conv, 0, BigInt(st.slotConvFloats) * f, BigInt(slot * st.slotConvFloats) * f)
        .fillBuffer(st.delta, 0, BigInt(st.slotDeltaFloats) * f, BigInt(slot * st.slotDeltaFloats) * f)
        .barrier("transferToCompute"),
    );
    this.lengths[slot] = 0;
  }

  private recording(S: number) {
    let r = this.recorded[S];
    if (!r) {
      const cb = this.commands.allocate().begin();
      this.graph.recordBatch(cb, this.state, S, this.outputs);
      cb.end();
      this.recorded[S] = r = { cb, submission: this.owned.use(new Submission(this.graph.device, [cb], { fence: this.fence })) };
    }
    return r;
  }

  private checkSlot(slot: number): number {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.slots) throw new InvalidArgumentError(`slot ${slot} is outside 0..${this.slots - 1}`);
    return slot;
  }

  private checkLive(): void {
    if (this.disposed) throw new InvalidArgumentError("this batch (or its model) is disposed");
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
