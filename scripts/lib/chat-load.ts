/**
 * Load against an OpenAI-compatible server with plain fetch: one streamed chat request timed (first
 * content token and the whole reply; the usage chunk's token count), and waves of them at once or
 * at a fixed rate. Shared by `bun run bench:serve` and the host's load test.
 */

export interface ChatLoadRequest {
  url: string;
  content: string;
  maxTokens: number;
  apiKey?: string;
  temperature?: number;
}

export type ChatOutcome =
  | { kind: "ok"; firstTokenMs: number; totalMs: number; promptTokens: number; completionTokens: number; finishReason: string | null; text: string }
  /** The documented overload answer: a 429 with its Retry-After header (null when missing). */
  | { kind: "busy"; retryAfter: string | null; totalMs: number }
  | { kind: "error"; status: number; message: string; totalMs: number };

/** One streamed chat completion; never throws (a transport error is an "error" outcome with status 0). */
export async function streamChat(r: ChatLoadRequest): Promise<ChatOutcome> {
  const t0 = performance.now();
  const ms = () => performance.now() - t0;
  let response: Response;
  try {
    response = await fetch(`${r.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...(r.apiKey ? { Authorization: `Bearer ${r.apiKey}` } : {}) },
      body: JSON.stringify({ messages: [{ role: "user", content: r.content }], max_tokens: r.maxTokens, temperature: r.temperature ?? 0, stream: true, stream_options: { include_usage: true } }),
    });
  } catch (e) {
    return { kind: "error", status: 0, message: String((e as Error)?.message ?? e), totalMs: ms() };
  }
  if (response.status === 429) {
    await response.body?.cancel();
    return { kind: "busy", retryAfter: response.headers.get("Retry-After"), totalMs: ms() };
  }
  if (response.status !== 200 || !response.body) return { kind: "error", status: response.status, message: (await response.text()).slice(0, 300), totalMs: ms() };
  let firstTokenMs = NaN;
  let text = "";
  let completionTokens = 0;
  let promptTokens = 0;
  let finishReason: string | null = null;
  let done = false;
  try {
    for await (const data of sseData(response.body)) {
      if (data === "[DONE]") {
        done = true;
        break;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) return { kind: "error", status: 200, message: String(chunk.error.message), totalMs: ms() };
      if (chunk.usage) {
        completionTokens = chunk.usage.completion_tokens;
        promptTokens = chunk.usage.prompt_tokens;
      }
      for (const c of chunk.choices ?? []) {
        const piece = (c.delta?.content ?? "") + (c.delta?.reasoning_content ?? "");
        if (piece && Number.isNaN(firstTokenMs)) firstTokenMs = ms();
        text += piece;
        finishReason = c.finish_reason ?? finishReason;
      }
    }
  } catch (e) {
    return { kind: "error", status: 200, message: `the stream broke: ${String((e as Error)?.message ?? e)}`, totalMs: ms() };
  }
  if (!done) return { kind: "error", status: 200, message: "the stream ended without data: [DONE]", totalMs: ms() };
  // a reply whose tokens decode to no text yet (or none at all) counts its first token at the end
  return { kind: "ok", firstTokenMs: Number.isNaN(firstTokenMs) ? ms() : firstTokenMs, totalMs: ms(), promptTokens, completionTokens, finishReason, text };
}

/** The `data:` payloads of a server-sent event stream. */
async function* sseData(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const bytes of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(bytes, { stream: true });
    for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) if (line.startsWith("data: ")) yield line.slice(6);
    }
  }
}

export interface WaveResult {
  outcomes: ChatOutcome[];
  /** From the first request sent to the last answer. */
  wallMs: number;
}

/** `count` requests: all at once (`intervalMs` 0) or one every `intervalMs`; `request(i)` says what the i-th asks. */
export async function runWave(count: number, request: (i: number) => ChatLoadRequest, intervalMs = 0): Promise<WaveResult> {
  const t0 = performance.now();
  const pending: Promise<ChatOutcome>[] = [];
  for (let i = 0; i < count; i++) {
    if (intervalMs > 0 && i > 0) await sleepUntil(t0 + i * intervalMs);
    pending.push(streamChat(request(i)));
  }
  const outcomes = await Promise.all(pending);
  return { outcomes, wallMs: performance.now() - t0 };
}

function sleepUntil(at: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, at - performance.now())));
}
