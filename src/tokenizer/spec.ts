/** What a TextTokenizer is built from, whichever source (an HF directory or GGUF metadata) it came from. */

export interface TokenizerSpec {
  /** A tokenizer.json object, as @huggingface/tokenizers' Tokenizer takes it. */
  json: TokenizerJsonObject;
  /** A tokenizer_config.json object (special token names, clean-up flags). */
  config: Record<string, unknown>;
  /** Ids that end generation, the first being the primary EOS (see tokenizer.ts for the rule per source). */
  eosIds: number[];
  /** The source's BOS id, if it names one (whether it is prepended is `addBos`). */
  bosId?: number;
  /** Whether the source asks for BOS to be prepended to a prompt. */
  addBos: boolean;
  /** One past the highest token id the source defines (added tokens included). */
  vocabSize: number;
  source: "hf-directory" | "gguf";
}

export interface AddedTokenEntry {
  id: number;
  content: string;
  single_word: boolean;
  lstrip: boolean;
  rstrip: boolean;
  normalized: boolean;
  special: boolean;
}

export interface TokenizerJsonObject {
  added_tokens: AddedTokenEntry[];
  normalizer: unknown;
  pre_tokenizer: unknown;
  post_processor: unknown;
  decoder: { type: string } & Record<string, unknown>;
  model: { type: string; vocab: Record<string, number>; merges?: unknown[] } & Record<string, unknown>;
  [key: string]: unknown;
}
