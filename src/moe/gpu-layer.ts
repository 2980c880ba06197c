/**
 * One MoE layer call on the GPU: every (token, expert) pair in a constant number of dispatches,
 * recorded once per ticket and replayed. Two recorded command buffers per ticket (see MoePipelines):
 *   grouped: [quantize_act] -> grouped gate+up (SiLU) -> grouped down (router weight folded in) -> sum
 *   fused (S <= fusedTokens, where the device has float atomics): the whole call in one dispatch
 * A call builds the work list and the slot tables in ordinary memory (CallTables), copies them and
 * x into mapped memory, writes the indirect group counts and submits: vkQueueSubmit +
 * vkWaitForFences + vkResetFences.
 *
 * Pre-launch (fused calls, `prelaunchPolls` > 0): while a fused call runs, the next ticket's fused
 * kernel is submitted already, for the same S and slots per token ("armed"). It launches as soon
 * as the GPU has room (no barrier: it touches none of the running call's buffers) and waits,
 * polling a doorbell word, for up to `prelaunchPolls` polls. The next call then writes its inputs
 * and rings the doorbell instead of submitting, so neither vkQueueSubmit nor the launch and
 * wake-up of the kernel is on its critical path (H200, bench-moe, S=1: 27-32 µs a call against
 * 34-39 µs submitted when made). Only where prelaunch-policy.ts allows it. A call that differs in
 * S or slots per token cancels the armed kernel and submits as usual; one that rings a kernel
 * which already gave up (done[1] holds its number) is submitted then, after the fact. Either way
 * the answer is the same.
 */
import { InvalidArgumentError } from "../errors.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import { DescriptorPool, writeStorageBuffers, type BufferBinding } from "../vk/descriptors.ts";
import type { Device } from "../vk/device.ts";
import { Buffer } from "../vk/memory.ts";
import { storeFence } from "../ffi/index.ts";
import { Fence, Submission } from "../vk/sync.ts";
import { DeviceLostError } from "../vk/errors.ts";
import type { KernelConfig } from "../kernels/tuning.ts";
import type { ExpertPool } from "../pool/expert-pool.ts";
import type { DeviceSlab } from "../pool/vulkan-slabs.ts";
import type { ComputePipeline } from "../vk/pipeline.ts";
import { createMoePipelines, QUANTIZE_WORKGROUP, SUM_WORKGROUP, type MoeGemvPath, type MoePipelines } from "./shaders.ts";
import { MAX_TOKENS } from "./routing.ts";

const WORKING_SET_PRIORITY = 1.0;
/** How long the "spin" wait polls the completion word before sleeping in the driver. */
const SPIN_NS = 200_000;
/**
 * Once the completion word is seen the fence signals 2-3 µs later on the H200 (bench-moe: one poll
 * 2.2 µs after the word sufficed in the median call; a first poll at 1.8 µs took 1.6). The spin
 * wait checks it with vkGetFenceStatus FENCE_FIRST_POLL_US after the word, then every
 * FENCE_POLL_GAP_US, up to FENCE_POLLS times (no FFI call in between), before sleeping in
 * vkWaitForFences, which on NVIDIA costs ~12 µs more to wake up than a poll (empty submission:
 * 22.6 µs waited, 10.9 µs polled). At most 6 FFI calls.
 */
const FENCE_POLLS = 3;
const FENCE_FIRST_POLL_US = 2.2;
const FENCE_POLL_GAP_US = 0.4;
/** Doorbell value that stops an armed kernel without running it (GATE_CANCEL in moe_fused.glsl). */
const GATE_CANCEL = -1;

/**
 * "block": vkWaitForFences (3 FFI calls per layer call: submit, wait, reset). "spin": first poll
 * the completion word the last kernel writes into host memory (no FFI call) for up to SPIN_NS,
 * then the fence (pollFence), then vkWaitForFences if it is still unsignaled (3 to 6 FFI calls).
 * scripts/profile-moe.ts and bench-moe.ts measure both.
 */
export type WaitStyle = "block" | "spin";

/** Which recorded command buffer a call runs (see MoePipelines). */
export type CallMode = "grouped" | "fused";

