/**
 * The MoE router GEMV and the route in one dispatch (shaders/dec_router_route.comp), for calls of
 * up to ROUTER_ROUTE_MAX_S tokens (decode): the router's rows as GemvHalfKernel computes them
 * (f32 / f16 / bf16 weights, gemv_half.glsl), then in the last workgroup to finish the softmax,
 * top k and MoE tables as RouteKernel writes them (route.glsl). Bit for bit
 * GemvHalfKernel({ workgroupSize, rowsPerWorkgroup, useSubgroup }) then RouteKernel({
 * workgroupSize, useSubgroup }), without the barrier between the two: one dependent GPU step
 * fewer a MoE layer.
 *
 * The last workgroup is found by an arrival word (`arrived`, uint 0): 0 before a call, counted up
 * by each workgroup, set back to 0 by the last. Calls sharing a word must be separated by a
 * barrier (they are in the decode graph: one word serves every layer).
 */
import { InvalidArgumentError } from "../../errors.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";
import type { GemvWeightDType } from "./gemv-half.ts";
import { ROUTE_MAX_E, ROUTE_MAX_K, type RouteArgs } from "./route.ts";

/**
 * weights r, x r, logits rw (coherent), table `uvec2[]` r, work `uvec4[]` w, pairs w, slotWeight
 * w, slotExpert `uvec2[]` w, chosen w, arrived `uint[]` rw (coherent); push O (E), I, S,
 * weightOffset, xOffset, yOffset (the logits), flags (dec_gemv_half's), K, tableOffset,
 * chosenOffset, seq, routeFlags (dec_route's): 48 B.
 */
export const DEC_ROUTER_ROUTE: ShaderInterface = { name: "dec_router_route", storageBuffers: 10, pushConstantBytes: 48 };
/** Tokens a call takes: the last workgroup routes them one after another. */
export const ROUTER_ROUTE_MAX_S = 4;

/** The route's tables as RouteArgs (logits, S, E and logitsOffset come from the GEMV's). */
type RouteTables = Omit<RouteArgs, "logits" | "S" | "E" | "logitsOffset">;

export interface RouterRouteArgs extends RouteTables {
  /** The E x cols router, as GemvHalfArgs.weights (from uint weightOffset). */
  weights: Buffer;
  dtype: GemvWeightDType;
  /** S rows of cols floats from xOffset. */
  x: Buffer;
  /** [S][E] logits written at logitsOffset (then read by the route). */
  logits: Buffer;
  /** Arrival word at uint 0: 0 before the call, 0 after. */
  arrived: Buffer;
  /** Experts: the router's rows. */
  E: number;
  cols: number;
  S: number;
  weightOffset?: number;
  xOffset?: number;
  logitsOffset?: number;
}

export interface RouterRouteKernelOptions extends DecoderKernelOptions {
  /** Threads per workgroup, for both halves: a power of two, 16..1024 (default 128, GemvHalfKernel's and RouteKernel's). */
  workgroupSize?: number;
  /** Router rows per workgroup (default 4, GemvHalfKernel's). */
  rowsPerWorkgroup?: number;
  /** Reductions by subgroup ops first, in both halves (default: where the device has subgroup arithmetic in compute). */
  useSubgroup?: boolean;
}

function u32(name: string, v: number): number {
  if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new InvalidArgumentError(`${name} must be an integer in 0..2^32-1, got ${v}`);
  return v;
}

