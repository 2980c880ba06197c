/**
 * What a model file holds, whatever its format: named tensors viewed in place (no copy) over a
 * mapped file, and the file's metadata. GGUF and Hugging Face safetensors both come out as this.
 */

/** Tensor encodings vkmoe reads. GGUF's block types (Q8_0, Q4_0, ..., Q6_K) keep their block layout in `bytes`. */
export type TensorDType = "F32" | "F16" | "BF16" | "Q8_0" | "Q4_0" | "Q4_1" | "Q5_0" | "Q5_1" | "Q4_K" | "Q5_K" | "Q6_K";
export const TENSOR_DTYPES: readonly TensorDType[] = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"];

export interface TensorView {
  name: string;
  dtype: TensorDType;
  /**
   * Row-major shape, outermost first (PyTorch order): a [rows, cols] matrix is [rows, cols]. GGUF's
   * `ne` (innermost first) is reversed to this, so `blk.N.ffn_gate_exps.weight` is [E, I, D].
   */
  shape: number[];
  /** The tensor's bytes inside the mapped file: valid while the file that made it is open. */
  bytes: Uint8Array;
  /**
   * Drops the tensor's pages from the process's memory once its data lives elsewhere (on the GPU,
   * converted); `bytes` stays readable (the pages fault back in from the file). Absent on views
   * not backed by a mapped file.
   */
  release?: () => void;
}

/** A parsed, mapped model file (or set of shards). Disposing it unmaps the memory every view points into. */
export interface TensorFile extends Disposable {
  readonly format: "gguf" | "safetensors";
  /** Every tensor by its name in the file. */
  readonly tensors: ReadonlyMap<string, TensorView>;
  /** Bytes mapped, for load reports. */
  readonly mappedBytes: number;
}

/** A GGUF file: its tensors and its key/value metadata as @huggingface/gguf parses it (arrays as JS arrays). */
export interface GgufFile extends TensorFile {
  readonly format: "gguf";
  readonly version: number;
  readonly metadata: Readonly<Record<string, unknown>>;
}

/** A Hugging Face safetensors checkpoint: one file, or the shards a `model.safetensors.index.json` names. */
export interface SafetensorsFile extends TensorFile {
  readonly format: "safetensors";
  /** The files mapped: one, or every shard in the order the index first names them. */
  readonly files: readonly string[];
  /** The `__metadata__` string maps of the files, merged (transformers writes `{ format: "pt" }`). */
  readonly metadata: Readonly<Record<string, string>>;
}