export interface GpuLayerOptions {
  /** Distinct experts per call at most (S*k plus a shared expert, capped by E + 1). */
  maxItems: number;
  /** Slots per call at most: S * slotsPerToken. */
  maxSlots: number;
  tickets?: number;
  /** "integer-dot": int8 x and packed dot products for gate+up; down and sum stay float. Default "float". */
  path?: MoeGemvPath;
  /** Calls of at most this many tokens run fused (one dispatch); 0: every call grouped. Forced to 0 without float atomics. */
  fusedTokens?: number;
  /** > 0: fused calls are pre-launched (see the header), the kernel polling its doorbell this many times at most. */
  prelaunchPolls?: number;
}

/** Rows of xq in words and groups per row for the integer-dot gate+up (quantize_act's layout). */
function quantizeShape(D: number, groupSize: number): { xqRowWords: number; groupsPerRow: number } {
  return { xqRowWords: Math.ceil(D / 16) * 4, groupsPerRow: Math.ceil(D / groupSize) };
}

/** Indirect group counts (uvec3 each, byte offsets) in a ticket's indirect buffer. */
const INDIRECT = { gateUp: 0n, down: 12n, sum: 24n, quantize: 36n, fused: 48n } as const;

/**
 * A call's tables (work list, pair list, slot weights, slot experts), built in ordinary memory and
 * copied by submit() into the ticket's mapped buffers, one sequential copy per table. On a discrete
 * GPU those buffers are write-combined device memory, where the scattered 4-byte stores of building
 * them in place cost ~40 ns each (H200 host, S=1: 4.4 µs for the tables, against ~1 µs of lookups).
 */
export class CallTables {
  /** [S, slots per token, items, sequence number], then per item: expert address (2 words), first pair, pair count. */
  readonly work: Uint32Array;
  readonly pairs: Uint32Array;
  readonly slotWeight: Float32Array;
  /** Per slot: its expert's address, as in the work list. */
  readonly slotExpert: Uint32Array;
  /** Pairs written this call (the slots' count is S * slots per token). */
  pairCount = 0;
  // Each table's first n elements as a view, made once per n: a call allocates nothing.
  private readonly workPrefix: (n: number) => Uint32Array;
  private readonly pairsPrefix: (n: number) => Uint32Array;
  private readonly slotWeightPrefix: (n: number) => Float32Array;
  private readonly slotExpertPrefix: (n: number) => Uint32Array;

  constructor(maxItems: number, maxSlots: number) {
    this.work = new Uint32Array(4 * (1 + maxItems));
    this.pairs = new Uint32Array(maxSlots);
    this.slotWeight = new Float32Array(maxSlots);
    this.slotExpert = new Uint32Array(2 * maxSlots);
    this.workPrefix = prefixOf(this.work);
    this.pairsPrefix = prefixOf(this.pairs);
    this.slotWeightPrefix = prefixOf(this.slotWeight);
    this.slotExpertPrefix = prefixOf(this.slotExpert);
  }

  /** Copies what this call wrote into ticket t's mapped buffers. */
  copyTo(t: Ticket, items: number, slots: number): void {
    const v = t.views;
    v.work.set(this.workPrefix(4 * (1 + items)));
    v.pairs.set(this.pairsPrefix(this.pairCount));
    v.slotWeight.set(this.slotWeightPrefix(slots));
    v.slotExpert.set(this.slotExpertPrefix(2 * slots));
  }
}

/** `n => a.subarray(0, n)`, each view made once. */
function prefixOf<T extends Uint32Array | Float32Array>(a: T): (n: number) => T {
  const views: T[] = [];
  return (n) => (views[n] ??= a.subarray(0, n) as T);
}

