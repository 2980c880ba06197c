/**
 * The server's settings, validated once at start. Safe by default: it binds 127.0.0.1, and a bind
 * to anything but a loopback address needs an API key (it refuses to start otherwise).
 */
import { z } from "zod";
import { VkmoeError } from "../errors.ts";

export class HostConfigError extends VkmoeError {
  constructor(message: string) {
    super("HOST_CONFIG", message);
  }
}

export const hostConfigSchema = z.strictObject({
  host: z.string().min(1).default("127.0.0.1"),
  port: z.number().int().min(0).max(65535).default(8080),
  /** Bearer key for /v1/* and /metrics; required for a non-loopback bind. */
  apiKey: z.string().min(8, "must be at least 8 characters").optional(),
  /** The id clients name in `model` (GET /v1/models lists it). */
  modelName: z.string().min(1).max(256),
  /** Requests decoding at once; each slot keeps one session (its KV cache) between requests. */
  parallel: z.number().int().min(1).max(256).default(4),
  /** "on": one model call a decode round for every active request (continuous batching); "off": one call per request, in turn. */
  batching: z.enum(["on", "off"]).default("on"),
  /** Requests that may wait for a slot before new ones get a 429. */
  queue: z.number().int().min(0).max(100_000).default(32),
  /** Context of each session (prompt + generation). */
  ctx: z.number().int().min(1),
  /** The largest max_tokens a request may ask for (default: the context). */
  maxTokensCap: z.number().int().min(1).optional(),
  /** Seconds a request may take from arrival (queue wait included). */
  timeoutSeconds: z.number().positive().max(86_400).default(600),
  maxBodyBytes: z.number().int().min(1024).max(1 << 30).default(1 << 20),
  maxMessages: z.number().int().min(1).max(100_000).default(256),
  /** Origins allowed by CORS ("*" for any); CORS is off when empty. */
  cors: z.array(z.string().min(1)).default([]),
});

export type HostConfigInput = z.input<typeof hostConfigSchema>;
export type HostConfig = z.output<typeof hostConfigSchema> & { maxTokensCap: number };

export function resolveHostConfig(input: HostConfigInput): HostConfig {
  const parsed = hostConfigSchema.safeParse(input);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new HostConfigError(`${issue.path.join(".") || "config"} ${issue.message}`);
  }
  const c = parsed.data;
  if (!isLoopback(c.host) && c.apiKey === undefined) {
    throw new HostConfigError(`refusing to listen on ${c.host} without an API key: a non-loopback address needs --api-key KEY or VKMOE_API_KEY (or bind 127.0.0.1)`);
  }
  const maxTokensCap = c.maxTokensCap ?? c.ctx;
  return { ...c, maxTokensCap };
}

/** localhost, 127.0.0.0/8, ::1 (and ::ffff:127.x): addresses only this machine can reach. */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, "");
  if (h === "localhost" || h === "::1" || h === "0:0:0:0:0:0:0:1") return true;
  const v4 = h.startsWith("::ffff:") ? h.slice(7) : h;
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(v4);
}
