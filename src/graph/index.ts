/**
 * The whole token on the GPU, as the model layer sees it (no Vulkan type crosses this line):
 * `openDeviceDecoder` builds the decode graph over a GPU MoE backend whose experts are all
 * resident, or throws GraphUnsupportedError saying why not.
 */
import type { Qwen3MoeConfig } from "../model/config.ts";
import type { ModelWeights } from "../model/weights.ts";
import { VkmoeError } from "../errors.ts";
import { DeviceLostError } from "../vk/errors.ts";
import { DecodeGraph, GRAPH_MAX_TOKENS, type GraphOutput, type HostExperts } from "./decode-graph.ts";
import { prefillPlan } from "../moe/prefill-plan.ts";
import { ExpertsNotResidentError, type MoeGraphStage, type MoeStageSource, type SharedExpertHost } from "../moe/graph-stage.ts";
import { GraphUnsupportedError } from "./errors.ts";
import { GraphBatch, type BatchEntry } from "./graph-batch.ts";
import { HybridBatch } from "./hybrid-batch.ts";
import { HybridGraph } from "./hybrid-graph.ts";
import type { Qwen35MoeConfig } from "../model/qwen35-config.ts";
import type { HybridWeights, SharedExpertWeights } from "../model/qwen35-weights.ts";
import { FloatLinear, QuantLinear, readFloatRow } from "../model/linear.ts";
import { readConfig } from "../config.ts";

export { GraphUnsupportedError } from "./errors.ts";
export type { BatchEntry } from "./graph-batch.ts";
export { GRAPH_MAX_TOKENS, type GraphOutput, type HostExperts } from "./decode-graph.ts";
export { hybridGraphReserveBytes } from "./hybrid-graph.ts";

export interface TokenResult {
  /** "logits": the next token's logits (host memory, valid until the next run). */
  logits?: Float32Array;
  /** "argmax": the greedy id and its logit. */
  id?: number;
  value?: number;
}

/** One sequence's state on the device: its KV cache and recorded token. */
export interface DeviceSequence extends Disposable {
  readonly ctx: number;
  readonly cacheBytes: number;
  /** Runs token `id` at `position`: one submit, one wait. Throws DeviceLostError when the device is lost. */
  run(id: number, position: number, output: GraphOutput): TokenResult;
  /** Tokens runTokens takes at most (absent: GRAPH_MAX_TOKENS). */
  readonly maxChunk?: number;
  /** Runs 1..maxChunk consecutive tokens in one replay (a prompt chunk); the output is the last one's. */
  runTokens(ids: ArrayLike<number>, position: number, output: GraphOutput): TokenResult;
  /** Expert ids chosen at every layer for the tokens of the last run, [layers][maxChunk][topK]. */
  lastRouting(): Int32Array;
  /** Dispatches one replay of `output` records. */
  dispatchesOf(output: GraphOutput): number;
  /** GPU µs of the last run (with `timing`; resident runs only). */
  readonly lastGpuUs: number;
  /** Graph submits per run: 1 resident; split, one per layer and the head. */
  readonly submitsPerRun: number;
  /** 1..GRAPH_MAX_TOKENS consecutive tokens through a recording with a timestamp after every op: each op's GPU µs, in order. */
  profile(ids: readonly number[], position: number, output: GraphOutput): { op: string; us: number }[];
  /**
   * false where the sequence holds recurrent states (Qwen3.5's linear layers), which cannot drop
   * tokens: a truncation calls reset() and runs the kept tokens again. Absent: true (the KV cache
   * rows past the kept length are simply overwritten).
   */
  readonly rewindable?: boolean;
  /** Back to an empty sequence (the recurrent states zeroed). */
  reset?(): void;
}

/** Several sequences decoding together on the device (continuous batching); see GraphBatch. */
export interface DeviceBatch extends Disposable {
  readonly slots: number;
  readonly ctx: number;
  readonly cacheBytes: number;
  /** 1..GRAPH_MAX_TOKENS tokens of any slots in one replay: their logits, [S][vocab] (valid until the next run). Throws DeviceLostError when the device is lost. */
  run(entries: readonly BatchEntry[]): Float32Array;
  /** As DeviceSequence.rewindable: false where a slot holds recurrent states (truncating it calls reset(slot) and runs the kept tokens again). Absent: true. */
  readonly rewindable?: boolean;
  /** Slot `slot` back to an empty sequence (its recurrent states zeroed). */
  reset?(slot: number): void;
}