/** Everything one in-flight call owns. */
class Ticket {
  readonly x: Buffer;
  readonly work: Buffer;
  readonly pairs: Buffer;
  readonly slotWeight: Buffer;
  /** Each slot's expert blob (as in the work list), so the fused kernel needs no pair list. */
  readonly slotExpert: Buffer;
  readonly h: Buffer;
  readonly ypair: Buffer;
  readonly y: Buffer;
  readonly indirect: Buffer;
  /** Completion word: the last kernel writes the call's sequence number here (host memory). */
  readonly done: Buffer;
  /** The fused kernel's count of finished workgroups (0 between calls). */
  readonly arrived: Buffer;
  /** The fused kernel's per-token sums (float atomics; 0 between calls), when it exists. */
  readonly yacc: Buffer | undefined;
  /** Pre-launch: [0] = the sequence number the armed kernel serves, [1] = its doorbell. */
  readonly gate: Buffer;
  /** Integer-dot path: x quantized per group by quantize_act (int8 words, scales, sums). */
  readonly quantized: { xq: Buffer; xscale: Buffer; xsum: Buffer } | undefined;
  readonly fence: Fence;
  readonly commands: Record<CallMode, CommandBuffer> & { prelaunched?: CommandBuffer };
  readonly submissions: Record<CallMode, Submission> & { prelaunched?: Submission };
  readonly sets: { quantize: bigint | undefined; gateUp: bigint; down: bigint; sum: bigint; fused: bigint | undefined };
  readonly views: {
    x: Float32Array; work: Uint32Array; pairs: Uint32Array; slotWeight: Float32Array; slotExpert: Uint32Array; y: Float32Array; indirect: Uint32Array; done: Int32Array;
    gate: Int32Array;
  };
  /** An armed (pre-launched, not yet rung) fused kernel: its sequence number and the S and slots per token it was launched for. */
  armed: { seq: number; S: number; K: number } | undefined = undefined;
  /** The call on this ticket rang an armed kernel (which may have given up before the doorbell). */
  rung = false;
  /** Sequence number of the call this ticket holds (work header .w). */
  seq = 0;
  busy = false;
  /** Issued and not yet taken: its buffers hold a call's inputs or results. */
  pending = false;
  /** The CPU share of this ticket's call (experts the pool could not hold). */
  readonly cpuY: Float32Array;

  constructor(device: Device, pool: CommandPool, descriptors: DescriptorPool, p: MoePipelines, D: number, I: number, groupSize: number, opts: GpuLayerOptions) {
    const buf = (bytes: number, memory: "upload" | "device" | "readback") => new Buffer(device, { size: BigInt(Math.max(16, bytes)), memory, priority: WORKING_SET_PRIORITY });
    this.x = buf(4 * MAX_TOKENS * D, "upload");
    this.work = buf(16 * (1 + opts.maxItems), "upload");
    this.pairs = buf(4 * opts.maxSlots, "upload");
    this.slotWeight = buf(4 * opts.maxSlots, "upload");
    this.slotExpert = buf(8 * opts.maxSlots, "upload");
    this.h = buf(4 * opts.maxSlots * I, "device");
    this.ypair = buf(4 * opts.maxSlots * D, "device");
    this.y = buf(4 * MAX_TOKENS * D, "readback");
    this.indirect = buf(4 * 15, "upload");
    this.done = buf(16, "readback"); // [0]: a call ran; [1]: an armed kernel stopped without running
    this.gate = buf(16, "upload");
    this.arrived = buf(16, "device"); // zeroed by zeroFusedState (atomics stay in device memory)
    this.yacc = p.fused ? buf(4 * MAX_TOKENS * D, "device") : undefined;
    if (p.quantize) {
      const q = quantizeShape(D, groupSize);
      this.quantized = { xq: buf(4 * MAX_TOKENS * q.xqRowWords, "device"), xscale: buf(4 * MAX_TOKENS * q.groupsPerRow, "device"), xsum: buf(4 * MAX_TOKENS * q.groupsPerRow, "device") };
    }
    this.views = {
      x: new Float32Array(this.x.host()), work: new Uint32Array(this.work.host()), pairs: new Uint32Array(this.pairs.host()),
      slotWeight: new Float32Array(this.slotWeight.host()), slotExpert: new Uint32Array(this.slotExpert.host()), y: new Float32Array(this.y.host()),
      indirect: new Uint32Array(this.indirect.host()), done: new Int32Array(this.done.host()), gate: new Int32Array(this.gate.host()),
    };
    // Sequence numbers are never 0, and a call trusts a completion word or doorbell that holds its
    // number. Fresh memory may hold an earlier owner's words (Lavapipe hands freed memory back as
    // it was: a ticket's first armed kernel then looked stopped before its doorbell), so start at 0.
    this.views.done.fill(0);
    this.views.gate.fill(0);
    this.cpuY = new Float32Array(MAX_TOKENS * D);
    this.fence = new Fence(device);
    this.commands = { grouped: pool.allocate(), fused: pool.allocate(), ...(p.fusedPrelaunched ? { prelaunched: pool.allocate() } : {}) };
    this.submissions = {
      grouped: new Submission(device, [this.commands.grouped], { fence: this.fence }),
      fused: new Submission(device, [this.commands.fused], { fence: this.fence }),
      ...(this.commands.prelaunched ? { prelaunched: new Submission(device, [this.commands.prelaunched], { fence: this.fence }) } : {}),
    };
    // Unbound slab slots hold a small placeholder buffer (no partially-bound descriptors needed).
    const slabs = Array.from({ length: p.maxSlabs }, () => undefined);
    const q = this.quantized;
    this.sets = {
      quantize: p.quantize && q ? descriptors.allocate(p.quantize, [{ buffer: this.x }, { buffer: q.xq }, { buffer: q.xscale }, { buffer: q.xsum }]) : undefined,
      gateUp: descriptors.allocate(p.gateUp, this.stageBindings("gateUp", slabs)),
      down: descriptors.allocate(p.down, this.stageBindings("down", slabs)),
      sum: descriptors.allocate(p.sum, [{ buffer: this.ypair }, { buffer: this.work }, { buffer: this.y }, { buffer: this.slotWeight }, { buffer: this.done }]),
      fused: p.fused ? descriptors.allocate(p.fused, this.stageBindings("fused", slabs)) : undefined,
    };
  }

