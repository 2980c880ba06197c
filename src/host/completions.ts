/**
 * POST /v1/chat/completions and POST /v1/completions: a plan goes to the scheduler as a job, and
 * its output comes back as one JSON object or as server-sent chunks. The client going away (the
 * request's signal, or the stream cancelled) cancels the job, which frees its slot at once.
 */
import { Sequence, type GeneratedToken, type Model } from "../engine/index.ts";
import type { HostConfig } from "./config.ts";
import { ClientGoneError, toApiError } from "./errors.ts";
import type { Metrics } from "./metrics.ts";
import { chatChunk, chatCompletion, chatLogprobs, legacyLogprobs, newIdentity, textCompletion, usageChunk, usageOf, type ChatDelta, type ResponseIdentity } from "./openai-format.ts";
import { ReasoningSplitter, type SplitText } from "./reasoning.ts";
import type { RequestPlan } from "./request-plan.ts";
import type { Job, JobRequest, Scheduler } from "./scheduler.ts";
import { sseStream, type SseStream } from "./sse.ts";

export interface HostContext {
  model: Model;
  config: HostConfig;
  scheduler: Scheduler;
  metrics: Metrics;
  /** system_fingerprint: the engine's mode. */
  fingerprint: string;
  /** Where the slots' batch runs now ("device-batch" or "sessions"); undefined without a batch. */
  batchPath?: () => string | undefined;
}

export interface ReplyOptions {
  stream: boolean;
  includeUsage: boolean;
  signal: AbortSignal;
}

export async function chatReply(host: HostContext, plan: RequestPlan, o: ReplyOptions): Promise<Response> {
  const who = newIdentity("chatcmpl", host.config.modelName, host.fingerprint);
  const tokenizer = host.model.tokenizer;
  const wantsLogprobs = plan.options.topLogprobs !== undefined;
  const splitter = () => (plan.reasoningStartsInside !== undefined ? new ReasoningSplitter(plan.reasoningStartsInside) : undefined);
  if (!o.stream) {
    const { sequence, tokens } = await collect(host, plan, o.signal);
    const s = splitter();
    const parts = s ? join(s.push(sequence.text), s.flush()) : { reasoning: "", content: sequence.text };
    const body = chatCompletion(who, {
      content: parts.content,
      reasoning: parts.reasoning || undefined,
      finishReason: sequence.finishReason!,
      logprobs: wantsLogprobs ? chatLogprobs(tokenizer, tokens) : undefined,
      usage: usageOf(plan.promptIds.length, sequence.ids.length),
    });
    return Response.json(body);
  }
  const s = splitter();
  const chunk = (delta: ChatDelta, extra: { finishReason?: Sequence["finishReason"]; logprobs?: GeneratedToken[] } = {}) =>
    chatChunk(who, delta, { finishReason: extra.finishReason, logprobs: extra.logprobs && wantsLogprobs ? chatLogprobs(tokenizer, extra.logprobs) : undefined, withUsage: o.includeUsage });
  const deltaOf = (p: SplitText): ChatDelta | undefined => {
    const d: ChatDelta = {};
    if (p.reasoning) d.reasoning_content = p.reasoning;
    if (p.content) d.content = p.content;
    return d.reasoning_content !== undefined || d.content !== undefined ? d : undefined;
  };
  return streamReply(host, plan, o, {
    open: (sse) => sse.send(chunk({ role: "assistant", content: "" })),
    delta: (sse, text, tokens) => {
      const d = deltaOf(s ? s.push(text) : { reasoning: "", content: text });
      if (d || (wantsLogprobs && tokens.length)) sse.send(chunk(d ?? {}, { logprobs: tokens }));
    },
    finished: (sse, sequence) => {
      const rest = s ? deltaOf(s.flush()) : undefined;
      if (rest) sse.send(chunk(rest));
      sse.send(chunk({}, { finishReason: sequence.finishReason }));
      if (o.includeUsage) sse.send(usageChunk(who, "chat.completion.chunk", usageOf(plan.promptIds.length, sequence.ids.length)));
    },
  });
}

