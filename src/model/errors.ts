/** Errors of the model layer: a model this engine cannot run, or a request it cannot serve. Each message names the problem for a user. */
import { VkmoeError } from "../errors.ts";

/** config.json / GGUF metadata missing, malformed, or describing an architecture or feature vkmoe does not run. */
export class ModelConfigError extends VkmoeError {
  constructor(message: string, options?: ErrorOptions) {
    super("MODEL_CONFIG", message, options);
  }
}

/** A tensor the architecture needs is missing, or has the wrong shape or type. */
export class ModelWeightsError extends VkmoeError {
  constructor(message: string, options?: ErrorOptions) {
    super("MODEL_WEIGHTS", message, options);
  }
}

/** A prompt or a generation that does not fit the session's context. */
export class ContextLengthError extends VkmoeError {
  constructor(message: string) {
    super("CONTEXT_LENGTH", message);
  }
}
