/** Reads the tokenizer spec of a model directory in the Hugging Face Hub layout. */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { TokenizerLoadError } from "./errors.ts";
import type { TokenizerJsonObject, TokenizerSpec } from "./spec.ts";

/** A JSON file of the directory, or undefined when it is absent and optional. */
export function readDirectoryJson(dir: string, name: string, required: boolean): Record<string, unknown> | undefined {
  const path = join(dir, name);
  if (!existsSync(path)) {
    if (required) throw new TokenizerLoadError(`${path} not found (a tokenizer directory needs tokenizer.json and tokenizer_config.json)`);
    return undefined;
  }
  try {
    const value = JSON.parse(readFileSync(path, "utf8"));
    if (value === null || typeof value !== "object" || Array.isArray(value)) throw new Error("not a JSON object");
    return value;
  } catch (cause) {
    throw new TokenizerLoadError(`${path} is not a readable JSON object: ${(cause as Error).message}`, { cause });
  }
}

/** tokenizer_config.json writes a special token as its text or as an AddedToken object `{ content, ... }`. */
export function specialTokenText(value: unknown): string | undefined {
  if (typeof value === "string") return value;
  if (value && typeof value === "object" && typeof (value as { content?: unknown }).content === "string") return (value as { content: string }).content;
  return undefined;
}

/**
 * EOS ids follow transformers' generate(): generation_config.json's eos_token_id (a number or a
 * list), else config.json's, else the tokenizer's eos_token.
 */
function endOfGenerationIds(dir: string, config: Record<string, unknown>, idOf: (text: string) => number | undefined): number[] {
  for (const name of ["generation_config.json", "config.json"]) {
    const value = readDirectoryJson(dir, name, false)?.eos_token_id;
    const ids = (Array.isArray(value) ? value : [value]).filter((id): id is number => Number.isInteger(id) && id >= 0);
    if (ids.length) return [...new Set(ids)];
  }
  const eos = specialTokenText(config.eos_token);
  const id = eos === undefined ? undefined : idOf(eos);
  return id === undefined ? [] : [id];
}

/** True when the tokenizer prepends BOS: the config says so, or the post-processor's template starts with it. */
function prependsBos(json: TokenizerJsonObject, config: Record<string, unknown>, bos: string | undefined): boolean {
  if (config.add_bos_token === true) return true;
  const single = (json.post_processor as { type?: string; single?: { SpecialToken?: { id?: string } }[] } | null)?.single;
  return bos !== undefined && (json.post_processor as { type?: string } | null)?.type === "TemplateProcessing" && single?.[0]?.SpecialToken?.id === bos;
}

export function tokenizerSpecFromHfDirectory(dir: string): TokenizerSpec {
  const json = readDirectoryJson(dir, "tokenizer.json", true) as unknown as TokenizerJsonObject;
  const config = readDirectoryJson(dir, "tokenizer_config.json", true)!;
  if (!json.model || typeof json.model !== "object" || !json.model.vocab) throw new TokenizerLoadError(`${join(dir, "tokenizer.json")} has no model vocabulary`);
  json.added_tokens ??= [];

  const added = new Map(json.added_tokens.map((t) => [t.content, t.id]));
  const vocab = json.model.vocab;
  // Vocabularies are an object (BPE, WordPiece) or a list of [token, score] (Unigram).
  const vocabIds: number[] = Array.isArray(vocab) ? [vocab.length - 1] : Object.values(vocab);
  const idOf = (text: string) => added.get(text) ?? (Array.isArray(vocab) ? undefined : Object.hasOwn(vocab, text) ? vocab[text] : undefined);

  let maxId = -1;
  for (const id of vocabIds) if (id > maxId) maxId = id;
  for (const t of json.added_tokens) if (t.id > maxId) maxId = t.id;

  const bos = specialTokenText(config.bos_token);
  return {
    json,
    config,
    eosIds: endOfGenerationIds(dir, config, idOf),
    bosId: bos === undefined ? undefined : idOf(bos),
    addBos: prependsBos(json, config, bos),
    vocabSize: maxId + 1,
    source: "hf-directory",
  };
}
