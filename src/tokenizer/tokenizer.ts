/**
 * Text ⇄ token ids for a model, from its Hugging Face directory or its GGUF metadata, through one
 * implementation: @huggingface/tokenizers' Tokenizer, fed either the directory's tokenizer.json or
 * the one rebuilt from the GGUF vocabulary (gguf-vocabulary.ts).
 *
 * End-of-generation ids (`eosIds`) follow each source's own runtime:
 * - HF directory: transformers' generate() — generation_config.json's eos_token_id (number or
 *   list), else config.json's, else tokenizer_config's eos_token.
 * - GGUF: llama.cpp — the eos/eot/eom ids in the metadata plus added tokens named like an end of
 *   turn (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...; FIM tokens excluded).
 * So the same model can list more stop ids from its GGUF (Qwen3: 151645 and 151643) than from a
 * directory whose generation_config names one (151645).
 */
import { Tokenizer } from "@huggingface/tokenizers";
import { InvalidArgumentError } from "../errors.ts";
import { byteLevelToBytes } from "./byte-level.ts";
import { TokenizerLoadError, UnsupportedTokenizerError } from "./errors.ts";
import { tokenizerSpecFromGguf } from "./gguf-vocabulary.ts";
import { specialTokenText, tokenizerSpecFromHfDirectory } from "./hf-directory.ts";
import type { TokenizerSpec } from "./spec.ts";

export interface EncodeOptions {
  /**
   * Match special (control) tokens written in the text, like `<|im_start|>`, as HF does (default
   * true). False tokenizes them as plain text (HF's split_special_tokens, llama.cpp's
   * parse_special=false); non-special added tokens such as `<think>` are matched either way.
   */
  special?: boolean;
  /** Prepend `bosId` (default false: chat templates write BOS themselves; see `addBos`). */
  addBos?: boolean;
}

export interface DecodeOptions {
  /** Drop special tokens (default false: they decode to their text). */
  skipSpecial?: boolean;
}

interface AddedToken {
  content: string;
  special: boolean;
}

type Pipeline = {
  normalizer: ((text: string) => string) | null;
  pre_tokenizer: ((text: string) => string[]) | null;
  model: ((pieces: string[]) => string[]) & { tokens_to_ids: Map<string, number>; vocab: (string | undefined)[] };
};

export class TextTokenizer {
  /** One past the highest id the tokenizer knows; a model's embedding may have more rows, which decode to "". */
  readonly vocabSize: number;
  /** Ids that end generation, primary EOS first (rule per source in the module comment). */
  readonly eosIds: readonly number[];
  /** The source's BOS id, if it names one. */
  readonly bosId: number | undefined;
  /** Whether the source prepends BOS to a raw prompt (pass `addBos: true` to encode to do so). */
  readonly addBos: boolean;
  readonly source: TokenizerSpec["source"];
  /** Special token texts as chat templates receive them (bos_token, eos_token, pad_token, unk_token). */
  readonly specialTokens: Readonly<Record<string, string>>;
  /** True when tokens spell bytes through GPT-2's table (ByteLevel decoder); the streaming detokenizer needs it. */
  readonly byteLevel: boolean;

  private readonly hf: Tokenizer;
  private readonly pipeline: Pipeline;
  private readonly added = new Map<number, AddedToken>();
  private readonly eosSet: ReadonlySet<number>;
  /** Splits text around the non-special added tokens, for encoding with `special: false`. */
  private readonly nonSpecialSplitter: RegExp | undefined;
  private readonly nonSpecialIds = new Map<string, number>();
  private readonly bytesCache: (Uint8Array | undefined)[] = [];

  constructor(spec: TokenizerSpec) {
    try {
      this.hf = new Tokenizer(spec.json, spec.config);
    } catch (cause) {
      throw new TokenizerLoadError(`@huggingface/tokenizers rejected the tokenizer (${spec.source}): ${(cause as Error).message}`, { cause });
    }
    this.pipeline = this.hf as unknown as Pipeline;
    this.vocabSize = spec.vocabSize;
    this.eosIds = Object.freeze([...spec.eosIds]);
    this.eosSet = new Set(spec.eosIds);
    this.bosId = spec.bosId;
    this.addBos = spec.addBos && spec.bosId !== undefined;
    this.source = spec.source;
    this.byteLevel = spec.json.decoder?.type === "ByteLevel";

    // tokenizer_config's additional_special_tokens are special too, as the library treats them when skipping.
    const extraSpecial = new Set((Array.isArray(spec.config.additional_special_tokens) ? spec.config.additional_special_tokens : []).map(specialTokenText));
    for (const t of spec.json.added_tokens) {
      const special = Boolean(t.special) || extraSpecial.has(t.content);
      this.added.set(t.id, { content: t.content, special });
      if (!special) this.nonSpecialIds.set(t.content, t.id);
    }
    if (this.nonSpecialIds.size) {
      // Longest first, so that a token that is a prefix of another never wins.
      const alternatives = [...this.nonSpecialIds.keys()].sort((a, b) => b.length - a.length).map(escapeRegExp);
      this.nonSpecialSplitter = new RegExp(`(${alternatives.join("|")})`, "u");
    }

    const specialTokens: Record<string, string> = {};
    for (const key of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
      const text = specialTokenText(spec.config[key]);
      if (text !== undefined) specialTokens[key] = text;
    }
    this.specialTokens = Object.freeze(specialTokens);
  }