  /**
   * Bindings of a GEMV stage's set (+ the slab array on the descriptor path):
   *   gateUp, down: input (x, h, or the integer-dot gate+up's xq), work, pairs, output, slot
   *     weights (+ xscale, xsum on the integer-dot gate+up);
   *   fused: x, work, slot experts, y, slot weights, completion word, arrival count, accumulators, gate.
   */
  stageBindings(stage: "gateUp" | "down" | "fused", slabs: readonly (DeviceSlab | undefined)[]): (BufferBinding | BufferBinding[])[] {
    const bindings: (BufferBinding | BufferBinding[])[] = [];
    if (stage === "fused") {
      bindings.push(...[this.x, this.work, this.slotExpert, this.y, this.slotWeight, this.done, this.arrived, this.yacc!, this.gate].map((buffer) => ({ buffer })));
    } else {
      const q = stage === "gateUp" ? this.quantized : undefined;
      const [input, out] = stage === "down" ? [this.h, this.ypair] : [q ? q.xq : this.x, this.h];
      bindings.push({ buffer: input }, { buffer: this.work }, { buffer: this.pairs }, { buffer: out }, { buffer: this.slotWeight });
      if (q) bindings.push({ buffer: q.xscale }, { buffer: q.xsum });
    }
    if (slabs.length) bindings.push(slabs.map((b) => ({ buffer: b ? b.buffer : this.indirect })));
    return bindings;
  }

  dispose(): void {
    this.submissions.prelaunched?.[Symbol.dispose]();
    this.submissions.fused[Symbol.dispose]();
    this.submissions.grouped[Symbol.dispose]();
    this.fence[Symbol.dispose]();
    const q = this.quantized;
    for (const b of [...(q ? [q.xsum, q.xscale, q.xq] : []), ...(this.yacc ? [this.yacc] : []), this.gate, this.arrived, this.done, this.indirect, this.y, this.ypair, this.h, this.slotExpert, this.slotWeight, this.pairs, this.work, this.x]) {
      b[Symbol.dispose]();
    }
  }
}

export type { Ticket };

/** Every ticket holds an issued call that was not taken yet. */
export class TicketsExhaustedError extends InvalidArgumentError {
  constructor(readonly tickets: number) {
    super(`all ${tickets} tickets hold calls not yet taken: take() one before issuing another (or open with more tickets)`);
  }
}

/** The descriptor path cannot bind one more slab in a dispatch on this device (the expert then runs on the CPU). */
export class SlabBindingsExhaustedError extends InvalidArgumentError {
  constructor(readonly limit: number) {
    super(`the descriptor path binds at most ${limit} slabs per dispatch on this device`);
  }
}

