/**
 * The response objects, in OpenAI's shapes: chat.completion, chat.completion.chunk, text_completion
 * (whole and streamed), usage, and logprobs (chat's `content` list and completions' legacy lists).
 */
import type { FinishReason, GeneratedToken } from "../engine/index.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";

export interface ResponseIdentity {
  id: string;
  created: number;
  model: string;
  systemFingerprint: string;
}

export function newIdentity(prefix: "chatcmpl" | "cmpl", model: string, systemFingerprint: string): ResponseIdentity {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  const id = `${prefix}-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
  return { id, created: Math.floor(Date.now() / 1000), model, systemFingerprint };
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export const usageOf = (promptTokens: number, completionTokens: number): Usage => ({
  prompt_tokens: promptTokens,
  completion_tokens: completionTokens,
  total_tokens: promptTokens + completionTokens,
});

// --- chat ---------------------------------------------------------------------------------------

export interface ChatLogprobEntry {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

export function chatLogprobs(tokenizer: TextTokenizer, tokens: readonly GeneratedToken[]): ChatLogprobEntry[] {
  return tokens.map((t) => ({
    ...tokenEntry(tokenizer, t.id, t.logprob ?? 0),
    top_logprobs: (t.topLogprobs ?? []).map((c) => tokenEntry(tokenizer, c.token, c.logprob)),
  }));
}

export interface ChatReply {
  content: string;
  reasoning?: string;
  finishReason: FinishReason;
  logprobs?: ChatLogprobEntry[];
  usage: Usage;
}

export function chatCompletion(who: ResponseIdentity, reply: ChatReply): Record<string, unknown> {
  const message: Record<string, unknown> = { role: "assistant", content: reply.content };
  if (reply.reasoning !== undefined) message.reasoning_content = reply.reasoning;
  return {
    id: who.id,
    object: "chat.completion",
    created: who.created,
    model: who.model,
    system_fingerprint: who.systemFingerprint,
    choices: [{ index: 0, message, logprobs: reply.logprobs ? { content: reply.logprobs } : null, finish_reason: reply.finishReason }],
    usage: reply.usage,
  };
}

export interface ChatDelta {
  role?: "assistant";
  content?: string;
  reasoning_content?: string;
}

/** One chunk; `usage` is null in every chunk but the last one when the client asked for usage (include_usage). */
export function chatChunk(who: ResponseIdentity, delta: ChatDelta, options: { finishReason?: FinishReason; logprobs?: ChatLogprobEntry[]; withUsage: boolean }): Record<string, unknown> {
  const chunk: Record<string, unknown> = {
    id: who.id,
    object: "chat.completion.chunk",
    created: who.created,
    model: who.model,
    system_fingerprint: who.systemFingerprint,
    choices: [{ index: 0, delta, logprobs: options.logprobs ? { content: options.logprobs } : null, finish_reason: options.finishReason ?? null }],
  };
  if (options.withUsage) chunk.usage = null;
  return chunk;
}

/** The extra last chunk of stream_options.include_usage: no choices, the usage. */
export function usageChunk(who: ResponseIdentity, object: "chat.completion.chunk" | "text_completion", usage: Usage): Record<string, unknown> {
  return { id: who.id, object, created: who.created, model: who.model, system_fingerprint: who.systemFingerprint, choices: [], usage };
}

// --- completions --------------------------------------------------------------------------------

export interface LegacyLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
}

/** Completions' logprobs lists; `offset` is where these tokens' text starts in the whole completion. */
export function legacyLogprobs(tokenizer: TextTokenizer, tokens: readonly GeneratedToken[], offset: number): LegacyLogprobs {
  const out: LegacyLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let at = offset;
  for (const t of tokens) {
    const text = tokenString(tokenizer, t.id);
    out.tokens.push(text);
    out.token_logprobs.push(t.logprob ?? 0);
    out.top_logprobs.push(Object.fromEntries((t.topLogprobs ?? []).map((c) => [tokenString(tokenizer, c.token), c.logprob])));
    out.text_offset.push(at);
    at += text.length;
  }
  return out;
}

export function textCompletion(who: ResponseIdentity, text: string, finishReason: FinishReason | null, logprobs: LegacyLogprobs | null, usage: Usage | undefined, streaming: boolean): Record<string, unknown> {
  const body: Record<string, unknown> = {
    id: who.id,
    object: "text_completion",
    created: who.created,
    model: who.model,
    system_fingerprint: who.systemFingerprint,
    choices: [{ text, index: 0, logprobs, finish_reason: finishReason }],
  };
  if (usage) body.usage = usage;
  else if (streaming) body.usage = null;
  return body;
}

// --- tokens -------------------------------------------------------------------------------------

const utf8 = new TextDecoder("utf-8", { fatal: false });

/** A token's own text (a piece of a character shows as U+FFFD, as OpenAI shows it; `bytes` has the truth). */
function tokenString(tokenizer: TextTokenizer, id: number): string {
  return utf8.decode(tokenizer.tokenBytes(id));
}

function tokenEntry(tokenizer: TextTokenizer, id: number, logprob: number): { token: string; logprob: number; bytes: number[] } {
  return { token: tokenString(tokenizer, id), logprob, bytes: Array.from(tokenizer.tokenBytes(id)) };
}
