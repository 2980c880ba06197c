/** Every error vkmoe throws on purpose derives from this, with a stable machine-readable code. */
export class VkmoeError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** Bad arguments from the caller: wrong shapes, types, sizes or values. Raised before anything reaches C or the GPU. */
export class InvalidArgumentError extends VkmoeError {
  constructor(message: string, options?: ErrorOptions) {
    super("INVALID_ARGUMENT", message, options);
  }
}