export class GpuLayer implements Disposable {
  readonly device: Device;
  readonly pool: ExpertPool;
  readonly pipelines: MoePipelines;
  /** The GEMV shape the pipelines were made with. */
  readonly config: KernelConfig;
  readonly D: number;
  readonly I: number;
  private readonly commandPool: CommandPool;
  private readonly descriptors: DescriptorPool;
  private readonly tickets: Ticket[] = [];
  private next = 0;
  /** Descriptor path: which array element each slab is bound to. */
  private readonly slabSlot = new Map<DeviceSlab, number>();
  private boundSlabs: (DeviceSlab | undefined)[] = [];
  waitStyle: WaitStyle = "block";
  /** Fault hook: the next wait throws DeviceLostError (after really waiting, so teardown stays valid). */
  injectDeviceLost = false;
  /** Rows per workgroup of the grouped kernels (kernel config). */
  readonly rows: number;
  /** Sequence number of the last call submitted (completion word). */
  private seq = 0;
  /** The next call's tables: the caller fills them, submit() copies them into the ticket. */
  readonly tables: CallTables;
  // Push constants of each stage (also recorded by the decode graph's MoE stage, graph-stage.ts).
  readonly pushGateUp = new Uint32Array(9);
  readonly pushDown = new Uint32Array(9);
  /** The fused kernel: gate+up's push constants, then the down matrix's rowWords, groupsPerRow, weight and scale offsets. */
  readonly pushFused = new Uint32Array(13);
  readonly pushSum: Uint32Array;
  /** quantize_act: I = D, S = MAX_TOKENS (the indirect group count bounds the real S), groupsPerRow, xOffset, xqRowWords. */
  readonly pushQuantize: Uint32Array;
  readonly quantizeThreadsPerToken: number;
  /** Calls of at most this many tokens run the fused command buffer. */
  readonly fusedTokens: number;
  /** Fused calls are pre-launched (see the header). Scripts that time the GPU turn it off (setPrelaunch). */
  private prelaunch: boolean;
  /**
   * Pre-launched kernels: rung and run; rung after they had given up (the call then submitted);
   * stopped unrung (the next call differed in S or k, or it was not taken in time, or shutdown).
   */
  readonly prelaunchCounts = { ran: 0, gaveUp: 0, cancelled: 0 };

  constructor(device: Device, pool: ExpertPool, config: KernelConfig, opts: GpuLayerOptions, limit?: number) {
    this.device = device;
    this.pool = pool;
    const L = pool.layout;
    this.D = L.shape.hidden;
    this.I = L.shape.intermediate;
    const n = opts.tickets ?? 2;
    this.tables = new CallTables(opts.maxItems, opts.maxSlots);
    // Arming needs a second ticket, and no expert upload on the queue (an upload submitted after an
    // armed kernel would not be ordered before it).
    const prelaunchPolls = n >= 2 && device.memory.model !== "staged" ? opts.prelaunchPolls ?? 0 : 0;
    this.pipelines = createMoePipelines(device, config, L.shape, pool.addressing, opts.path ?? "float", prelaunchPolls);
    this.config = config;
    this.rows = config.rowsPerWorkgroup;
    this.prelaunch = this.pipelines.fusedPrelaunched !== undefined;
    this.commandPool = new CommandPool(device);
    this.fusedTokens = this.pipelines.fused ? Math.min(MAX_TOKENS, opts.fusedTokens ?? 0) : 0;
    const perSet = 8 + this.pipelines.maxSlabs;
    this.descriptors = new DescriptorPool(device, 5 * n, 5 * n * perSet); // quantize, gate+up, down, sum, fused
    this.pushSum = new Uint32Array([this.D]);
    const q = quantizeShape(this.D, L.shape.groupSize);
    this.pushQuantize = new Uint32Array([this.D, MAX_TOKENS, q.groupsPerRow, 0, q.xqRowWords]);
    this.quantizeThreadsPerToken = q.groupsPerRow * (L.shape.groupSize / 4);
    this.pushGateUp.set([L.gate.rows, L.gate.cols, L.gate.rowWords, L.gate.groupsPerRow, L.gate.weightOffset / 16, L.gate.scaleOffset / 4, L.up.weightOffset / 16, L.up.scaleOffset / 4]);
    new Float32Array(this.pushGateUp.buffer)[8] = limit ?? 0;
    this.pushDown.set([L.down.rows, L.down.cols, L.down.rowWords, L.down.groupsPerRow, L.down.weightOffset / 16, L.down.scaleOffset / 4, 0, 0, 0]);
    this.pushFused.set(this.pushGateUp);
    this.pushFused.set([L.down.rowWords, L.down.groupsPerRow, L.down.weightOffset / 16, L.down.scaleOffset / 4], 9);
    for (let i = 0; i < n; i++) {
      const t = new Ticket(device, this.commandPool, this.descriptors, this.pipelines, this.D, this.I, L.shape.groupSize, opts);
      this.tickets.push(t);
      this.record(t);
    }
    this.zeroFusedState();
    this.boundSlabs = Array.from({ length: this.pipelines.maxSlabs }, () => undefined);
  }

