/**
 * Rebuilds the tokenizer.json that a GGUF file's vocabulary came from, so that one tokenizer
 * implementation (@huggingface/tokenizers) serves both sources with the same ids.
 *
 * llama.cpp's converter stores the BPE vocabulary, its merges, a type per token and the name of
 * the pre-tokenizer (`tokenizer.ggml.pre`), not the pre-tokenizer itself; each supported name maps
 * to the exact components of the HF tokenizer.json it was converted from.
 */
import { TokenizerLoadError, UnsupportedTokenizerError } from "./errors.ts";
import type { AddedTokenEntry, TokenizerJsonObject, TokenizerSpec } from "./spec.ts";

/** llama.cpp's llama_token_type values, as `tokenizer.ggml.token_type` stores them. */
export const GgufTokenType = { undefined: 0, normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6 } as const;

export const SUPPORTED_GGUF_MODELS = ["gpt2"] as const;

/** The split regex of Qwen2/Qwen3's tokenizer.json, character for character. */
const QWEN2_SPLIT_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

const BYTE_LEVEL = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };

/** Normalizer and pre-tokenizer per `tokenizer.ggml.pre`, as the HF tokenizer.json has them. */
const PRE_TOKENIZERS: Record<string, { normalizer: unknown; pre_tokenizer: unknown }> = {
  qwen2: {
    normalizer: { type: "NFC" },
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: QWEN2_SPLIT_PATTERN }, behavior: "Isolated", invert: false },
        { ...BYTE_LEVEL },
      ],
    },
  },
};

export const SUPPORTED_GGUF_PRE = Object.keys(PRE_TOKENIZERS);

/**
 * Token texts llama.cpp treats as end of generation when a vocabulary has them (llama-vocab.cpp's
 * EOG list), beside the explicit eos/eot/eom ids. Its FIM pad/repo/file-separator tokens, which it
 * also adds for infill, are left out: this engine does chat and completion, not infill.
 */
const LLAMA_CPP_EOG_TEXTS = new Set([
  "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
  "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
]);

/** Builds the tokenizer spec from GGUF metadata, as @huggingface/gguf returns it. */
export function tokenizerSpecFromGguf(metadata: Record<string, unknown>): TokenizerSpec {
  const model = requireString(metadata, "tokenizer.ggml.model");
  if (!(SUPPORTED_GGUF_MODELS as readonly string[]).includes(model)) {
    throw new UnsupportedTokenizerError("tokenizer.ggml.model", model, SUPPORTED_GGUF_MODELS);
  }
  // llama.cpp falls back to GPT-2's own regex when `pre` is absent; no supported model relies on that.
  const pre = optionalString(metadata, "tokenizer.ggml.pre") ?? "(absent)";
  const preTokenizer = Object.hasOwn(PRE_TOKENIZERS, pre) ? PRE_TOKENIZERS[pre]! : undefined;
  if (!preTokenizer) throw new UnsupportedTokenizerError("tokenizer.ggml.pre", pre, SUPPORTED_GGUF_PRE);

  const tokens = requireArray(metadata, "tokenizer.ggml.tokens");
  const types = optionalArray(metadata, "tokenizer.ggml.token_type");
  const merges = requireArray(metadata, "tokenizer.ggml.merges");
  if (types && types.length !== tokens.length) {
    throw new TokenizerLoadError(`tokenizer.ggml.token_type has ${types.length} entries for ${tokens.length} tokens`);
  }

  // A null-prototype object: a vocabulary may hold "__proto__" as a token.
  const vocab: Record<string, number> = Object.create(null);
  const added: AddedTokenEntry[] = [];
  for (let id = 0; id < tokens.length; id++) {
    const text = tokens[id];
    if (typeof text !== "string") throw new TokenizerLoadError(`tokenizer.ggml.tokens[${id}] is not a string`);
    const type = types ? Number(types[id]) : GgufTokenType.normal;
    if (type === GgufTokenType.control || type === GgufTokenType.userDefined) {
      // Both are matched verbatim in text, before the pre-tokenizer (HF added tokens; llama.cpp's
      // special-token pass); only control tokens are special, i.e. dropped by skipSpecial.
      added.push({ id, content: text, single_word: false, lstrip: false, rstrip: false, normalized: false, special: type === GgufTokenType.control });
    } else if (type !== GgufTokenType.unused) {
      // Unused ids (the converter's [PAD…] rows up to the embedding size) are not in the HF vocabulary and decode to nothing.
      vocab[text] = id;
    }
  }

  const json: TokenizerJsonObject = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    // Copies: a caller may edit its spec, and the table is shared.
    normalizer: structuredClone(preTokenizer.normalizer),
    pre_tokenizer: structuredClone(preTokenizer.pre_tokenizer),
    post_processor: { ...BYTE_LEVEL },
    decoder: { ...BYTE_LEVEL },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: "",
      end_of_word_suffix: "",
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: mergePairs(merges),
    },
  };

  const bosId = optionalId(metadata, "tokenizer.ggml.bos_token_id", tokens.length);
  const eosId = optionalId(metadata, "tokenizer.ggml.eos_token_id", tokens.length);
  const padId = optionalId(metadata, "tokenizer.ggml.padding_token_id", tokens.length);
  const textOf = (id: number | undefined) => (id === undefined ? undefined : (tokens[id] as string));
  const config: Record<string, unknown> = {
    bos_token: textOf(bosId),
    eos_token: textOf(eosId),
    pad_token: textOf(padId),
    add_prefix_space: false,
    clean_up_tokenization_spaces: false, // the library's default is true; Qwen's config says false
    split_special_tokens: false,
  };

  return {
    json,
    config,
    eosIds: ggufEndOfGenerationIds(metadata, added, tokens.length, eosId),
    bosId,
    addBos: metadata["tokenizer.ggml.add_bos_token"] === true,
    vocabSize: tokens.length,
    source: "gguf",
  };
}

