/** The engine host: an OpenAI-compatible HTTP server over a loaded model (Bun and Deno). */
export { createHost, startServer, type Host, type HostOptions, type RunningServer } from "./server.ts";
export { HostConfigError, isLoopback, resolveHostConfig, type HostConfig, type HostConfigInput } from "./config.ts";
export { SlotScheduler, type Job, type JobSink, type Scheduler, type SchedulerStats, type SlotSchedulerOptions } from "./scheduler.ts";
export { BatchedStepper, roundRobinStepper, type DecodeRound, type DecodeStepper, type StepperName, type StepResult } from "./decode-stepper.ts";
export { BatchSlots, BatchSlotSession, SlotsExhaustedError, type SlotBatch } from "./batch-slots.ts";
export { SessionPool, type ReusableSession, type SessionLease, type SessionPoolStats } from "./session-pool.ts";
// a request's generation is the engine's Sequence; re-exported for what drives the scheduler
export { Sequence, type SequenceDelta, type SequenceOptions, type SequenceSession } from "../engine/index.ts";
export { ReasoningSplitter } from "./reasoning.ts";
export { ApiError, toApiError, type OpenAiErrorBody } from "./errors.ts";
export { listen, type Listener } from "./listen.ts";