  /**
   * The fused kernel's arrival counts and accumulators start at 0 (each call's last workgroup
   * zeroes them again). Device memory, so its atomics never cross the bus on a discrete GPU.
   */
  private zeroFusedState(): void {
    if (!this.pipelines.fused) return;
    const cb = this.commandPool.allocate().begin();
    for (const t of this.tickets) {
      cb.fillBuffer(t.arrived, 0);
      if (t.yacc) cb.fillBuffer(t.yacc, 0);
    }
    cb.barrier("transferToCompute").end();
    using fence = new Fence(this.device);
    using sub = new Submission(this.device, [cb], { fence });
    sub.submit();
    if (!fence.wait()) throw new Error("MoE layer: zeroing the fused call's state did not finish within the timeout");
  }

  private record(t: Ticket): void {
    for (const mode of ["grouped", "fused"] as const) {
      const cb = t.commands[mode].begin();
      this.recordCall(cb, t, mode);
      cb.barrier("computeToHost").end();
    }
    const pre = this.pipelines.fusedPrelaunched;
    if (t.commands.prelaunched && pre && t.sets.fused) {
      // No barrier before it: it launches while the call before it runs (different buffers), so it
      // is polling by the time the next call rings.
      t.commands.prelaunched.begin()
        .bind(pre, t.sets.fused).pushConstants(pre, this.pushFused).dispatchIndirect(t.indirect, INDIRECT.fused)
        .barrier("computeToHost").end();
    }
  }

  /** A new call sequence number: never 0 (the words' initial value) nor GATE_CANCEL. */
  private nextSeq(): number {
    let s = (this.seq + 1) | 0;
    if (s === 0 || s === GATE_CANCEL) s = 1;
    return (this.seq = s);
  }

  /** Whether fused calls are pre-launched; off also stops every armed kernel (GPU timing of a call needs it off). */
  setPrelaunch(on: boolean): void {
    if (!on) for (const t of this.tickets) this.disarm(t);
    this.prelaunch = on && this.pipelines.fusedPrelaunched !== undefined;
  }

  get prelaunched(): boolean {
    return this.prelaunch;
  }

  /**
   * After a fused call of S tokens and K slots per token was submitted: arms the ticket the next
   * call will take, if it is idle (its kernel launches when the GPU has room, and waits).
   */
  prelaunchNext(S: number, K: number): void {
    if (!this.prelaunch) return;
    const t = this.tickets[this.next]!;
    if (t.pending || t.busy || t.armed) return;
    const ind = t.views.indirect;
    ind[12] = Math.ceil(this.I / this.pipelines.fusedBlockRows); ind[13] = K; ind[14] = S;
    const seq = this.nextSeq();
    t.views.gate[0] = seq;
    t.views.gate[1] = 0;
    t.submissions.prelaunched!.submit(); // orders the writes above before the kernel
    t.busy = true;
    t.armed = { seq, S, K };
  }

  /** Rings an armed kernel's doorbell with the cancel value: it stops without running. */
  private ringCancel(t: Ticket): void {
    t.armed = undefined;
    storeFence();
    t.views.gate[1] = GATE_CANCEL;
    storeFence();
  }

  /** Stops an armed kernel and waits for its submission. */
  private disarm(t: Ticket): void {
    if (!t.armed) return;
    this.ringCancel(t);
    this.prelaunchCounts.cancelled++;
    t.busy = false;
    if (!t.fence.wait()) throw new Error("MoE layer: a pre-launched kernel did not stop within the timeout");
    t.fence.reset();
  }

  /**
   * The dispatches of one call of `mode` on ticket t's buffers, with barriers between them;
   * `mark(i)` after dispatch i (profiling: timestamps). No leading barrier: staged expert uploads
   * end with their own transfer-to-compute barrier.
   */
  recordCall(cb: CommandBuffer, t: Ticket, mode: CallMode, mark?: (stage: number) => void): void {
    const p = this.pipelines;
    const steps: [ComputePipeline, bigint, Uint32Array, bigint][] = [];
    if (mode === "grouped") {
      if (p.quantize && t.sets.quantize) steps.push([p.quantize, t.sets.quantize, this.pushQuantize, INDIRECT.quantize]);
      steps.push([p.gateUp, t.sets.gateUp, this.pushGateUp, INDIRECT.gateUp], [p.down, t.sets.down, this.pushDown, INDIRECT.down], [p.sum, t.sets.sum, this.pushSum, INDIRECT.sum]);
    } else if (p.fused && t.sets.fused) {
      steps.push([p.fused, t.sets.fused, this.pushFused, INDIRECT.fused]);
    }
    steps.forEach(([pipeline, set, push, offset], i) => {
      if (i > 0) cb.barrier("computeToCompute");
      cb.bind(pipeline, set).pushConstants(pipeline, push).dispatchIndirect(t.indirect, offset);
      mark?.(i);
    });
  }

