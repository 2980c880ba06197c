import { VkmoeError } from "../errors.ts";

/**
 * A model file that vkmoe cannot read: its message is one line, `FILE: what is wrong`, naming the
 * tensor where one is at fault and what is supported instead. All subclasses share code "MODEL_FILE".
 */
export class ModelFileError extends VkmoeError {
  /** The file or directory at fault. */
  readonly file: string;
  /** The tensor at fault, when there is one. */
  readonly tensor: string | undefined;
  constructor(file: string, problem: string, options?: ErrorOptions & { tensor?: string }) {
    super("MODEL_FILE", `${file}: ${problem}`, options);
    this.file = file;
    this.tensor = options?.tensor;
  }
}

/** The path, a file a directory needs (model.safetensors, its index), or a shard the index names, does not exist. */
export class ModelFileNotFoundError extends ModelFileError {}

/** The file stops before the header or a tensor's data ends (an interrupted download or copy). */
export class TruncatedFileError extends ModelFileError {}

/** A tensor is stored in an encoding vkmoe does not read (GGUF Q4_K, safetensors I8, ...). */
export class UnsupportedTensorTypeError extends ModelFileError {
  /** The format's own name for the type: "Q4_K", "F8_E4M3", or "type 99" when it has none. */
  readonly type: string;
  constructor(file: string, tensor: string, type: string, problem: string) {
    super(file, problem, { tensor });
    this.type = type;
  }
}
