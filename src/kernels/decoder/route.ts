/**
 * The MoE router on the GPU (shaders/dec_route.comp): softmax over each token's E logits, top k,
 * optional renormalisation, as src/model/ops.ts routeTopK, writing the MoE layer's device tables
 * for the call (work list, pairs, slot weights, slot experts) so that the expert kernels can
 * follow without a trip through the host. One workgroup per token, one dispatch; the top k by
 * rank (no rounds of reductions: 3 workgroup barriers, 4 when E exceeds the workgroup size).
 */
import { InvalidArgumentError } from "../../errors.ts";
import { CHUNK_MAX_TOKENS, MAX_EXPERTS, MAX_TOP_K } from "../../moe/routing.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/**
 * logits r, table `uvec2[]` r, work `uvec4[]` w, pairs w, slotWeight w, slotExpert `uvec2[]` w,
 * chosen w; push S, E, K, logitsOffset, tableOffset (uvec2), chosenOffset, seq, flags: 32 B.
 */
export const DEC_ROUTE: ShaderInterface = { name: "dec_route", storageBuffers: 7, pushConstantBytes: 32 };
/** Tokens per dispatch (workgroups), experts and experts per token the shader takes. */
export const ROUTE_MAX_S = CHUNK_MAX_TOKENS;
export const ROUTE_MAX_E = MAX_EXPERTS;
export const ROUTE_MAX_K = MAX_TOP_K;

export interface RouteArgs {
  /** [S][E] router logits (f32) at logitsOffset. Finite values (see the shader for -Infinity/NaN). */
  logits: Buffer;
  /** Expert handles, 2 words each (opaque, copied through): expert e's at uvec2 element tableOffset + e. */
  table: Buffer;
  /** Work list, uvec4s from element 0: header (S, k, S*k, seq), then S*k items (handle.x, handle.y, u, 1). */
  work: Buffer;
  /** S*k words from 0: pairs[u] = u. */
  pairs: Buffer;
  /** S*k floats from 0: slot u's router weight. */
  slotWeight: Buffer;
  /** S*k uvec2 from 0: slot u's expert handle. */
  slotExpert: Buffer;
  /** S*k words at chosenOffset: slot u's expert id (slot u = t*k + j: token t's j-th choice). */
  chosen: Buffer;
  S: number;
  E: number;
  k: number;
  /** Divide the k weights by their sum (the model's norm_topk_prob). */
  normalize: boolean;
  /** The call's sequence number, copied to the work header's .w (u32; default 0). */
  seq?: number;
  /** Floats (default 0). */
  logitsOffset?: number;
  /** uvec2 elements (default 0). */
  tableOffset?: number;
  /** Words (default 0). */
  chosenOffset?: number;
}

export interface RouteKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup: a power of two, 16..1024, default 128 (ceil(E / 128) experts per thread). */
  workgroupSize?: number;
  /** Softmax max and sum by subgroupMax/subgroupAdd first (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

/** A u32 push-constant word, or an InvalidArgumentError naming it. */
export function nonNegative(name: string, v: number): number {
  if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new InvalidArgumentError(`${name} must be an integer in 0..2^32-1, got ${v}`);
  return v;
}

/** The route's workgroup size checked (a power of two, MAX_TOP_K .. min(1024, the device's limit)): RouteKernel's and RouterRouteKernel's. */
export function checkRouteWorkgroup(device: Device, wg: number): number {
  const maxWg = Math.min(1024, device.info.limits.maxComputeWorkGroupInvocations);
  if (!Number.isInteger(wg) || wg < MAX_TOP_K || wg > maxWg || (wg & (wg - 1)) !== 0) {
    throw new InvalidArgumentError(`workgroupSize must be a power of two in ${MAX_TOP_K}..${maxWg}, got ${wg}`);
  }
  return wg;
}

/**
 * A routing call's arguments checked against its buffers (RouteKernel's, and RouterRouteKernel's
 * with its own token limit), `what` naming the kernel in the errors; its push-constant words.
 */
export function checkRouteCall(what: string, a: RouteArgs, maxS: number): { seq: number; logitsOffset: number; tableOffset: number; chosenOffset: number } {
  const { S, E, k } = a;
  if (!Number.isInteger(S) || S < 1 || S > maxS) throw new InvalidArgumentError(`S must be an integer in 1..${maxS}, got ${S}`);
  if (!Number.isInteger(E) || E < 1 || E > ROUTE_MAX_E) throw new InvalidArgumentError(`E must be an integer in 1..${ROUTE_MAX_E}, got ${E}`);
  const maxK = Math.min(ROUTE_MAX_K, E);
  if (!Number.isInteger(k) || k < 1 || k > maxK) throw new InvalidArgumentError(`k must be an integer in 1..${maxK} (E = ${E}), got ${k}`);
  if (typeof a.normalize !== "boolean") throw new InvalidArgumentError(`normalize must be a boolean, got ${String(a.normalize)}`);
  const seq = nonNegative("seq", a.seq ?? 0);
  const logitsOffset = nonNegative("logitsOffset", a.logitsOffset ?? 0);
  const tableOffset = nonNegative("tableOffset", a.tableOffset ?? 0);
  const chosenOffset = nonNegative("chosenOffset", a.chosenOffset ?? 0);
  const slots = S * k;
  const tables = [a.work, a.pairs, a.slotWeight, a.slotExpert];
  if (new Set(tables).size !== tables.length) throw new InvalidArgumentError("work, pairs, slotWeight and slotExpert must be distinct buffers (each table starts at element 0)");
  checkRange(`${what} logits`, a.logits, logitsOffset, S * E);
  checkRange(`${what} table`, a.table, 2 * tableOffset, 2 * E);
  checkRange(`${what} work`, a.work, 0, 4 * (1 + slots));
  checkRange(`${what} pairs`, a.pairs, 0, slots);
  checkRange(`${what} slotWeight`, a.slotWeight, 0, slots);
  checkRange(`${what} slotExpert`, a.slotExpert, 0, 2 * slots);
  checkRange(`${what} chosen`, a.chosen, chosenOffset, slots);
  if (logitsOffset + S * E > 0xffffffff || tableOffset + E > 0xffffffff || chosenOffset + slots > 0xffffffff) throw new InvalidArgumentError(`${what}: an element index does not fit in 32 bits`);
  return { seq, logitsOffset, tableOffset, chosenOffset };
}

export class RouteKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly useSubgroup: boolean;

  constructor(device: Device, options: RouteKernelOptions = {}) {
    const wg = checkRouteWorkgroup(device, options.workgroupSize ?? 128);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_ROUTE, { 0: wg, 2: sub ? 1 : 0 }, options);
    this.workgroupSize = wg;
    this.useSubgroup = sub;
  }

  /** Records one dispatch of S workgroups. The caller places barriers around it. */
  record(cb: CommandBuffer, a: RouteArgs): CommandBuffer {
    const { S, E, k } = a;
    const { seq, logitsOffset, tableOffset, chosenOffset } = checkRouteCall("route", a, ROUTE_MAX_S);
    const set = this.setFor([a.logits, a.table, a.work, a.pairs, a.slotWeight, a.slotExpert, a.chosen]);
    const pc = pushWords([S, E, k, logitsOffset, tableOffset, chosenOffset, seq, a.normalize ? 1 : 0]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(S);
  }
}