  /** A ticket no call holds; TicketsExhaustedError when every one is issued and not yet taken. */
  acquire(): Ticket {
    for (let i = 0; i < this.tickets.length; i++) {
      const t = this.tickets[(this.next + i) % this.tickets.length]!;
      if (t.pending) continue;
      this.next = (this.next + i + 1) % this.tickets.length;
      if (!t.armed) this.wait(t); // an armed one is rung (or cancelled) by submit()
      t.pending = true;
      return t;
    }
    throw new TicketsExhaustedError(this.tickets.length);
  }

  /** Gives a ticket back after its call was taken (or abandoned). */
  releaseTicket(t: Ticket): void {
    t.pending = false;
  }

  /** Descriptor path: the array element `slab` is bound to, binding it first if it is new. */
  slotOf(slab: DeviceSlab): number {
    const known = this.slabSlot.get(slab);
    if (known !== undefined && this.boundSlabs[known] === slab) return known;
    // Forget slabs the pool has destroyed since, then take a free element.
    const live = new Set(this.pool.allocator.slabs().map((u) => u.handle));
    this.boundSlabs = this.boundSlabs.map((b) => (b && live.has(b) ? b : undefined));
    const free = this.boundSlabs.findIndex((b) => b === undefined);
    if (free < 0) throw new SlabBindingsExhaustedError(this.boundSlabs.length);
    this.boundSlabs[free] = slab;
    this.slabSlot.set(slab, free);
    // A set used by recorded command buffers may only be rewritten while they are idle, and they
    // must be recorded again. Rare: only when the pool creates a slab.
    for (const t of this.tickets) {
      this.wait(t);
      this.writeSlabArray(t);
      this.record(t);
    }
    return free;
  }

  /** The slab array binding (descriptor path): every bound slab, `placeholder` in the free elements. */
  slabArray(placeholder: Buffer): BufferBinding[] {
    return this.boundSlabs.map((b) => ({ buffer: b ? b.buffer : placeholder }));
  }

  private writeSlabArray(t: Ticket): void {
    writeStorageBuffers(this.device, t.sets.gateUp, t.stageBindings("gateUp", this.boundSlabs));
    writeStorageBuffers(this.device, t.sets.down, t.stageBindings("down", this.boundSlabs));
    if (t.sets.fused) writeStorageBuffers(this.device, t.sets.fused, t.stageBindings("fused", this.boundSlabs));
  }

  /** The command buffer a call of S tokens runs. */
  modeFor(S: number): CallMode {
    return S <= this.fusedTokens ? "fused" : "grouped";
  }

  /**
   * Copies x and the call's tables (`tables`, work list header included) into ticket t, writes
   * the indirect group counts for S tokens and `items` work items, and submits the mode's command
   * buffer (one vkQueueSubmit), or rings the ticket's armed kernel. Fused calls read the slot
   * tables (slotExpert, slotWeight) instead of the work list's items and pairs.
   */
  submit(t: Ticket, x: Float32Array, S: number, slotsPerToken: number, items: number): CallMode {
    const mode = this.modeFor(S);
    const armed = t.armed;
    if (armed) {
      if (mode === "fused" && armed.S === S && armed.K === slotsPerToken && t.views.done[1] !== armed.seq) {
        // Ring: every input store reaches the device before the doorbell's (write-combining memory).
        this.tables.work[3] = armed.seq; // read only if the kernel gave up and the call is resubmitted (gaveUp)
        this.tables.copyTo(t, items, S * slotsPerToken);
        t.views.x.set(x);
        t.seq = armed.seq;
        t.armed = undefined;
        t.rung = true;
        storeFence();
        t.views.gate[1] = armed.seq;
        storeFence();
        return mode;
      }
      this.disarm(t); // another shape, or it already gave up
    }
    t.views.x.set(x);
    const ind = t.views.indirect;
    ind[0] = Math.ceil(this.I / this.rows); ind[1] = items; ind[2] = 1;
    ind[3] = Math.ceil(this.D / this.pipelines.downBlockRows); ind[4] = items; ind[5] = 1;
    ind[6] = Math.ceil((S * this.D) / SUM_WORKGROUP); ind[7] = 1; ind[8] = 1;
    ind[9] = Math.ceil((S * this.quantizeThreadsPerToken) / QUANTIZE_WORKGROUP); ind[10] = 1; ind[11] = 1;
    // Never read back from these views: on a discrete GPU they are write-combined device memory, where
    // one read is an uncached round trip over the bus.
    ind[12] = Math.ceil(this.I / this.pipelines.fusedBlockRows); ind[13] = slotsPerToken; ind[14] = S; // (row blocks, slot, token)
    t.seq = this.nextSeq();
    this.tables.work[3] = t.seq;
    this.tables.copyTo(t, items, S * slotsPerToken);
    t.submissions[mode].submit();
    t.busy = true;
    return mode;
  }

