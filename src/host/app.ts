/**
 * The HTTP app (Hono, web standards: the same `fetch` serves under Bun.serve and Deno.serve):
 * the OpenAI routes, /health, /metrics and the chat page. Every error leaves as OpenAI's JSON
 * error shape with its status; /v1/* and /metrics need the Bearer key when one is set.
 */
import { Hono } from "hono";
import { cors } from "hono/cors";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { bearerCheck } from "./auth.ts";
import { readJsonBody } from "./body.ts";
import { chatPageHtml } from "./chat-page.ts";
import { chatReply, textReply, type HostContext } from "./completions.ts";
import { ApiError, toApiError } from "./errors.ts";
import { chatPlan, completionPlan } from "./request-plan.ts";
import { chatCompletionSchema, checkUnsupportedChat, checkUnsupportedCompletion, completionSchema, parseRequest } from "./schemas.ts";

const ROUTES = new Set(["/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"]);

export function createApp(host: HostContext): Hono {
  const { config, metrics, model } = host;
  const app = new Hono();
  const created = Math.floor(Date.now() / 1000);

  app.use("*", async (c, next) => {
    await next();
    // known routes by name, everything else as one label: a client cannot grow the metric without bound
    const path = c.req.path.startsWith("/v1/models/") ? "/v1/models/:id" : ROUTES.has(c.req.path) ? c.req.path : "other";
    metrics.request(path, c.res.status);
  });
  if (config.cors.length > 0) {
    app.use("*", cors({ origin: config.cors.includes("*") ? "*" : config.cors, allowHeaders: ["Authorization", "Content-Type"], allowMethods: ["GET", "POST", "OPTIONS"] }));
  }
  if (config.apiKey !== undefined) {
    const check = bearerCheck(config.apiKey);
    const guard = async (c: { req: { header(name: string): string | undefined } }, next: () => Promise<void>) => {
      check(c.req.header("Authorization"));
      await next();
    };
    app.use("/v1/*", guard);
    app.use("/metrics", guard);
  }

  // the page's script is inline and talks only to this origin
  app.get("/", (c) => c.html(chatPageHtml(), 200, { "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'", "X-Content-Type-Options": "nosniff" }));
  app.get("/health", (c) => {
    const d = model.device;
    const s = host.scheduler.stats();
    return c.json({ status: "ok", model: config.modelName, mode: d.mode, device: d.why, experts: d.experts, ctx: config.ctx, slots: s.slots, active: s.active, queued: s.queued, stepper: s.stepper, batch: host.batchPath?.() ?? null });
  });
  app.get("/metrics", (c) => c.body(metrics.render(), 200, { "Content-Type": "text/plain; version=0.0.4; charset=utf-8" }));

  const modelCard = () => ({ id: config.modelName, object: "model", created, owned_by: "vkmoe", max_model_len: config.ctx });
  app.get("/v1/models", (c) => c.json({ object: "list", data: [modelCard()] }));
  app.get("/v1/models/:id", (c) => {
    if (c.req.param("id") !== config.modelName) throw modelNotFound(c.req.param("id"), config.modelName);
    return c.json(modelCard());
  });

  app.post("/v1/chat/completions", async (c) => {
    const r = parseRequest(chatCompletionSchema, await readJsonBody(c.req.raw, config.maxBodyBytes));
    checkUnsupportedChat(r);
    checkModel(r.model, config.modelName);
    const plan = chatPlan(model, config, r);
    return chatReply(host, plan, { stream: r.stream === true, includeUsage: r.stream_options?.include_usage === true, signal: c.req.raw.signal });
  });
  app.post("/v1/completions", async (c) => {
    const r = parseRequest(completionSchema, await readJsonBody(c.req.raw, config.maxBodyBytes));
    checkUnsupportedCompletion(r);
    checkModel(r.model, config.modelName);
    const plan = completionPlan(model, config, r);
    return textReply(host, plan, { stream: r.stream === true, includeUsage: r.stream_options?.include_usage === true, signal: c.req.raw.signal });
  });

  app.notFound((c) => c.json(new ApiError(404, "not_found_error", `no route ${c.req.method} ${c.req.path}`, null, "not_found").body, 404));
  app.onError((e, c) => {
    const error = toApiError(e);
    return c.json(error.body, error.status as ContentfulStatusCode, error.headers);
  });
  return app;
}

/** `model` may be left out (one model is served); when given it must be the served id. */
function checkModel(requested: string | null | undefined, served: string): void {
  if (requested != null && requested !== served) throw modelNotFound(requested, served);
}

function modelNotFound(requested: string, served: string): ApiError {
  return new ApiError(404, "not_found_error", `The model ${JSON.stringify(requested)} does not exist; this server serves ${JSON.stringify(served)}`, "model", "model_not_found");
}
