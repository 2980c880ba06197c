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
 *
 * With `normCols` (the hidden size D) the post-attention RMSNorm is folded in too (RouterNormArgs):
 * each workgroup forms RMSNorm(h + o) itself in shared memory, and the last writes h = h + o and the
 * normed rows for the experts: the decode graph's post norm, one more dependent step fewer. Its
 * values are dec_rmsnorm's up to the order of the sum of squares.
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
 * chosenOffset, seq, routeFlags (dec_route's), normWOffset, eps (f32); with the norm folded in (else
 * any buffers): h rw, o r, the norm's weights r, its output w: 56 B.
 */
export const DEC_ROUTER_ROUTE: ShaderInterface = { name: "dec_router_route", storageBuffers: 14, pushConstantBytes: 56 };
/** Tokens a call takes: the last workgroup routes them one after another. */
export const ROUTER_ROUTE_MAX_S = 4;

/** The route's tables as RouteArgs (logits, S, E and logitsOffset come from the GEMV's). */
type RouteTables = Omit<RouteArgs, "logits" | "S" | "E" | "logitsOffset">;

/** The post-attention norm folded into the call: xn = RMSNorm(h + o) * weights, then h = h + o; S rows of D floats each from xOffset. */
export interface RouterNormArgs {
  /** The residual: read, then h + o written back (by the last workgroup). */
  h: Buffer;
  /** What the residual adds (the o projection). */
  add: Buffer;
  weights: Buffer;
  /** Floats: the norm's D weights from here. */
  weightOffset: number;
  eps: number;
  /** The normed rows, written (the router GEMV reads its own copy; the experts read these). */
  xn: Buffer;
}

export interface RouterRouteArgs extends RouteTables {
  /** The E x cols router, as GemvHalfArgs.weights (from uint weightOffset). */
  weights: Buffer;
  dtype: GemvWeightDType;
  /** S rows of cols floats from xOffset (not read where the norm is folded in: then `norm` gives them). */
  x: Buffer;
  /** Required with the kernel's normCols, else not allowed. */
  norm?: RouterNormArgs;
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
  /** The hidden size D: fold the post-attention norm in (RouterNormArgs; its S x D rows in shared memory: routerNormTokens). */
  normCols?: number;
}

/** Shared bytes of the kernel but the folded norm's rows: gemv_half.glsl's reduction rows, route.glsl's arrays (prob, three vec4 arrays of WG / 4, three of MAX_K), the arrival flag, the norm's partial sums (and xsh's 4 floats unfolded). */
function sharedBytes(wg: number, rpw: number): number {
  return 4 * wg * rpw + 4 * (ROUTE_MAX_E + ROUTE_MAX_E / 2) + 3 * 4 * wg + 3 * 4 * ROUTE_MAX_K + 4 + 4 * wg + 16;
}

/** Tokens a call of a kernel of this shape can norm (their rows of `cols` floats in shared memory), up to ROUTER_ROUTE_MAX_S; 0 where not one fits. */
export function routerNormTokens(device: Device, cols: number, workgroupSize = 128, rowsPerWorkgroup = 4): number {
  const free = device.info.limits.maxComputeSharedMemorySize - sharedBytes(workgroupSize, rowsPerWorkgroup);
  return Math.max(0, Math.min(ROUTER_ROUTE_MAX_S, Math.floor(free / (4 * cols))));
}

export class RouterRouteKernel extends DecoderKernel {
  readonly workgroupSize: number;
  readonly rowsPerWorkgroup: number;
  readonly useSubgroup: boolean;
  /** The folded norm's columns, 0 where it is not folded in. */
  readonly normCols: number;
  /** Tokens a call with the folded norm takes (routerNormTokens), 0 where it is not folded in. */
  readonly normTokens: number;

  constructor(device: Device, options: RouterRouteKernelOptions = {}) {
    const wg = checkRouteWorkgroup(device, options.workgroupSize ?? 128);
    const rpw = options.rowsPerWorkgroup ?? 4;
    if (!Number.isInteger(rpw) || rpw < 1 || rpw > 16) throw new InvalidArgumentError(`rowsPerWorkgroup must be an integer in 1..16, got ${rpw}`);
    const normCols = options.normCols ?? 0;
    if (!Number.isInteger(normCols) || normCols < 0) throw new InvalidArgumentError(`normCols must be a non-negative integer (0: no norm), got ${normCols}`);
    const shared = sharedBytes(wg, rpw), limit = device.info.limits.maxComputeSharedMemorySize;
    if (shared > limit) throw new InvalidArgumentError(`${wg} threads x ${rpw} rows need ${shared} bytes of shared memory, past this device's ${limit}`);
    const normTokens = normCols ? routerNormTokens(device, normCols, wg, rpw) : 0;
    if (normCols && normTokens < 1) throw new InvalidArgumentError(`a folded norm of ${normCols} columns needs ${shared + 4 * normCols} bytes of shared memory, past this device's ${limit}`);
    const sub = options.useSubgroup ?? device.info.subgroup.arithmetic;
    super(device, DEC_ROUTER_ROUTE, { 0: wg, 1: rpw, 2: sub ? 1 : 0, 3: normCols, 4: Math.max(1, normTokens) }, options);
    this.normCols = normCols;
    this.normTokens = normTokens;
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
    const n = a.norm;
    if ((n !== undefined) !== (this.normCols > 0)) throw new InvalidArgumentError(this.normCols ? "router-route: this kernel folds the norm in: give `norm`" : "router-route: `norm` needs a kernel made with normCols");
    let normWords = [0, 0];
    if (n) {
      if (I !== this.normCols) throw new InvalidArgumentError(`router-route: a norm of ${this.normCols} columns on a router of ${I}`);
      if (S > this.normTokens) throw new InvalidArgumentError(`router-route: the folded norm takes up to ${this.normTokens} tokens a call on this device, got ${S}`);
      if (!(n.eps >= 0) || !Number.isFinite(n.eps)) throw new InvalidArgumentError(`router-route: eps must be a finite number >= 0, got ${n.eps}`);
      if (new Set([n.h, n.add, n.xn]).size !== 3 || [n.h, n.add, n.xn].some((b) => [a.logits, a.arrived, a.weights].includes(b))) throw new InvalidArgumentError("router-route: the norm's h, add and xn need buffers of their own");
      const wo = nonNegative("norm weightOffset", n.weightOffset);
      checkRange("router-route norm weights", n.weights, wo, I);
      for (const [name, b] of [["h", n.h], ["add", n.add], ["xn", n.xn]] as const) checkRange(`router-route norm ${name}`, b, xOffset, S * I);
      normWords = [wo, n.eps];
    }
    const x = n ? n.xn : a.x; // not read where the norm is folded in
    // without the norm, bindings 10-13 go unused: the kernel's own arrival word (10, 13) and weights (11, 12), not x:
    // 10 and 13 are declared writable, so the synchronization checks would count a write to x, racing any kernel
    // recorded beside this one that reads x (seen with Qwen3.5's shared-expert GEMVs in the same step)
    const set = this.setFor([a.weights, x, a.logits, a.table, a.work, a.pairs, a.slotWeight, a.slotExpert, a.chosen, a.arrived, n?.h ?? a.arrived, n?.add ?? a.weights, n?.weights ?? a.weights, n?.xn ?? a.arrived]);
    const pc = pushWords([E, I, S, weightOffset, xOffset, logitsOffset, flags, k, tableOffset, chosenOffset, seq, a.normalize ? 1 : 0, ...normWords], [13]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pc).dispatch(Math.ceil(E / this.rowsPerWorkgroup));
  }
}