export async function textReply(host: HostContext, plan: RequestPlan, o: ReplyOptions): Promise<Response> {
  const who = newIdentity("cmpl", host.config.modelName, host.fingerprint);
  const tokenizer = host.model.tokenizer;
  const wantsLogprobs = plan.options.topLogprobs !== undefined;
  if (!o.stream) {
    const { sequence, tokens } = await collect(host, plan, o.signal);
    const logprobs = wantsLogprobs ? legacyLogprobs(tokenizer, tokens, 0) : null;
    return Response.json(textCompletion(who, sequence.text, sequence.finishReason!, logprobs, usageOf(plan.promptIds.length, sequence.ids.length), false));
  }
  let offset = 0;
  return streamReply(host, plan, o, {
    open: () => {},
    delta: (sse, text, tokens) => {
      const logprobs = wantsLogprobs ? legacyLogprobs(tokenizer, tokens, offset) : null;
      offset += text.length;
      if (text || logprobs) sse.send(textCompletion(who, text, null, logprobs, undefined, o.includeUsage));
    },
    finished: (sse, sequence) => {
      sse.send(textCompletion(who, "", sequence.finishReason!, null, undefined, o.includeUsage));
      if (o.includeUsage) sse.send(usageChunk(who, "text_completion", usageOf(plan.promptIds.length, sequence.ids.length)));
    },
  });
}

function join(a: SplitText, b: SplitText): SplitText {
  return { reasoning: a.reasoning + b.reasoning, content: a.content + b.content };
}

function jobRequest(host: HostContext, plan: RequestPlan): JobRequest {
  const timeoutSeconds = host.config.timeoutSeconds;
  return {
    deadline: performance.now() + timeoutSeconds * 1000,
    timeoutSeconds,
    promptIds: plan.promptIds,
    start: (session, heldPrefix) => new Sequence(host.model.tokenizer, session, plan.promptIds, { ...plan.options, heldPrefix }),
  };
}

/** Non-streaming: the finished sequence and every token it picked. */
function collect(host: HostContext, plan: RequestPlan, signal: AbortSignal): Promise<{ sequence: Sequence; tokens: GeneratedToken[] }> {
  return new Promise((resolve, reject) => {
    const tokens: GeneratedToken[] = [];
    let stopListening = () => {};
    const job = host.scheduler.submit(jobRequest(host, plan), {
      delta: (d) => tokens.push(...d.tokens),
      finished: (sequence) => {
        stopListening();
        resolve({ sequence, tokens });
      },
      failed: (e) => {
        stopListening();
        reject(e);
      },
    });
    stopListening = onAbort(signal, () => {
      job.cancel();
      reject(new ClientGoneError());
    });
  });
}

interface StreamWriter {
  open(sse: SseStream): void;
  delta(sse: SseStream, text: string, tokens: GeneratedToken[]): void;
  finished(sse: SseStream, sequence: Sequence): void;
}

function streamReply(host: HostContext, plan: RequestPlan, o: ReplyOptions, writer: StreamWriter): Response {
  let job: Job | undefined;
  let stopListening = () => {};
  const sse = sseStream(() => job?.cancel());
  // submit first: a full queue is a 429 JSON answer, not a stream
  job = host.scheduler.submit(jobRequest(host, plan), {
    delta: (d) => writer.delta(sse, d.text, d.tokens),
    finished: (sequence) => {
      stopListening();
      writer.finished(sse, sequence);
      sse.done();
    },
    failed: (e) => {
      stopListening();
      host.metrics.streamError();
      sse.fail(toApiError(e).body);
    },
  });
  stopListening = onAbort(o.signal, () => job!.cancel());
  writer.open(sse);
  return sse.response;
}

/** Calls `f` when the client goes away; the returned function stops listening (once the reply is done). */
function onAbort(signal: AbortSignal, f: () => void): () => void {
  if (signal.aborted) {
    f();
    return () => {};
  }
  signal.addEventListener("abort", f, { once: true });
  return () => signal.removeEventListener("abort", f);
}
