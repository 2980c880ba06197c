/**
 * A validated request as the engine needs it: prompt ids (chat messages through the model's chat
 * template by the engine's prompt helpers, or a raw prompt), the sampling options (the request's
 * over the model's own defaults), the token limit, stop strings and logprobs; every limit checked.
 */
import { promptIds, type Model, type SequenceOptions } from "../engine/index.ts";
import { samplingFromModel } from "../sampling/defaults.ts";
import type { SamplingOptions } from "../sampling/options.ts";
import type { ChatMessage } from "../tokenizer/chat-template.ts";
import type { HostConfig } from "./config.ts";
import { invalidRequest, notSupported } from "./errors.ts";
import type { ChatCompletionRequest, CompletionRequest } from "./schemas.ts";

export interface RequestPlan {
  promptIds: number[];
  options: SequenceOptions;
  /** Split <think>…</think> into reasoning_content: undefined = no split; true = the prompt opened the block already. */
  reasoningStartsInside: boolean | undefined;
}

type Common = Pick<ChatCompletionRequest, "temperature" | "top_p" | "top_k" | "min_p" | "presence_penalty" | "frequency_penalty" | "repetition_penalty" | "seed" | "stop">;

export function chatPlan(model: Model, config: HostConfig, r: ChatCompletionRequest): RequestPlan {
  if (r.messages.length > config.maxMessages) throw invalidRequest(`messages has ${r.messages.length} entries; this server takes at most ${config.maxMessages} (--max-messages)`, "messages");
  if (!model.chatTemplate) throw invalidRequest(`model ${config.modelName} has no chat template; use /v1/completions with a plain prompt`, "messages");
  const messages: ChatMessage[] = r.messages.map((m) => {
    const out: ChatMessage = { role: m.role === "developer" ? "system" : m.role, content: textOf(m.content) };
    if (m.name != null) out.name = m.name;
    if (m.reasoning_content != null) out.reasoning_content = m.reasoning_content;
    return out;
  });
  const last = messages.at(-1)!;
  if (last.role !== "user") throw notSupported(`messages[${messages.length - 1}].role`, "a conversation that does not end with a user message (continuing an assistant message)");
  const enableThinking = r.chat_template_kwargs?.enable_thinking;
  const ids = promptIds(model, last.content, { enableThinking }, messages.slice(0, -1));
  checkPromptFits(ids.length, config, "messages");
  const tokenizer = model.tokenizer;
  const splits = tokenizer.tokenId("<think>") !== undefined && tokenizer.tokenId("</think>") !== undefined;
  return {
    promptIds: ids,
    options: {
      maxTokens: maxTokensOf(r.max_completion_tokens ?? r.max_tokens, r.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens", ids.length, config, undefined),
      sampling: samplingOf(model, r),
      stop: stopsOf(r.stop),
      topLogprobs: r.logprobs ? (r.top_logprobs ?? 0) : undefined,
    },
    reasoningStartsInside: splits ? tokenizer.decode(ids.slice(-4)).trimEnd().endsWith("<think>") : undefined,
  };
}

/** OpenAI's completions default max_tokens. */
const COMPLETIONS_DEFAULT_MAX_TOKENS = 16;

export function completionPlan(model: Model, config: HostConfig, r: CompletionRequest): RequestPlan {
  const p = r.prompt;
  let ids: number[];
  if (typeof p === "string") ids = promptIds(model, p, { raw: true });
  else if (p.length > 0 && typeof p[0] === "string") ids = promptIds(model, p[0] as string, { raw: true });
  else {
    ids = (Array.isArray(p[0]) ? (p[0] as number[]) : (p as number[])).slice();
    const bad = ids.findIndex((id) => id >= model.config.vocab);
    if (bad >= 0) throw invalidRequest(`prompt token ${ids[bad]} at ${bad} is outside the vocabulary 0..${model.config.vocab - 1}`, "prompt");
  }
  if (ids.length === 0) throw invalidRequest("the prompt is empty (it must give at least one token)", "prompt");
  checkPromptFits(ids.length, config, "prompt");
  return {
    promptIds: ids,
    options: {
      maxTokens: maxTokensOf(r.max_tokens, "max_tokens", ids.length, config, COMPLETIONS_DEFAULT_MAX_TOKENS),
      sampling: samplingOf(model, r),
      stop: stopsOf(r.stop),
      topLogprobs: r.logprobs != null ? r.logprobs : undefined,
    },
    reasoningStartsInside: undefined,
  };
}

function textOf(content: ChatCompletionRequest["messages"][number]["content"]): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content.map((part) => part.text ?? "").join("");
}

/** At least one token of room must be left for the reply. */
function checkPromptFits(promptTokens: number, config: HostConfig, param: string): void {
  if (promptTokens >= config.ctx) {
    throw invalidRequest(`This model's maximum context length is ${config.ctx} tokens. However, your ${param} resulted in ${promptTokens} tokens, which leaves no room for a reply.`, param, "context_length_exceeded");
  }
}

/** The requested limit (at most the cap), or the default; then what the context leaves (the reply then ends with "length"). */
function maxTokensOf(requested: number | null | undefined, param: string, promptTokens: number, config: HostConfig, fallback: number | undefined): number {
  if (requested != null && requested > config.maxTokensCap) {
    throw invalidRequest(`${param} is ${requested}; this server allows at most ${config.maxTokensCap} (--max-tokens-cap)`, param, "invalid_value");
  }
  const room = config.ctx - promptTokens;
  return Math.min(requested ?? fallback ?? config.maxTokensCap, room);
}

function samplingOf(model: Model, r: Common): SamplingOptions {
  const user: SamplingOptions = {
    temperature: r.temperature ?? undefined,
    topP: r.top_p ?? undefined,
    topK: r.top_k == null ? undefined : Math.max(0, r.top_k),
    minP: r.min_p ?? undefined,
    presencePenalty: r.presence_penalty ?? undefined,
    frequencyPenalty: r.frequency_penalty ?? undefined,
    repeatPenalty: r.repetition_penalty ?? undefined,
    seed: r.seed ?? undefined,
  };
  return samplingFromModel(model.generationDefaults, user);
}

function stopsOf(stop: Common["stop"]): string[] {
  if (stop == null) return [];
  return typeof stop === "string" ? [stop] : stop;
}
