/**
 * GGUF `tokenizer.*` metadata from a Hugging Face byte-level BPE tokenizer (tokenizer.json and
 * tokenizer_config.json), the way llama.cpp's convert_hf_to_gguf.py writes it for Qwen2/Qwen3
 * (`get_vocab_base` + gguf-py's SpecialVocab): ids past the tokenizer's vocabulary up to the model's
 * vocab size become "[PADi]" of type UNUSED; added tokens are CONTROL when special or when they look
 * special, USER_DEFINED otherwise.
 */
import { readFileSync } from "node:fs";
import type { GgufMetadata } from "./gguf-writer.ts";

/** llama.cpp's token types (llama_token_type). */
export const TokenType = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

export interface BpeTokenizerFiles {
  /** Parsed tokenizer.json. */
  tokenizer: unknown;
  /** Parsed tokenizer_config.json. */
  config: unknown;
}

interface AddedToken {
  id: number;
  content: string;
  special: boolean;
}

interface TokenizerJson {
  added_tokens?: AddedToken[];
  model: { type: string; vocab: Record<string, number>; merges: (string | [string, string])[] };
}

interface TokenizerConfig {
  add_bos_token?: boolean;
  add_eos_token?: boolean;
  bos_token?: string | { content: string } | null;
  eos_token?: string | { content: string } | null;
  pad_token?: string | { content: string } | null;
  chat_template?: string;
}

export interface TokenizerMetadataOptions {
  /** The model's vocab size (rows of token_embd); may exceed the tokenizer's own. */
  vocabSize: number;
  /** `pre` names llama.cpp's pre-tokenizer regex set ("qwen2" for Qwen2/Qwen3). */
  pre: string;
  /**
   * BOS when tokenizer_config.json names none: the converter then takes config.json's
   * bos_token_id (Qwen3: 151643, "<|endoftext|>").
   */
  fallbackBosToken?: string;
}

/** convert_hf_to_gguf.py's does_token_look_special. */
function looksSpecial(token: string): boolean {
  return (
    ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(token) ||
    (token.startsWith("<|") && token.endsWith("|>")) ||
    (token.startsWith("<｜") && token.endsWith("｜>")) ||
    (token.startsWith("<start_of_") && token.endsWith(">")) ||
    (token.startsWith("<end_of_") && token.endsWith(">"))
  );
}

/** gguf-py writes a [left, right] merge as "left right", a space inside a part as U+0120. */
function mergeText(merge: string | [string, string]): string {
  if (typeof merge === "string") return merge;
  return merge.map((part) => part.replaceAll(" ", "\u0120")).join(" ");
}

function tokenContent(t: TokenizerConfig["bos_token"]): string | undefined {
  if (t === null || t === undefined) return undefined;
  return typeof t === "string" ? t : t.content;
}

/** The tokenizer's metadata entries, in the converter's order. */
export function tokenizerMetadata(files: BpeTokenizerFiles, options: TokenizerMetadataOptions): GgufMetadata {
  const tok = files.tokenizer as TokenizerJson;
  const config = files.config as TokenizerConfig;
  if (tok?.model?.type !== "BPE") throw new Error(`tokenizer.json: model type ${JSON.stringify(tok?.model?.type)} is not BPE`);

  const byId = new Map<number, string>();
  for (const [text, id] of Object.entries(tok.model.vocab)) byId.set(id, text);
  const added = new Map<number, AddedToken>();
  for (const a of tok.added_tokens ?? []) {
    added.set(a.id, a);
    byId.set(a.id, a.content);
  }
  let maxId = -1;
  for (const id of byId.keys()) if (id > maxId) maxId = id;
  if (maxId >= options.vocabSize) throw new Error(`tokenizer has token id ${maxId}, past the model's vocab size ${options.vocabSize}`);

  const tokens: string[] = new Array(options.vocabSize);
  const types = new Int32Array(options.vocabSize);
  for (let id = 0; id < options.vocabSize; id++) {
    const text = byId.get(id);
    const a = added.get(id);
    if (text === undefined) {
      tokens[id] = `[PAD${id}]`;
      types[id] = TokenType.UNUSED;
    } else if (a) {
      const control = a.special || looksSpecial(text);
      // The converter pre-normalizes SentencePiece spaces in user-defined tokens.
      tokens[id] = control ? text : text.replaceAll("\u2581", " ");
      types[id] = control ? TokenType.CONTROL : TokenType.USER_DEFINED;
    } else {
      tokens[id] = text;
      types[id] = TokenType.NORMAL;
    }
  }

  const idOf = (content: string | undefined, what: string): number | undefined => {
    if (content === undefined) return undefined;
    const id = [...added.values()].find((a) => a.content === content)?.id ?? tok.model.vocab[content];
    if (id === undefined) throw new Error(`tokenizer_config.json: ${what} ${JSON.stringify(content)} is not a token`);
    return id;
  };
  const eos = idOf(tokenContent(config.eos_token), "eos_token");
  const pad = idOf(tokenContent(config.pad_token), "pad_token");
  const bos = idOf(tokenContent(config.bos_token) ?? options.fallbackBosToken, "bos_token");

  const meta: [string, GgufMetadata[number][1]][] = [
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: options.pre }],
    ["tokenizer.ggml.tokens", { type: "array", of: "string", value: tokens }],
    ["tokenizer.ggml.token_type", { type: "array", of: "i32", value: types }],
    ["tokenizer.ggml.merges", { type: "array", of: "string", value: tok.model.merges.map(mergeText) }],
  ];
  if (eos !== undefined) meta.push(["tokenizer.ggml.eos_token_id", { type: "u32", value: eos }]);
  if (pad !== undefined) meta.push(["tokenizer.ggml.padding_token_id", { type: "u32", value: pad }]);
  if (bos !== undefined) meta.push(["tokenizer.ggml.bos_token_id", { type: "u32", value: bos }]);
  if (typeof config.add_bos_token === "boolean") meta.push(["tokenizer.ggml.add_bos_token", { type: "bool", value: config.add_bos_token }]);
  if (typeof config.add_eos_token === "boolean") meta.push(["tokenizer.ggml.add_eos_token", { type: "bool", value: config.add_eos_token }]);
  if (typeof config.chat_template === "string") meta.push(["tokenizer.chat_template", { type: "string", value: config.chat_template }]);
  return meta;
}

/** Reads tokenizer.json and tokenizer_config.json from `dir`. */
export function readTokenizerFiles(dir: string): BpeTokenizerFiles {
  const read = (name: string) => JSON.parse(readFileSync(`${dir}/${name}`, "utf8")) as unknown;
  return { tokenizer: read("tokenizer.json"), config: read("tokenizer_config.json") };
}
