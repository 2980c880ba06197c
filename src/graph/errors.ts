import { VkmoeError } from "../errors.ts";

/** The model (or this device) cannot run the whole token on the GPU; the message says why. */
export class GraphUnsupportedError extends VkmoeError {
  constructor(message: string, options?: ErrorOptions) {
    super("GRAPH_UNSUPPORTED", message, options);
  }
}
