/**
 * Device-side measurements for benchmarks: the empty submit+wait round trip, the streaming-read
 * bandwidth, GPU timestamps around the MoE layer's own recorded command buffer, and FFI call
 * counts that leave the loader's table as it was.
 */
import type { MoeBackend } from "../../src/moe/backend.ts";
import { shaderFile } from "../../src/kernels/shaders.ts";
import { countCalls, type CallCounter, type CoreCommands } from "../../src/vk/loader.ts";
import {
  Buffer, CommandPool, ComputePipeline, DescriptorPool, Fence, QueryPool, Submission, uploadBytes,
  VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, type CommandBuffer, type Device,
} from "../../src/vk/index.ts";
import { fillRandomWords } from "./synthetic.ts";

const MiB = 2 ** 20;

export interface RoundTrip {
  /** vkQueueSubmit + vkWaitForFences + vkResetFences, µs per sample. */
  wait: number[];
  /** vkQueueSubmit + vkGetFenceStatus until signaled + vkResetFences, µs per sample. */
  spin: number[];
}

/**
 * Host µs of one submission of an empty recorded command buffer, waited for by blocking in
 * vkWaitForFences and by polling vkGetFenceStatus: the floor under any one-submission-per-call
 * design. `reps` samples of each, interleaved.
 */
export function emptyRoundTrip(device: Device, reps: number): RoundTrip {
  using pool = new CommandPool(device);
  using fence = new Fence(device);
  const cb = pool.allocate().begin().end();
  using submission = new Submission(device, [cb], { fence });
  const out: RoundTrip = { wait: [], spin: [] };
  for (let i = 0; i < reps + 5; i++) {
    let t0 = performance.now();
    submission.submit();
    fence.wait();
    fence.reset();
    let t1 = performance.now();
    if (i >= 5) out.wait.push((t1 - t0) * 1e3);
    t0 = performance.now();
    submission.submit();
    while (!fence.signaled()) { /* poll */ }
    fence.reset();
    t1 = performance.now();
    if (i >= 5) out.spin.push((t1 - t0) * 1e3);
  }
  return out;
}

/**
 * Host µs of `reps` submissions of `submission`, each polled with vkGetFenceStatus until its fence
 * (the submission's own) signals, after `warm` untimed ones.
 */
export function submitPollUs(submission: Submission, fence: Fence, reps: number, warm = 20): number[] {
  const us: number[] = [];
  for (let i = 0; i < warm + reps; i++) {
    const t0 = performance.now();
    submission.submit();
    while (!fence.signaled()) { /* poll */ }
    fence.reset();
    if (i >= warm) us.push((performance.now() - t0) * 1e3);
  }
  return us;
}

/** Records `body` between two timestamps and runs it `reps` times; the best GPU ns. */
export function timeOnGpu(device: Device, body: (cb: CommandBuffer) => void, reps: number): number {
  using queries = new QueryPool(device, 2);
  using pool = new CommandPool(device);
  using fence = new Fence(device);
  const cb = pool.allocate().begin();
  cb.resetQueries(queries).timestamp(queries, 0, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT);
  body(cb);
  cb.timestamp(queries, 1, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT).end();
  using submission = new Submission(device, [cb], { fence });
  let best = Infinity;
  for (let r = 0; r < reps; r++) {
    submission.submit();
    fence.wait();
    fence.reset();
    const ts = queries.results();
    best = Math.min(best, Number(ts[1]! - ts[0]!) * device.info.limits.timestampPeriod);
  }
  return best;
}

export interface ReadBandwidth {
  gbs: number;
  /** Bytes read per pass. */
  bytes: number;
  passes: number;
  gpuNs: number;
}

/**
 * The device's read bandwidth: shaders/stream_read.spv over `bytes` of random words (several
 * times any last-level cache), four passes per submission, best of `reps`. The same kernel and
 * method as scripts/bench-gemv.ts.
 */
