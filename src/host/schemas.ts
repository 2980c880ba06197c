/**
 * The request bodies, as zod schemas. Every field OpenAI documents for the endpoint is known: the
 * ones this server honours are typed; the ones it cannot honour yet are accepted only at their
 * neutral value (checkUnsupported says which) and otherwise get a 400 that says so; any other field
 * is a 400 naming it. Extensions vLLM and llama.cpp's server accept (top_k, min_p,
 * repetition_penalty, chat_template_kwargs.enable_thinking) are known too. Nothing here names a file.
 */
import { z } from "zod";
import { ApiError, invalidRequest, notSupported } from "./errors.ts";

const probability = z.number().min(0).max(1);
const penalty = z.number().min(-2).max(2);
const stop = z.union([z.string().min(1), z.array(z.string().min(1, "stop strings must not be empty")).max(16)]).nullish();
const tokenCount = z.number().int().min(1).max(Number.MAX_SAFE_INTEGER);

/** Fields both endpoints share: sampling, limits, streaming. */
const common = {
  model: z.string().max(256).nullish(),
  frequency_penalty: penalty.nullish(),
  presence_penalty: penalty.nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: probability.nullish(),
  seed: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).nullish(),
  stop,
  n: z.number().int().min(1).max(128).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.strictObject({ include_usage: z.boolean().nullish(), include_obfuscation: z.boolean().nullish() }).nullish(),
  max_tokens: tokenCount.nullish(),
  logit_bias: z.record(z.string(), z.number()).nullish(),
  user: z.string().max(256).nullish(),
  // extensions (vLLM, llama.cpp's server): -1 or 0 turns top_k off
  top_k: z.number().int().min(-1).nullish(),
  min_p: probability.nullish(),
  repetition_penalty: z.number().positive().max(10).nullish(),
};

const textPart = z.looseObject({ type: z.string(), text: z.string().optional() });

const message = z.strictObject({
  role: z.enum(["system", "developer", "user", "assistant", "tool", "function"]),
  content: z.union([z.string(), z.array(textPart)]).nullish(),
  name: z.string().max(256).nullish(),
  /** An earlier assistant turn's reasoning, as vLLM accepts it back (templates may read it). */
  reasoning_content: z.string().nullish(),
  refusal: z.string().nullish(),
  tool_calls: z.array(z.unknown()).nullish(),
  tool_call_id: z.string().nullish(),
  function_call: z.unknown().nullish(),
  audio: z.unknown().nullish(),
});

export const chatCompletionSchema = z.strictObject({
  ...common,
  messages: z.array(message).min(1),
  max_completion_tokens: tokenCount.nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(20).nullish(),
  chat_template_kwargs: z.strictObject({ enable_thinking: z.boolean().optional() }).nullish(),
  // documented by OpenAI, with no effect on a local model's output: accepted and ignored
  metadata: z.record(z.string(), z.string()).nullish(),
  store: z.boolean().nullish(),
  service_tier: z.string().nullish(),
  safety_identifier: z.string().nullish(),
  prompt_cache_key: z.string().nullish(),
  prompt_cache_retention: z.string().nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  // documented, not honoured yet: only their neutral value passes (checkUnsupported)
  tools: z.array(z.unknown()).nullish(),
  tool_choice: z.unknown().nullish(),
  functions: z.array(z.unknown()).nullish(),
  function_call: z.unknown().nullish(),
  response_format: z.looseObject({ type: z.string() }).nullish(),
  audio: z.unknown().nullish(),
  modalities: z.array(z.string()).nullish(),
  prediction: z.unknown().nullish(),
  web_search_options: z.unknown().nullish(),
  reasoning_effort: z.string().nullish(),
  verbosity: z.string().nullish(),
});

export type ChatCompletionRequest = z.infer<typeof chatCompletionSchema>;
export type ChatRequestMessage = ChatCompletionRequest["messages"][number];

export const completionSchema = z.strictObject({
  ...common,
  prompt: z.union([z.string(), z.array(z.string()), z.array(z.number().int().min(0)), z.array(z.array(z.number().int().min(0)))]),
  logprobs: z.number().int().min(0).max(5).nullish(),
  echo: z.boolean().nullish(),
  suffix: z.string().nullish(),
  best_of: z.number().int().min(1).nullish(),
});

