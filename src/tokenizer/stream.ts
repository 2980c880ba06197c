/**
 * Incremental detokenizer for generation: push one id, get the text it completes.
 *
 * It works on bytes, not by re-decoding: each token's bytes (GPT-2 table, cached per id) go into
 * one streaming TextDecoder, which emits every complete character and holds back the bytes of
 * one split across tokens. Cost per token is its own length, whatever has been generated before.
 * The concatenation of the deltas plus flush() equals TextTokenizer.decode of all the ids:
 * added tokens (`<|im_end|>`, `<think>`) end a byte run there, as in decode, so bytes still
 * pending then become U+FFFD, and so do invalid sequences; valid UTF-8 never does.
 */
import { UnsupportedTokenizerError } from "./errors.ts";
import type { TextTokenizer } from "./tokenizer.ts";

export interface TokenTextStreamOptions {
  /** Special tokens add no text (default false: they add their text, as decode does). */
  skipSpecial?: boolean;
}

export class TokenTextStream {
  private readonly tokenizer: TextTokenizer;
  private readonly skipSpecial: boolean;
  // ignoreBOM keeps a leading U+FEFF, as the tokenizer's own decoder does.
  private readonly utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

  constructor(tokenizer: TextTokenizer, options: TokenTextStreamOptions = {}) {
    if (!tokenizer.byteLevel) throw new UnsupportedTokenizerError("decoder for TokenTextStream", "not ByteLevel", ["ByteLevel"]);
    this.tokenizer = tokenizer;
    this.skipSpecial = options.skipSpecial ?? false;
  }

  /** The text `id` completes: "" while a character is still incomplete. */
  push(id: number): string {
    if (this.skipSpecial && this.tokenizer.isSpecial(id)) return "";
    if (this.tokenizer.isAdded(id)) return this.utf8.decode() + this.tokenizer.tokenText(id)!;
    return this.utf8.decode(this.tokenizer.tokenBytes(id), { stream: true });
  }

  /** The text of bytes still held back (U+FFFD for an incomplete character) at the end of a generation; the stream can then be reused. */
  flush(): string {
    return this.utf8.decode();
  }
}