  /**
   * Waits for a ticket's submission (the layer's wait style), then resets its fence. Throws
   * DeviceLostError on a lost device.
   */
  wait(t: Ticket): void {
    if (!t.busy) return;
    if (t.armed) return this.disarm(t); // nobody rang it
    t.busy = false;
    if (this.injectDeviceLost) return this.injectedLoss(t);
    this.waitForSubmission(t);
    if (this.gaveUp(t)) this.waitForSubmission(t);
  }

  private waitForSubmission(t: Ticket): void {
    if (this.waitStyle !== "spin" || !this.spinOnCompletionWord(t) || !this.pollFence(t)) {
      if (!t.fence.wait()) throw new Error("MoE layer: the GPU did not finish within the timeout");
    }
    t.fence.reset();
  }

  /**
   * After a rung call's submission ended: if its kernel had given up before the doorbell (done[1]
   * holds the call's number), submits the call now (the inputs are in place) and returns true.
   */
  private gaveUp(t: Ticket): boolean {
    if (!t.rung) return false;
    t.rung = false;
    if (t.views.done[1] !== t.seq) {
      this.prelaunchCounts.ran++;
      return false;
    }
    this.prelaunchCounts.gaveUp++;
    t.submissions.fused.submit();
    return true;
  }

  /** Polls the ticket's completion words for up to SPIN_NS; no FFI call. True once one holds the call's number. */
  private spinOnCompletionWord(t: Ticket): boolean {
    const word = t.views.done;
    const start = performance.now();
    const limitMs = SPIN_NS / 1e6;
    // Atomics.load: a fresh read every time (a plain load could be hoisted out of the loop).
    while (Atomics.load(word, 0) !== t.seq && Atomics.load(word, 1) !== t.seq) {
      if (performance.now() - start > limitMs) return false;
    }
    return true;
  }

  /** After the completion word: up to FENCE_POLLS vkGetFenceStatus on the schedule above. True once signaled. */
  private pollFence(t: Ticket): boolean {
    let at = performance.now() + FENCE_FIRST_POLL_US / 1e3;
    for (let i = 0; i < FENCE_POLLS; i++, at += FENCE_POLL_GAP_US / 1e3) {
      while (performance.now() < at) { /* no FFI call */ }
      if (t.fence.signaled()) return true;
    }
    return false;
  }

  /** The same without holding the event loop in Deno (the wait runs on a worker thread). */
  async waitAsync(t: Ticket): Promise<void> {
    if (!t.busy) return;
    if (t.armed) return this.disarm(t);
    if (this.injectDeviceLost) {
      t.busy = false;
      return this.injectedLoss(t);
    }
    for (;;) {
      if (!("Deno" in globalThis) && this.waitStyle === "spin") this.spinOnCompletionWord(t);
      const done = "Deno" in globalThis ? await t.fence.waitAsync() : t.fence.wait();
      if (!done) {
        t.busy = false;
        throw new Error("MoE layer: the GPU did not finish within the timeout");
      }
      t.fence.reset();
      if (!this.gaveUp(t)) break;
    }
    t.busy = false;
  }

  private injectedLoss(t: Ticket): never {
    this.injectDeviceLost = false;
    t.fence.wait();
    t.fence.reset();
    throw new DeviceLostError("vkWaitForFences (injected)");
  }

  [Symbol.dispose](): void {
    // Armed kernels stop at the cancel doorbell (they would stop by themselves after their polls).
    for (const t of this.tickets) if (t.armed) this.ringCancel(t);
    try {
      this.device.waitIdle();
    } catch {
      // A lost device: vkDestroy* below are still valid.
    }
    for (const t of this.tickets) t.dispose();
    this.commandPool[Symbol.dispose]();
    this.descriptors[Symbol.dispose]();
    this.pipelines[Symbol.dispose]();
  }
}
