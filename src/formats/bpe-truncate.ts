/**
 * A byte-level BPE tokenizer cut down to `size` tokens, for small test models (a 151936-row
 * embedding would dwarf every other tensor): the ordinary tokens with the lowest ids, the merges
 * whose parts and result all stay, and every added (special) token renumbered after them. Qwen's
 * merges are ranked in id order (merge i makes token 256 + i), so the result is the first
 * `size - added` tokens and the merges that made them: the same tokenizer on text those tokens cover.
 */
import type { BpeTokenizerFiles } from "./hf-tokenizer-gguf.ts";

interface AddedToken {
  id: number;
  content: string;
  [key: string]: unknown;
}

interface TokenizerJson {
  added_tokens?: AddedToken[];
  model: { type: string; vocab: Record<string, number>; merges: (string | [string, string])[]; [key: string]: unknown };
  [key: string]: unknown;
}

export class TokenizerTruncateError extends Error {}

export function truncateBpeTokenizer(files: BpeTokenizerFiles, size: number): BpeTokenizerFiles {
  const tok = files.tokenizer as TokenizerJson;
  if (tok?.model?.type !== "BPE") throw new TokenizerTruncateError(`tokenizer.json: model type ${JSON.stringify(tok?.model?.type)} is not BPE`);
  const added = [...(tok.added_tokens ?? [])].sort((a, b) => a.id - b.id);
  const ordinary = size - added.length;
  // 256 byte tokens at least: every byte must stay encodable.
  if (!Number.isInteger(size) || ordinary < 256) {
    throw new TokenizerTruncateError(`a vocab of ${size} cannot hold the 256 byte tokens and ${added.length} special tokens (at least ${256 + added.length})`);
  }
  const kept = Object.entries(tok.model.vocab).sort((a, b) => a[1] - b[1]).slice(0, ordinary);
  const ids = new Map(kept.map(([text], i) => [text, i])); // ids stay dense: 0 .. ordinary-1
  const merges = tok.model.merges.filter((m) => {
    const [a, b] = typeof m === "string" ? (m.split(" ") as [string, string]) : m;
    return ids.has(a) && ids.has(b) && ids.has(`${a}${b}`);
  });
  const vocab = Object.fromEntries(ids);
  const renumbered = added.map((t, i) => ({ ...t, id: ordinary + i }));
  return {
    tokenizer: { ...tok, added_tokens: renumbered, model: { ...tok.model, vocab, merges } },
    // tokenizer_config.json names special tokens by content, which does not change.
    config: files.config,
  };
}
