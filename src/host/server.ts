/**
 * A running host: the app over a loaded model, its scheduler and metrics, listening. The model is
 * the caller's (its lifetime is theirs); closing the server ends the active requests, disposes
 * the slots' sessions and stops listening.
 */
import type { Hono } from "hono";
import type { Model } from "../engine/index.ts";
import { createApp } from "./app.ts";
import { resolveHostConfig, type HostConfig, type HostConfigInput } from "./config.ts";
import type { HostContext } from "./completions.ts";
import { listen, type Listener } from "./listen.ts";
import { Metrics } from "./metrics.ts";
import { SlotScheduler, type DecodeStepper, type Scheduler } from "./scheduler.ts";
import type { ReusableSession } from "./session-pool.ts";

export interface HostOptions {
  /** Opens one slot's session (default: model.session({ ctx })); slots keep theirs between requests. Tests wrap it to inject faults. */
  openSession?: (ctx: number) => ReusableSession;
  /** How active sequences advance (default round-robin). */
  stepper?: DecodeStepper;
}

export interface Host extends AsyncDisposable {
  readonly app: Hono;
  readonly config: HostConfig;
  readonly scheduler: Scheduler;
  readonly metrics: Metrics;
  fetch(request: Request): Response | Promise<Response>;
}

export function createHost(model: Model, input: Omit<HostConfigInput, "modelName" | "ctx"> & { modelName?: string; ctx?: number }, options: HostOptions = {}): Host {
  const config = resolveHostConfig({ ...input, modelName: input.modelName ?? defaultModelName(model), ctx: input.ctx ?? Math.min(4096, model.config.maxPositions) });
  let metrics!: Metrics;
  const open = options.openSession ?? ((ctx: number) => model.session({ ctx }));
  const scheduler = new SlotScheduler({
    slots: config.parallel,
    queueLimit: config.queue,
    openSession: () => open(config.ctx),
    // a lost device changes the model's mode: sessions opened before it are not reused
    deviceEpoch: () => model.device.mode,
    stepper: options.stepper,
    hooks: {
      prefilled: (n, reused) => metrics.prefilled(n, reused),
      generated: (n) => metrics.generated(n),
      cancelled: () => metrics.cancel(),
      timedOut: () => metrics.timeout(),
    },
  });
  metrics = new Metrics(() => scheduler.stats());
  const context: HostContext = { model, config, scheduler, metrics, fingerprint: `vkmoe-${model.device.mode}` };
  const app = createApp(context);
  return {
    app,
    config,
    scheduler,
    metrics,
    fetch: (request) => app.fetch(request),
    [Symbol.asyncDispose]: () => scheduler[Symbol.asyncDispose](),
  };
}

export interface RunningServer extends AsyncDisposable {
  readonly host: Host;
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

export function startServer(model: Model, input: Parameters<typeof createHost>[1], options: HostOptions = {}): RunningServer {
  const host = createHost(model, input, options);
  let listener: Listener;
  try {
    listener = listen(host.fetch, { hostname: host.config.host, port: host.config.port });
  } catch (e) {
    void host[Symbol.asyncDispose]();
    throw e;
  }
  const shown = listener.hostname.includes(":") ? `[${listener.hostname}]` : listener.hostname;
  let closing: Promise<void> | undefined;
  const close = () => (closing ??= (async () => {
    await host[Symbol.asyncDispose](); // ends streams first, so that closing connections does not wait on them
    await listener.close();
  })());
  return { host, url: `http://${shown}:${listener.port}`, port: listener.port, close, [Symbol.asyncDispose]: close };
}

/** The file's name without its extension: what `model` names in requests (never a path). */
function defaultModelName(model: Model): string {
  const base = model.source.path.replace(/[\\/]+$/, "").split(/[\\/]/).pop() ?? "model";
  return base.replace(/\.gguf$/i, "") || "model";
}