export type CompletionRequest = z.infer<typeof completionSchema>;

/** The body through `schema`, or the first problem as a 400 naming its field. */
export function parseRequest<S extends z.ZodType>(schema: S, body: unknown): z.infer<S> {
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw invalidRequest("the request body must be a JSON object");
  const parsed = schema.safeParse(body);
  if (parsed.success) return parsed.data;
  throw issueError(parsed.error.issues[0]!, body);
}

function issueError(issue: z.core.$ZodIssue, body: unknown): ApiError {
  const path = fieldPath(issue.path);
  if (issue.code === "unrecognized_keys") {
    const name = fieldPath([...issue.path, issue.keys[0]!]);
    return invalidRequest(`Unrecognized request argument supplied: ${name}`, name, "unknown_parameter");
  }
  const value = valueAt(body, issue.path);
  if (value === undefined && issue.code === "invalid_type") return invalidRequest(`${path} is required`, path, "missing_required_parameter");
  return invalidRequest(`${path}: ${issue.message} (got ${describe(value)})`, path, "invalid_value");
}

/** `messages[0].content`, as OpenAI names a nested field. */
export function fieldPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const p of path) out += typeof p === "number" ? `[${p}]` : out ? `.${String(p)}` : String(p);
  return out || "body";
}

function valueAt(body: unknown, path: readonly PropertyKey[]): unknown {
  let v: any = body;
  for (const p of path) v = v?.[p as any];
  return v;
}

function describe(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

/** Documented fields this server cannot honour yet: a 400 saying so when set to anything but their neutral value. */
export function checkUnsupportedChat(r: ChatCompletionRequest): void {
  checkCommon(r);
  if (r.tools?.length) throw notSupported("tools", "tool calling");
  if (r.tool_choice != null && r.tool_choice !== "none" && r.tool_choice !== "auto") throw notSupported("tool_choice", "tool calling");
  if (r.functions?.length || r.function_call != null) throw notSupported(r.functions?.length ? "functions" : "function_call", "function calling");
  if (r.response_format && r.response_format.type !== "text") throw notSupported("response_format", `response_format ${r.response_format.type}`);
  if (r.audio != null || (r.modalities && r.modalities.some((m) => m !== "text"))) throw notSupported(r.audio != null ? "audio" : "modalities", "audio output");
  if (r.prediction != null) throw notSupported("prediction", "predicted outputs");
  if (r.web_search_options != null) throw notSupported("web_search_options", "web search");
  if (r.reasoning_effort != null) throw notSupported("reasoning_effort", "reasoning_effort (use chat_template_kwargs.enable_thinking)");
  if (r.verbosity != null) throw notSupported("verbosity");
  if (r.top_logprobs != null && r.top_logprobs > 0 && !r.logprobs) throw invalidRequest("top_logprobs needs logprobs: true", "top_logprobs");
  r.messages.forEach((m, i) => {
    if (m.role === "tool" || m.role === "function" || m.tool_calls?.length || m.function_call != null) throw notSupported(`messages[${i}]`, "tool and function messages");
    if (m.audio != null) throw notSupported(`messages[${i}].audio`, "audio");
    if (Array.isArray(m.content)) m.content.forEach((part, j) => {
      if (part.type !== "text" || typeof part.text !== "string") throw notSupported(`messages[${i}].content[${j}]`, `content parts of type ${JSON.stringify(part.type)}`);
    });
  });
}

export function checkUnsupportedCompletion(r: CompletionRequest): void {
  checkCommon(r);
  if (r.echo) throw notSupported("echo");
  if (r.suffix != null && r.suffix !== "") throw notSupported("suffix", "suffix (insertion)");
  if (r.best_of != null && r.best_of !== 1) throw notSupported("best_of", "best_of other than 1");
  const p = r.prompt;
  if (Array.isArray(p) && p.length !== 1 && (p.length === 0 || typeof p[0] !== "number")) throw notSupported("prompt", "a batch of prompts (give one)");
}

function checkCommon(r: { n?: number | null; logit_bias?: Record<string, number> | null }): void {
  if (r.n != null && r.n !== 1) throw invalidRequest(`n must be 1 (one choice per request), got ${r.n}`, "n", "unsupported_parameter");
  if (r.logit_bias && Object.keys(r.logit_bias).length > 0) throw notSupported("logit_bias");
}