export class RouterRouteKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly rowsPerWorkgroup: number;
  readonly useSubgroup: boolean;

  constructor(device: Device, options: RouterRouteKernelOptions = {}) {
    const wg = options.workgroupSize ?? 128;
    const maxWg = Math.min(1024, device.info.limits.maxComputeWorkGroupInvocations);
    if (!Number.isInteger(wg) || wg < ROUTE_MAX_K || wg > maxWg || (wg & (wg - 1)) !== 0) {
      throw new InvalidArgumentError(`workgroupSize must be a power of two in ${ROUTE_MAX_K}..${maxWg}, got ${wg}`);
    }
    const rpw = options.rowsPerWorkgroup ?? 4;
    if (!Number.isInteger(rpw) || rpw < 1 || rpw > 16) throw new InvalidArgumentError(`rowsPerWorkgroup must be an integer in 1..16, got ${rpw}`);
    // gemv_half.glsl's reduction rows, route.glsl's arrays (prob, three vec4 arrays of WG / 4, three of MAX_K), the arrival flag
    const shared = 4 * wg * rpw + 4 * (ROUTE_MAX_E + ROUTE_MAX_E / 2) + 3 * 4 * wg + 3 * 4 * ROUTE_MAX_K + 4;
    if (shared > device.info.limits.maxComputeSharedMemorySize) throw new InvalidArgumentError(`${wg} threads x ${rpw} rows need ${shared} bytes of shared memory, past this device's ${device.info.limits.maxComputeSharedMemorySize}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_ROUTER_ROUTE, { 0: wg, 1: rpw, 2: sub ? 1 : 0 }, options);
    this.workgroupSize = wg;
    this.rowsPerWorkgroup = rpw;
    this.useSubgroup = sub;
  }

  /** Records one dispatch of ceil(E / rowsPerWorkgroup) workgroups. The caller places barriers around it. */
  record(cb: CommandBuffer, a: RouterRouteArgs): CommandBuffer {
    const { S, E, k, cols: I } = a;
    if (!Number.isInteger(S) || S < 1 || S > ROUTER_ROUTE_MAX_S) throw new InvalidArgumentError(`S must be an integer in 1..${ROUTER_ROUTE_MAX_S}, got ${S}`);
    if (!Number.isInteger(E) || E < 1 || E > ROUTE_MAX_E) throw new InvalidArgumentError(`E must be an integer in 1..${ROUTE_MAX_E}, got ${E}`);
    if (!Number.isInteger(I) || I < 1) throw new InvalidArgumentError(`cols must be a positive integer, got ${I}`);
    const maxK = Math.min(ROUTE_MAX_K, E);
    if (!Number.isInteger(k) || k < 1 || k > maxK) throw new InvalidArgumentError(`k must be an integer in 1..${maxK} (E = ${E}), got ${k}`);
    if (typeof a.normalize !== "boolean") throw new InvalidArgumentError(`normalize must be a boolean, got ${String(a.normalize)}`);
    if (a.dtype !== "f16" && a.dtype !== "bf16" && a.dtype !== "f32") throw new InvalidArgumentError(`dtype must be "f16", "bf16" or "f32", got ${String(a.dtype)}`);
    const weightOffset = u32("weightOffset", a.weightOffset ?? 0), xOffset = u32("xOffset", a.xOffset ?? 0), logitsOffset = u32("logitsOffset", a.logitsOffset ?? 0);
    const seq = u32("seq", a.seq ?? 0), tableOffset = u32("tableOffset", a.tableOffset ?? 0), chosenOffset = u32("chosenOffset", a.chosenOffset ?? 0);
    const elements = E * I, slots = S * k;
    if (a.dtype === "f32") {
      if (weightOffset + elements + 8 > 2 ** 32) throw new InvalidArgumentError(`weights: ${elements} f32 at uint ${weightOffset} exceed 32-bit indexing`);
      checkRange("router-route weights", a.weights, weightOffset, elements);
    } else {
      if (2 * weightOffset + elements + 8 > 2 ** 32) throw new InvalidArgumentError(`weights: ${elements} halves at uint ${weightOffset} exceed 32-bit half indexing`);
      checkRange("router-route weights", a.weights, weightOffset, Math.ceil(elements / 2));
    }
    const tables = [a.work, a.pairs, a.slotWeight, a.slotExpert];
    if (new Set(tables).size !== tables.length) throw new InvalidArgumentError("work, pairs, slotWeight and slotExpert must be distinct buffers (each table starts at element 0)");
    if (a.arrived === a.logits || tables.includes(a.arrived)) throw new InvalidArgumentError("the arrival word needs a buffer of its own");
    checkRange("router-route x", a.x, xOffset, S * I);
    checkRange("router-route logits", a.logits, logitsOffset, S * E);
    checkRange("router-route table", a.table, 2 * tableOffset, 2 * E);
    checkRange("router-route work", a.work, 0, 4 * (1 + slots));
    checkRange("router-route pairs", a.pairs, 0, slots);
    checkRange("router-route slotWeight", a.slotWeight, 0, slots);
    checkRange("router-route slotExpert", a.slotExpert, 0, 2 * slots);
    checkRange("router-route chosen", a.chosen, chosenOffset, slots);
    checkRange("router-route arrived", a.arrived, 0, 1);
    if (xOffset + S * I > 0xffffffff || logitsOffset + S * E > 0xffffffff || tableOffset + E > 0xffffffff || chosenOffset + slots > 0xffffffff) throw new InvalidArgumentError("router-route: an element index does not fit in 32 bits");
    const set = this.setFor([a.weights, a.x, a.logits, a.table, a.work, a.pairs, a.slotWeight, a.slotExpert, a.chosen, a.arrived]);
    const flags = a.dtype === "f32" ? 2 : a.dtype === "bf16" ? 1 : 0;
    const pc = pushWords([E, I, S, weightOffset, xOffset, logitsOffset, flags, k, tableOffset, chosenOffset, seq, a.normalize ? 1 : 0]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(Math.ceil(E / this.rowsPerWorkgroup));
  }
}