export function readBandwidth(device: Device, wantBytes: number, reps: number): ReadBandwidth {
  const info = device.info;
  const limit = Math.min(Number(info.limits.maxMemoryAllocationSize), Number(info.limits.maxBufferSize), info.limits.maxStorageBufferRange);
  const bytes = Math.max(MiB, Math.min(wantBytes, limit - (limit % MiB)));
  using src = new Buffer(device, { size: BigInt(bytes), memory: "device" });
  {
    const chunk = new Uint32Array(Math.min(bytes, 16 * MiB) / 4);
    fillRandomWords(chunk, 0x5eed);
    const u8 = new Uint8Array(chunk.buffer);
    for (let at = 0; at < bytes; at += u8.byteLength) uploadBytes(device, src, BigInt(at), u8.subarray(0, Math.min(u8.byteLength, bytes - at)));
  }
  using sink = new Buffer(device, { size: 1n << 20n, memory: "device" });
  using stream = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256 } });
  using descriptors = new DescriptorPool(device, 1, 2);
  const set = descriptors.allocate(stream, [{ buffer: src, range: BigInt(bytes) }, { buffer: sink }]);
  const groups = info.type === 4 ? 256 : 4096;
  const passes = 4;
  const pc = new Uint32Array([0, bytes / 16]);
  const gpuNs = timeOnGpu(device, (cb) => {
    for (let i = 0; i < passes; i++) cb.bind(stream, set).pushConstants(stream, pc).dispatch(groups);
  }, reps);
  return { gbs: (passes * bytes) / gpuNs, bytes, passes, gpuNs };
}

/**
 * Evicts the GPU's last-level cache: one streaming read over `bytes` (several times the L2) per
 * flush(), its own submission, waited for. For timing a kernel with its data in DRAM, as in a
 * decode over many layers. Dispose it (it owns a buffer, a pipeline and a command pool).
 */
export class CacheFlusher implements Disposable {
  private readonly src: Buffer;
  private readonly sink: Buffer;
  private readonly stream: ComputePipeline;
  private readonly descriptors: DescriptorPool;
  private readonly pool: CommandPool;
  private readonly fence: Fence;
  private readonly submission: Submission;

  constructor(device: Device, bytes = 256 * MiB) {
    const limit = Math.min(Number(device.info.limits.maxMemoryAllocationSize), device.info.limits.maxStorageBufferRange);
    const size = Math.min(bytes, limit - (limit % MiB));
    this.src = new Buffer(device, { size: BigInt(size), memory: "device" });
    this.sink = new Buffer(device, { size: 1n << 20n, memory: "device" });
    this.stream = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256 } });
    this.descriptors = new DescriptorPool(device, 1, 2);
    const set = this.descriptors.allocate(this.stream, [{ buffer: this.src, range: BigInt(size) }, { buffer: this.sink }]);
    this.pool = new CommandPool(device);
    this.fence = new Fence(device);
    // The contents do not matter; zeroed so nothing reads uninitialized memory.
    const cb = this.pool.allocate().begin().fillBuffer(this.src, 0).barrier("transferToCompute")
      .bind(this.stream, set).pushConstants(this.stream, new Uint32Array([0, size / 16])).dispatch(device.info.type === 4 ? 256 : 4096).end();
    this.submission = new Submission(device, [cb], { fence: this.fence });
  }

  flush(): void {
    this.submission.submit();
    this.fence.wait();
    this.fence.reset();
  }

  [Symbol.dispose](): void {
    this.submission[Symbol.dispose]();
    this.fence[Symbol.dispose]();
    this.pool[Symbol.dispose]();
    this.descriptors[Symbol.dispose]();
    this.stream[Symbol.dispose]();
    this.sink[Symbol.dispose]();
    this.src[Symbol.dispose]();
  }
}

/** The parts of the backend's private GPU state this file reaches (scripts/bench-moe.ts documents why). */
type CallMode = "grouped" | "fused";
const MODES: CallMode[] = ["grouped", "fused"];
interface TicketInternals {
  submissions: Record<CallMode, Submission>;
  fence: Fence;
  commands: Record<CallMode, CommandBuffer>;
}
interface LayerInternals {
  tickets: TicketInternals[];
  next: number;
  prelaunched: boolean;
  setPrelaunch(on: boolean): void;
}