export interface DeviceDecoder extends Disposable {
  /**
   * "resident": the whole token in one submit; "split": the dense ops on the GPU layer by layer
   * (one submit each), the experts through the host's per-layer MoE call (not all resident).
   */
  readonly mode: "resident" | "split";
  /** One line: where the token runs. */
  readonly why: string;
  /** `hostExperts` runs a layer's experts in split mode (required there). */
  sequence(ctx: number, options?: { timing?: boolean; hostExperts?: HostExperts }): DeviceSequence;
  /** `slots` sequences of ctx positions decoding together (resident mode only: GraphUnsupportedError in split mode). */
  batch(slots: number, ctx: number): DeviceBatch;
  /** Tests: the next run reports a lost device (after really running). */
  simulateDeviceLoss(): void;
}

class GraphDecoder implements DeviceDecoder {
  readonly mode: "resident" | "split";
  constructor(private readonly graph: DecodeGraph, readonly why: string) {
    this.mode = graph.stage ? "resident" : "split";
  }

  sequence(ctx: number, options: { timing?: boolean; hostExperts?: HostExperts } = {}): DeviceSequence {
    return this.graph.sequence(ctx, options);
  }

  batch(slots: number, ctx: number): DeviceBatch {
    return new GraphBatch(this.graph, slots, ctx);
  }

  simulateDeviceLoss(): void {
    this.graph.injectDeviceLost = true;
  }

  [Symbol.dispose](): void {
    this.graph[Symbol.dispose]();
    this.graph.stage?.[Symbol.dispose]();
  }
}

/**
 * The decode graph of `cfg` over `backend`'s device; every routed expert of every MoE layer must
 * be resident. Throws GraphUnsupportedError (or the pool's ExpertsNotResidentError, a
 * VkmoeError) with the reason when the model cannot run so.
 */
export function openDeviceDecoder(cfg: Qwen3MoeConfig, weights: ModelWeights, backend: MoeStageSource, policy: "auto" | "on" = "auto"): DeviceDecoder {
  const ctx = backend.context;
  if (!ctx || backend.mode !== "gpu") throw new GraphUnsupportedError(`the MoE layer runs on the CPU (${backend.why})`);
  // Lavapipe, tiny fixture: 175 ms a token replayed against 14 ms on the CPU decoder (2-core host).
  if (policy === "auto" && ctx.device.info.type === 4) throw new GraphUnsupportedError(`${ctx.device.info.name} is a CPU device: the CPU decoder is faster than the graph there (VKMOE_GRAPH=on runs it anyway)`);
  const moeLayers = cfg.moeLayers.flatMap((m, l) => (m ? [l] : []));
  // prompt chunks of the prefill plan's length where the experts are resident (split runs keep GRAPH_MAX_TOKENS);
  // VKMOE_PREFILL_CHUNK from the process env when the graph is made, as the folds' switches
  const chunk = prefillPlan(ctx.device, readConfig()).chunk;
  let stage: MoeGraphStage | undefined, notResident = "";
  try {
    stage = backend.graphStage(moeLayers, chunk);
  } catch (e) {
    if (e instanceof ExpertsNotResidentError) notResident = e.message;
    else if (e instanceof VkmoeError) throw new GraphUnsupportedError(e.message);
    else throw e;
  }
  try {
    const graph = new DecodeGraph(ctx.device, cfg, weights, stage, stage ? chunk : GRAPH_MAX_TOKENS);
    // split runs submit between the MoE calls: a pre-launched kernel would hold their barriers
    if (!stage) {
      backend.stopPrelaunch("the decode graph's split runs share the queue");
      backend.sharedDevice = true; // on a lost device the session says it, and frees the graph first
    }
    const why = stage
      ? `${ctx.device.info.name}: every op of the token in one submit, ${stage.mode} MoE call`
      : `${ctx.device.info.name}: the dense ops on the GPU a layer a submit, the experts through the per-layer MoE call (${notResident})`;
    return new GraphDecoder(graph, why);
  } catch (e) {
    stage?.[Symbol.dispose]();
    throw e;
  }
}

class HybridDecoder implements DeviceDecoder {
  readonly mode: "resident" | "split";
  constructor(private readonly graph: HybridGraph, readonly why: string) {
    this.mode = graph.stage ? "resident" : "split";
  }

  sequence(ctx: number, options: { timing?: boolean; hostExperts?: HostExperts } = {}): DeviceSequence {
    return this.graph.sequence(ctx, options);
  }

