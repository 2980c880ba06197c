/** Worker side of the chunk pool: makes each ChunkJob it is sent and posts back the encoded bytes. */
import { type ChunkJob, encodedBound, makeChunk } from "./random-chunk.ts";

let scratch = new Float32Array(0);

const self = globalThis as unknown as {
  onmessage: ((e: MessageEvent<{ id: number; job: ChunkJob }>) => void) | null;
  postMessage(message: unknown, transfer: ArrayBuffer[]): void;
};

self.onmessage = (e) => {
  const { id, job } = e.data;
  try {
    if (scratch.length < job.values) scratch = new Float32Array(job.values);
    const out = new Uint8Array(encodedBound(job.values));
    const length = makeChunk(job, scratch, out);
    self.postMessage({ id, bytes: out.buffer, length }, [out.buffer]);
  } catch (err) {
    self.postMessage({ id, error: err instanceof Error ? err.message : String(err) }, []);
  }
};
