/** Typed errors of the tokenizer module. Bad ids passed to decode are the shared InvalidArgumentError. */
import { VkmoeError } from "../errors.ts";

/** A tokenizer kind this module cannot reproduce exactly; the message names what was found and what is supported. */
export class UnsupportedTokenizerError extends VkmoeError {
  /** Which setting it is, e.g. `tokenizer.ggml.model`. */
  readonly setting: string;
  readonly found: string;
  readonly supported: readonly string[];
  constructor(setting: string, found: string, supported: readonly string[]) {
    super("UNSUPPORTED_TOKENIZER", `unsupported ${setting} ${JSON.stringify(found)}; supported: ${supported.map((s) => JSON.stringify(s)).join(", ")}`);
    this.setting = setting;
    this.found = found;
    this.supported = supported;
  }
}

/** Tokenizer files or GGUF metadata that are missing, unreadable or malformed. */
export class TokenizerLoadError extends VkmoeError {
  constructor(message: string, options?: ErrorOptions) {
    super("TOKENIZER_LOAD", message, options);
  }
}

/** Where a chat template failed: there is none, it does not parse, or it threw while rendering (its own raise_exception included). */
export type ChatTemplatePhase = "missing" | "parse" | "render";

export class ChatTemplateError extends VkmoeError {
  readonly phase: ChatTemplatePhase;
  constructor(phase: ChatTemplatePhase, message: string, options?: ErrorOptions) {
    super("CHAT_TEMPLATE", message, options);
    this.phase = phase;
  }
}
