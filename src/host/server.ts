/**
 * A running host: the app over a loaded model, its scheduler and metrics, listening. Where the
 * model runs resident the slots are one SessionBatch of --parallel sequences (`model.batch`: a
 * decode round is one replay for all of them), opened here and owned by the host; elsewhere each
 * slot is a Session of its own. The model is the caller's (its lifetime is theirs). Closing the server ends the active requests,
 * gives the slots back, disposes the batch and stops listening.
 */
import type { Hono } from "hono";
import type { Model } from "../engine/index.ts";
import { createApp } from "./app.ts";
import { resolveHostConfig, type HostConfig, type HostConfigInput } from "./config.ts";
import type { HostContext } from "./completions.ts";
import { listen, type Listener } from "./listen.ts";
import { Metrics } from "./metrics.ts";
import { BatchSlots, type SlotBatch } from "./batch-slots.ts";
import { BatchedStepper, roundRobinStepper, type DecodeStepper } from "./decode-stepper.ts";
import { SlotScheduler, type Scheduler } from "./scheduler.ts";
import type { ReusableSession } from "./session-pool.ts";

export interface HostOptions {
  /** Opens the slots' batch (default: model.batch({ slots, ctx }) where the model runs resident). Tests wrap it to inject faults. */
  openBatch?: (slots: number, ctx: number) => SlotBatch;
  /**
   * Gives each slot a Session of its own instead of a row of the batch (no batch is opened; each
   * sequence steps alone). Tests wrap a Session this way to inject faults in one request.
   */
  openSession?: (ctx: number) => ReusableSession;
  /** How active sequences advance (default: batched where the slots are a batch and config.batching is "on", else round-robin). */
  stepper?: DecodeStepper;
}

/** Where the slots' sessions come from, and the batch the host must dispose (none with `openSession`). */
interface SlotSource {
  batch?: SlotBatch;
  openSession: () => ReusableSession;
  deviceEpoch?: () => string;
}

function slotSource(model: Model, config: HostConfig, options: HostOptions): SlotSource {
  const batch = options.openSession ? undefined : options.openBatch ? options.openBatch(config.parallel, config.ctx) : residentBatch(model, config);
  if (batch) {
    // a batch moves its slots' caches to the CPU path itself when the device is lost: no epoch to watch
    const slots = new BatchSlots(batch);
    return { batch, openSession: () => slots.open() };
  }
  const open = options.openSession ?? ((ctx: number) => model.session({ ctx }));
  // a lost device changes the model's mode: sessions opened before it are not reused
  return { openSession: () => open(config.ctx), deviceEpoch: () => model.device.mode };
}

/**
 * The model's batch where it steps every slot in one replay, else none (a Session per slot). A
 * batch on its "sessions" path would step them in turn just the same, but it copies every call's
 * logits (600 kB a token on the fixture): garbage that grows the server's RSS between collections.
 */
function residentBatch(model: Model, config: HostConfig): SlotBatch | undefined {
  if (model.device.mode !== "resident") return undefined;
  const batch = model.batch({ slots: config.parallel, ctx: config.ctx });
  if (batch.path === "device-batch") return batch;
  batch[Symbol.dispose]();
  return undefined;
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
  const source = slotSource(model, config, options);
  const { batch } = source;
  let scheduler: SlotScheduler;
  try {
    scheduler = new SlotScheduler({
      slots: config.parallel,
      queueLimit: config.queue,
      openSession: source.openSession,
      deviceEpoch: source.deviceEpoch,
      stepper: options.stepper ?? (batch && config.batching === "on" ? new BatchedStepper(batch) : roundRobinStepper),
      hooks: {
        prefilled: (n, reused) => metrics.prefilled(n, reused),
        prefillCalls: (calls) => metrics.prefillsRan(calls),
        generated: (n) => metrics.generated(n),
        decoded: (calls, sequences) => metrics.decoded(calls, sequences),
        cancelled: () => metrics.cancel(),
        timedOut: () => metrics.timeout(),
      },
    });
  } catch (e) {
    batch?.[Symbol.dispose]();
    throw e;
  }
  metrics = new Metrics(() => scheduler.stats());
  const context: HostContext = { model, config, scheduler, metrics, fingerprint: `vkmoe-${model.device.mode}`, batchPath: () => batch?.path };
  const app = createApp(context);
  return {
    app,
    config,
    scheduler,
    metrics,
    fetch: (request) => app.fetch(request),
    [Symbol.asyncDispose]: async () => {
      try {
        await scheduler[Symbol.asyncDispose](); // every slot is back once the loop has ended
      } finally {
        batch?.[Symbol.dispose]();
      }
    },
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
