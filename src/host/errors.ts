/**
 * Errors a request meets, in OpenAI's JSON shape `{ error: { message, type, param, code } }` with
 * the HTTP status that goes with them. A user's mistake is an ApiError with a message that names
 * the field; anything else is mapped by `toApiError` without leaking a stack trace.
 */
import { VkmoeError } from "../errors.ts";

export type ApiErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "not_found_error"
  | "rate_limit_error"
  | "server_error"
  | "service_unavailable_error";

export interface OpenAiErrorBody {
  error: { message: string; type: ApiErrorType; param: string | null; code: string | null };
}

export class ApiError extends VkmoeError {
  constructor(
    readonly status: 400 | 401 | 404 | 413 | 429 | 499 | 500 | 503,
    readonly type: ApiErrorType,
    message: string,
    readonly param: string | null = null,
    readonly apiCode: string | null = null,
    /** Extra response headers (Retry-After on a 429). */
    readonly headers: Readonly<Record<string, string>> = {},
  ) {
    super("API_ERROR", message);
  }

  get body(): OpenAiErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.apiCode } };
  }
}

export const invalidRequest = (message: string, param: string | null = null, code: string | null = null) =>
  new ApiError(400, "invalid_request_error", message, param, code);

/** What a request asked for that this server does not do yet: a 400 that says so. */
export const notSupported = (param: string, what = param) =>
  new ApiError(400, "invalid_request_error", `${what} is not supported yet by this server`, param, "unsupported_parameter");

/** The server's own time limit for one request ran out. */
export class RequestTimeoutError extends VkmoeError {
  constructor(readonly seconds: number) {
    super("REQUEST_TIMEOUT", `the request ran past the server's time limit of ${seconds} s (--timeout)`);
  }
}

/** The client went away before its reply was ready: nobody is left to answer. */
export class ClientGoneError extends VkmoeError {
  constructor() {
    super("CLIENT_GONE", "the client closed the connection");
  }
}

/**
 * Any error from handling a request as the ApiError to send. vkmoe's own argument errors are the
 * caller's (400), its other errors the engine's (503: the device or the model could not serve it);
 * anything unexpected is a 500 that says only its class and message, one line.
 */
export function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  // nobody reads this answer; 499 (nginx's "client closed request") keeps it apart in the metrics
  if (e instanceof ClientGoneError) return new ApiError(499, "invalid_request_error", e.message, null, "client_closed");
  if (e instanceof RequestTimeoutError) return new ApiError(503, "service_unavailable_error", e.message, null, "timeout");
  if (e instanceof VkmoeError) {
    const userMistake = e.code === "INVALID_ARGUMENT" || e.code === "CONTEXT_LENGTH";
    return userMistake
      ? new ApiError(400, "invalid_request_error", oneLine(e.message), null, e.code.toLowerCase())
      : new ApiError(503, "service_unavailable_error", `the engine failed: ${oneLine(e.message)}`, null, e.code.toLowerCase());
  }
  const name = e instanceof Error && e.name && e.name !== "Error" ? `${e.name}: ` : "";
  return new ApiError(500, "server_error", `internal error: ${name}${oneLine(e instanceof Error ? e.message : String(e))}`, null, "internal_error");
}

function oneLine(text: string): string {
  return text.split("\n").map((l) => l.trim()).filter(Boolean).join(" ");
}
