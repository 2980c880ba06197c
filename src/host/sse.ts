/**
 * Server-sent events as OpenAI streams them: `data: {json}\n\n` per chunk, an error as one
 * `data: {"error": {...}}` event, and `data: [DONE]` last. The stream's cancel (the client went
 * away) is reported once through `onCancel`.
 */
import type { OpenAiErrorBody } from "./errors.ts";

const encoder = new TextEncoder();

export interface SseStream {
  readonly response: Response;
  send(data: unknown): void;
  /** An error event, then [DONE], then the end. */
  fail(error: OpenAiErrorBody): void;
  /** [DONE], then the end. */
  done(): void;
  readonly closed: boolean;
}

export function sseStream(onCancel: () => void, headers: Record<string, string> = {}): SseStream {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  let closed = false;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      controller = c;
    },
    cancel() {
      if (closed) return;
      closed = true;
      onCancel();
    },
  });
  const write = (text: string) => {
    if (closed) return;
    try {
      controller.enqueue(encoder.encode(text));
    } catch {
      // the consumer is gone; cancel() reports it
    }
  };
  const end = () => {
    if (closed) return;
    write("data: [DONE]\n\n");
    closed = true;
    try {
      controller.close();
    } catch {
      // already errored or cancelled
    }
  };
  return {
    response: new Response(body, {
      status: 200,
      headers: { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", Connection: "keep-alive", "X-Accel-Buffering": "no", ...headers },
    }),
    send: (data) => write(`data: ${JSON.stringify(data)}\n\n`),
    fail: (error) => {
      write(`data: ${JSON.stringify(error)}\n\n`);
      end();
    },
    done: end,
    get closed() {
      return closed;
    },
  };
}