/** llama.cpp's rule: the explicit eos, eot and eom ids, then every added token named like an end of turn. */
function ggufEndOfGenerationIds(metadata: Record<string, unknown>, added: AddedTokenEntry[], size: number, eosId: number | undefined): number[] {
  const ids = new Set<number>();
  for (const id of [eosId, optionalId(metadata, "tokenizer.ggml.eot_token_id", size), optionalId(metadata, "tokenizer.ggml.eom_token_id", size)]) {
    if (id !== undefined) ids.add(id);
  }
  for (const token of added) if (LLAMA_CPP_EOG_TEXTS.has(token.content)) ids.add(token.id);
  return [...ids];
}

/** GGUF stores a merge as "left right"; split at the first space after the first character, as llama.cpp does. */
function mergePairs(merges: ArrayLike<unknown>): [string, string][] {
  const pairs: [string, string][] = new Array(merges.length);
  for (let i = 0; i < merges.length; i++) {
    const merge = merges[i];
    const space = typeof merge === "string" ? merge.indexOf(" ", 1) : -1;
    if (space < 0) throw new TokenizerLoadError(`tokenizer.ggml.merges[${i}] is not "left right": ${JSON.stringify(merge)}`);
    pairs[i] = [(merge as string).slice(0, space), (merge as string).slice(space + 1)];
  }
  return pairs;
}

function requireString(metadata: Record<string, unknown>, key: string): string {
  const value = optionalString(metadata, key);
  if (value === undefined) throw new TokenizerLoadError(`GGUF metadata has no ${key} (a string): no tokenizer to build`);
  return value;
}

function optionalString(metadata: Record<string, unknown>, key: string): string | undefined {
  const value = metadata[key];
  if (value === undefined) return undefined;
  if (typeof value !== "string") throw new TokenizerLoadError(`GGUF metadata ${key} is a ${typeof value}, expected a string`);
  return value;
}

function optionalArray(metadata: Record<string, unknown>, key: string): ArrayLike<unknown> | undefined {
  const value = metadata[key];
  if (value === undefined) return undefined;
  if (!Array.isArray(value) && !ArrayBuffer.isView(value)) throw new TokenizerLoadError(`GGUF metadata ${key} is not an array`);
  return value as ArrayLike<unknown>;
}

function requireArray(metadata: Record<string, unknown>, key: string): ArrayLike<unknown> {
  const value = optionalArray(metadata, key);
  if (value === undefined) throw new TokenizerLoadError(`GGUF metadata has no ${key}`);
  return value;
}

/** A token id key (uint32 in the file; a number or bigint here), checked against the vocabulary. */
function optionalId(metadata: Record<string, unknown>, key: string, size: number): number | undefined {
  const value = metadata[key];
  if (value === undefined) return undefined;
  const id = typeof value === "bigint" ? Number(value) : value;
  if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= size) {
    throw new TokenizerLoadError(`GGUF metadata ${key} = ${String(value)} is not a token id below ${size}`);
  }
  return id;
}
