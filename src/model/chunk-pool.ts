/**
 * Makes ChunkJobs on worker threads (Web Workers: Bun and Deno alike), or in this thread when
 * given one thread. Results come back as promises; the caller awaits them in its own order.
 */
import { type ChunkJob, encodedBound, makeChunk } from "./random-chunk.ts";

interface Pending {
  resolve: (bytes: Uint8Array) => void;
  reject: (e: Error) => void;
}

type Reply = { id: number; bytes: ArrayBuffer; length: number } | { id: number; error: string };

export class ChunkPool implements Disposable {
  private readonly workers: Worker[] = [];
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  private nextWorker = 0;
  private scratch = new Float32Array(0);
  private failure: Error | undefined;

  constructor(readonly threads: number) {
    if (!Number.isInteger(threads) || threads < 1) throw new RangeError(`threads must be a positive integer, got ${threads}`);
    if (threads === 1) return;
    const url = new URL("./random-chunk-worker.ts", import.meta.url).href;
    for (let i = 0; i < threads; i++) {
      const w = new Worker(url, { type: "module" });
      w.onmessage = (e: MessageEvent<Reply>) => this.settle(e.data);
      w.onerror = (e: ErrorEvent) => {
        e.preventDefault?.();
        this.fail(new Error(`chunk worker failed: ${e.message}`));
      };
      this.workers.push(w);
    }
  }

  /** The encoded bytes of `job`. Jobs go to the workers in turn, so equal jobs balance evenly. */
  make(job: ChunkJob): Promise<Uint8Array> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.workers.length === 0) {
      if (this.scratch.length < job.values) this.scratch = new Float32Array(job.values);
      const out = new Uint8Array(encodedBound(job.values));
      return Promise.resolve(out.subarray(0, makeChunk(job, this.scratch, out)));
    }
    const id = this.nextId++;
    const worker = this.workers[this.nextWorker]!;
    this.nextWorker = (this.nextWorker + 1) % this.workers.length;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      worker.postMessage({ id, job });
    });
  }

  private settle(reply: Reply): void {
    const p = this.pending.get(reply.id);
    if (!p) return;
    this.pending.delete(reply.id);
    if ("error" in reply) p.reject(new Error(reply.error));
    else p.resolve(new Uint8Array(reply.bytes, 0, reply.length));
  }

  private fail(e: Error): void {
    this.failure ??= e;
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
  }

  [Symbol.dispose](): void {
    for (const w of this.workers) w.terminate();
    this.workers.length = 0;
    this.fail(new Error("chunk pool closed"));
  }
}
