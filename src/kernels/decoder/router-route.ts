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
import { checkFloatWeights, type GemvWeightDType } from "./gemv-half.ts";
import { checkRouteCall, checkRouteWorkgroup, nonNegative, ROUTE_MAX_E, ROUTE_MAX_K, type RouteArgs } from "./route.ts";

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

export class RouterRouteKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly rowsPerWorkgroup: number;
  readonly useSubgroup: boolean;

  constructor(device: Device, options: RouterRouteKernelOptions = {}) {
    const wg = checkRouteWorkgroup(device, options.workgroupSize ?? 128);
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
    if (!Number.isInteger(I) || I < 1) throw new InvalidArgumentError(`cols must be a positive integer, got ${I}`);
    const { seq, logitsOffset, tableOffset, chosenOffset } = checkRouteCall("router-route", a, ROUTER_ROUTE_MAX_S);
    const weightOffset = nonNegative("weightOffset", a.weightOffset ?? 0), xOffset = nonNegative("xOffset", a.xOffset ?? 0);
    const flags = checkFloatWeights("router-route", a.weights, a.dtype, weightOffset, E * I);
    if (a.arrived === a.logits || [a.work, a.pairs, a.slotWeight, a.slotExpert].includes(a.arrived)) throw new InvalidArgumentError("the arrival word needs a buffer of its own");
    checkRange("router-route x", a.x, xOffset, S * I);
    checkRange("router-route arrived", a.arrived, 0, 1);
    if (xOffset + S * I > 0xffffffff) throw new InvalidArgumentError("router-route: an element index does not fit in 32 bits");
    const set = this.setFor([a.weights, a.x, a.logits, a.table, a.work, a.pairs, a.slotWeight, a.slotExpert, a.chosen, a.arrived]);
    const pc = pushWords([E, I, S, weightOffset, xOffset, logitsOffset, flags, k, tableOffset, chosenOffset, seq, a.normalize ? 1 : 0]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(Math.ceil(E / this.rowsPerWorkgroup));
  }
}