/**
 * GPU time of each MoE layer call, measured on the layer's own recorded command buffers: each
 * ticket's submissions (one per call mode) are swapped for ones submitting [reset + timestamp, the
 * ticket's command buffer, timestamp] with the same fence, still one vkQueueSubmit. No replica
 * runs, so caches are exactly as the real call left them. `off()` restores the original
 * submissions (call it before the backend is disposed; dispose does it too).
 *
 * This reaches private fields of MoeBackend and GpuLayer (gpu.layer.tickets, next); it checks
 * their shape and throws a clear error if they change. The proposed public replacement is an
 * opt-in `timestamps` option on GpuLayer (see the bench-moe report).
 */
export class LayerTimer implements Disposable {
  private readonly layer: LayerInternals;
  private readonly device: Device;
  private readonly period: number;
  private readonly pool: CommandPool;
  private readonly parts: { ticket: TicketInternals; original: Record<CallMode, Submission>; timed: Record<CallMode, Submission>; queries: QueryPool }[] = [];
  private active = false;
  private prelaunchWas = false;

  constructor(backend: MoeBackend) {
    const ctx = backend.context;
    const layer = (backend as unknown as { gpu?: { layer?: LayerInternals } }).gpu?.layer;
    if (!ctx || !layer) throw new Error("LayerTimer needs a MoE backend on the GPU");
    const ok = Array.isArray(layer.tickets) && typeof layer.next === "number" &&
      typeof layer.setPrelaunch === "function" &&
      layer.tickets.every((t) => t && t.fence && MODES.every((m) => typeof t.submissions?.[m]?.submit === "function" && typeof t.commands?.[m]?.handle === "bigint"));
    if (!ok) throw new Error("LayerTimer: GpuLayer internals changed (tickets[].submissions/fence/commands, next); update scripts/lib/gpu-time.ts");
    this.layer = layer;
    this.device = ctx.device;
    this.period = ctx.device.info.limits.timestampPeriod;
    this.pool = new CommandPool(this.device);
    for (const ticket of layer.tickets) {
      const queries = new QueryPool(this.device, 2);
      const begin = this.pool.allocate().begin().resetQueries(queries).timestamp(queries, 0, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT).end();
      const end = this.pool.allocate().begin().timestamp(queries, 1, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT).end();
      const timed = {
        grouped: new Submission(this.device, [begin, ticket.commands.grouped, end], { fence: ticket.fence }),
        fused: new Submission(this.device, [begin, ticket.commands.fused, end], { fence: ticket.fence }),
      };
      this.parts.push({ ticket, original: { ...ticket.submissions }, timed, queries });
    }
  }

  on(): void {
    // A pre-launched call's timestamps would include its wait for the doorbell: calls are submitted while timed.
    this.prelaunchWas = this.layer.prelaunched;
    this.layer.setPrelaunch(false);
    for (const p of this.parts) Object.assign(p.ticket.submissions, p.timed);
    this.active = true;
  }

  off(): void {
    for (const p of this.parts) Object.assign(p.ticket.submissions, p.original);
    this.layer.setPrelaunch(this.prelaunchWas);
    this.active = false;
  }

  /** GPU ns of the call taken last (call after `take`/`forward`; waits for its timestamps). */
  lastNs(): number {
    if (!this.active) throw new Error("LayerTimer is off");
    const n = this.layer.tickets.length;
    const p = this.parts[(this.layer.next - 1 + n) % n]!;
    const ts = p.queries.results();
    return Number(ts[1]! - ts[0]!) * this.period;
  }

  [Symbol.dispose](): void {
    this.off();
    for (const p of this.parts) {
      for (const m of MODES) p.timed[m][Symbol.dispose]();
      p.queries[Symbol.dispose]();
    }
    this.pool[Symbol.dispose]();
  }
}

/**
 * Counts Vulkan FFI calls made inside `fn` with `countCalls`, then puts the loader's original
 * functions back: the wrappers cost a closure and a Map update per call, and the loader table is
 * shared by every context in the process, so timings taken later stay unwrapped.
 */
export function withCallCounter<T>(vk: CoreCommands, fn: (counter: CallCounter) => T): T {
  const table = vk as unknown as Record<string, unknown>;
  const saved = Object.fromEntries(Object.keys(table).map((k) => [k, table[k]]));
  const counter = countCalls(vk);
  try {
    return fn(counter);
  } finally {
    for (const [k, v] of Object.entries(saved)) table[k] = v;
  }
}