  batch(slots: number, ctx: number): DeviceBatch {
    // a batch replays every op of its tokens in one submit, the experts' too
    if (!this.graph.stage) throw new GraphUnsupportedError("a device batch needs every expert resident: this model runs split (a session per slot instead)");
    return new HybridBatch(this.graph, slots, ctx);
  }

  simulateDeviceLoss(): void {
    this.graph.injectDeviceLost = true;
  }

  [Symbol.dispose](): void {
    this.graph[Symbol.dispose]();
    this.graph.stage?.[Symbol.dispose]();
  }
}

/**
 * The hybrid graph of a Qwen3.5 MoE model (src/graph/hybrid-graph.ts) over `backend`'s device:
 * resident where every routed expert is, else split (the dense ops and the shared expert on the
 * GPU a layer a submit, the routed experts through the host's per-layer MoE call), as
 * openDeviceDecoder. Throws GraphUnsupportedError with the reason when the model cannot run so.
 */
export function openHybridDecoder(cfg: Qwen35MoeConfig, weights: HybridWeights, backend: MoeStageSource, policy: "auto" | "on" = "auto"): DeviceDecoder {
  const ctx = backend.context;
  if (!ctx || backend.mode !== "gpu") throw new GraphUnsupportedError(`the MoE layer runs on the CPU (${backend.why})`);
  if (policy === "auto" && ctx.device.info.type === 4) throw new GraphUnsupportedError(`${ctx.device.info.name} is a CPU device: the CPU decoder is faster than the graph there (VKMOE_GRAPH=on runs it anyway)`);
  const moeLayers = cfg.moeLayers.flatMap((m, l) => (m ? [l] : []));
  // prompt chunks of the prefill plan's length where the experts are resident (split runs keep GRAPH_MAX_TOKENS)
  const chunk = prefillPlan(ctx.device, readConfig()).chunk;
  let stage: MoeGraphStage | undefined, notResident = "";
  try {
    // read from the process env when the graph is made, as the folds' switches
    const sharedSlot = readConfig().VKMOE_SHARED_SLOT !== "off";
    stage = backend.graphStage(moeLayers, chunk, sharedSlot ? { sharedExperts: (l) => sharedExpertHost(weights.layers[l]!.shared) } : {});
  } catch (e) {
    if (e instanceof ExpertsNotResidentError) notResident = e.message;
    else if (e instanceof VkmoeError) throw new GraphUnsupportedError(e.message);
    else throw e;
  }
  try {
    const graph = new HybridGraph(ctx.device, cfg, weights, stage, stage ? chunk : GRAPH_MAX_TOKENS);
    // split runs submit between the MoE calls: a pre-launched kernel would hold their barriers
    if (!stage) {
      backend.stopPrelaunch("the hybrid graph's split runs share the queue");
      backend.sharedDevice = true; // on a lost device the session says it, and frees the graph first
    }
    const slot = stage !== undefined && moeLayers.some((l) => stage!.runsShared?.(l, 1) === true);
    const why = stage
      ? `${ctx.device.info.name}: every op of the token in one submit (Gated DeltaNet and gated attention layers, shared expert), ${stage.mode} MoE call${slot ? " (decode: the shared expert in it)" : ""}`
      : `${ctx.device.info.name}: the dense ops on the GPU a layer a submit (Gated DeltaNet and gated attention layers, shared expert), the experts through the per-layer MoE call (${notResident})`;
    return new HybridDecoder(graph, why);
  } catch (e) {
    stage?.[Symbol.dispose]();
    throw e;
  }
}

/** A shared expert of q4/q8 matrices as the graph stage takes it (its gate row as floats); undefined for other kinds. */
function sharedExpertHost(sh: SharedExpertWeights): SharedExpertHost | undefined {
  const { gate, up, down, scale } = sh;
  if (!(gate instanceof QuantLinear && up instanceof QuantLinear && down instanceof QuantLinear && scale instanceof FloatLinear) || scale.rows !== 1) return undefined;
  const gateRow = new Float32Array(scale.cols);
  readFloatRow(scale.dtype, scale.data, 0, scale.cols, gateRow);
  return { gate: gate.matrix, up: up.matrix, down: down.matrix, gateRow };
}

/** The error a lost device raises, for a user of the device that learnt of the loss elsewhere (`where`). */
export function deviceLostError(where: string): Error {
  return new DeviceLostError(where);
}

/** True when `e` says the GPU device was lost (the session then continues on the CPU path). */
export function isDeviceLost(e: unknown): boolean {
  return e instanceof DeviceLostError;
}
