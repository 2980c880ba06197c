/**
 * One chunk of rows of a random tensor, drawn and encoded: the unit of work of writing a random
 * model, done in the main thread or in a worker (random-chunk-worker.ts) with the same bytes.
 */
import { encodeAs } from "../formats/ggml-quantize.ts";
import type { GgmlTypeName } from "../formats/gguf-writer.ts";
import { WeightStream } from "./random-weights.ts";

export interface ChunkJob {
  seed: number;
  tensor: number;
  chunk: number;
  type: GgmlTypeName;
  /** Values in the chunk: whole rows. */
  values: number;
  mean: number;
  std: number;
  /** K-quant tensors: GGML's scale search (KQuantOptions.search). */
  kQuantSearch: boolean;
}

/** Bytes a chunk of `values` f32 values may take once encoded (F32 is the largest). */
export const encodedBound = (values: number): number => values * 4;

/** Draws the chunk into `scratch` and encodes it into `out`; returns the encoded length. */
export function makeChunk(job: ChunkJob, scratch: Float32Array, out: Uint8Array): number {
  const values = scratch.subarray(0, job.values);
  new WeightStream(job.seed, job.tensor, job.chunk).fill(values, job.mean, job.std);
  return encodeAs(job.type, values, out, 0, { search: job.kQuantSearch });
}