  /** From tokenizer.json + tokenizer_config.json (+ generation_config.json / config.json for EOS ids) in `dir`. */
  static fromHfDirectory(dir: string): TextTokenizer {
    return new TextTokenizer(tokenizerSpecFromHfDirectory(dir));
  }

  /** From a GGUF file's metadata record, exactly as @huggingface/gguf returns it. */
  static fromGgufMetadata(metadata: Record<string, unknown>): TextTokenizer {
    return new TextTokenizer(tokenizerSpecFromGguf(metadata));
  }

  encode(text: string, options: EncodeOptions = {}): number[] {
    if (typeof text !== "string") throw new InvalidArgumentError(`encode: text must be a string, got ${typeof text}`);
    const ids = options.special === false ? this.encodeSpecialsAsText(text) : this.hf.encode(text, { add_special_tokens: false }).ids;
    if (options.addBos && this.bosId !== undefined) ids.unshift(this.bosId);
    return ids;
  }

  /** Text of `ids`; ids the tokenizer does not know (embedding padding rows) decode to "", as in HF. */
  decode(ids: ArrayLike<number>, options: DecodeOptions = {}): string {
    const known: number[] = [];
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      checkId(id, i);
      if (this.pipeline.model.vocab[id] === undefined) continue;
      if (options.skipSpecial && this.isSpecial(id)) continue;
      known.push(id);
    }
    // The library throws on an empty list.
    return known.length ? this.hf.decode(known, { skip_special_tokens: false }) : "";
  }

  /** The vocabulary's string for `id` (ByteLevel spelling, e.g. "Ġhello"; an added token's content), or undefined. */
  tokenText(id: number): string | undefined {
    return this.pipeline.model.vocab[id];
  }

  /** The id of a vocabulary string or added token (`tokenId("<|im_end|>")`), or undefined. */
  tokenId(text: string): number | undefined {
    return this.hf.token_to_id(text);
  }

  /** True for special (control) added tokens: the ones skipSpecial drops and `special: false` does not match. */
  isSpecial(id: number): boolean {
    return this.added.get(id)?.special ?? false;
  }

  /** True for an added token (special or not), which decodes to its content verbatim. */
  isAdded(id: number): boolean {
    return this.added.has(id);
  }

  isEndOfGeneration(id: number): boolean {
    return this.eosSet.has(id);
  }

  /**
   * The UTF-8 bytes token `id` contributes to decoded text (empty for unknown ids): its content for
   * an added token, the bytes its ByteLevel spelling stands for otherwise. Needs a ByteLevel tokenizer.
   */
  tokenBytes(id: number): Uint8Array {
    const cached = this.bytesCache[id];
    if (cached) return cached;
    checkId(id, 0);
    if (!this.byteLevel) throw new UnsupportedTokenizerError("decoder for byte-level streaming", "not ByteLevel", ["ByteLevel"]);
    const text = this.pipeline.model.vocab[id];
    let bytes: Uint8Array;
    if (text === undefined) bytes = new Uint8Array(0);
    else if (this.added.has(id)) bytes = new TextEncoder().encode(text);
    else {
      const spelled = byteLevelToBytes(text);
      if (!spelled) throw new TokenizerLoadError(`token ${id} ${JSON.stringify(text)} has a character outside the ByteLevel table`);
      bytes = spelled;
    }
    this.bytesCache[id] = bytes;
    return bytes;
  }

  /** The library's pipeline with only non-special added tokens matched: special tokens go through BPE as text. */
  private encodeSpecialsAsText(text: string): number[] {
    const { normalizer, pre_tokenizer, model } = this.pipeline;
    const sections = this.nonSpecialSplitter ? text.split(this.nonSpecialSplitter) : [text];
    const ids: number[] = [];
    for (const section of sections) {
      if (!section) continue;
      const addedId = this.nonSpecialIds.get(section);
      if (addedId !== undefined) {
        ids.push(addedId);
        continue;
      }
      const normalized = normalizer ? normalizer(section) : section;
      const pieces = pre_tokenizer ? pre_tokenizer(normalized) : [normalized];
      for (const token of model(pieces)) {
        const id = model.tokens_to_ids.get(token);
        if (id === undefined) throw new TokenizerLoadError(`BPE produced ${JSON.stringify(token)}, which is not in the vocabulary`);
        ids.push(id);
      }
    }
    return ids;
  }
}

function checkId(id: number, index: number): void {
  if (!Number.isInteger(id) || id < 0) throw new InvalidArgumentError(`token id at ${index} is ${id}, not a non-negative integer`);
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}
