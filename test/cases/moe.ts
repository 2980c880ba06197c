/**
 * Shared pieces of the MoE-layer tests, for Bun (test/moe*.test.ts) and Deno (test/deno/moe.test.ts)
 * and for the child processes some tests start. No test framework here: helpers throw on failure.
 *
 *  - experts: quantized once per shape and shared by every case of a file;
 *  - routing: random, distinct ids per token, router weights including negatives and exact zeros;
 *  - PooledError: the NMSE of a whole test (bound 1e-8) plus a loose per-case bound (1e-6);
 *  - openMoe: a backend with the validation layer on, its instance captured so its messages can be
 *    read after disposal (leaks are reported at vkDestroyDevice) or after the device was dropped;
 *  - runSweep: the layer-vs-reference sweep of test 1;
 *  - BankOracle + runReplay: many consecutive calls, each against a fresh f64 reference.
 */
import { readConfig, type VkmoeEnv } from "../../src/config.ts";
import { MoeBackend, type MoeOptions, type MoeStats, type MoeTicket } from "../../src/moe/backend.ts";
import { expertReference, moeReference, type ExpertWeights, type MoePath } from "../../src/moe/reference.ts";
import type { Routing } from "../../src/moe/routing.ts";
import type { ExpertShape } from "../../src/pool/expert-layout.ts";
import { mulberry32, quantize, randomGaussianF32 } from "../../src/quant/index.ts";
import type { Instance, ValidationMessage } from "../../src/vk/index.ts";

/** Pooled NMSE bound of a test (float path) and the loose per-case bound that any real bug breaks. */
export const NMSE_BOUND = 1e-8;
export const CASE_BOUND = 1e-6;

/**
 * The environment the backend opens with: the process's VKMOE_* plus the validation layer. The
 * tests choose their own budgets, so VKMOE_BUDGET_MB (which would override `budgetMB`) is dropped,
 * and their GEMV path: float (VKMOE_IDP=off, checked against the f64 reference) unless a test asks
 * for the integer-dot path (checked against its emulation).
 */
export function validationEnv(extra: Partial<VkmoeEnv> = {}): VkmoeEnv {
  return { ...readConfig(), VKMOE_VALIDATION: true, VKMOE_BUDGET_MB: undefined, VKMOE_IDP: "off", ...extra };
}

/** experts[layer][e] for e in 0..E (e = E is the shared expert). Gaussian weights, std 0.05. */
export function makeExperts(shape: ExpertShape, E: number, layers = 1, seed = 1): ExpertWeights[][] {
  const { hidden: D, intermediate: I } = shape;
  let s = seed * 1_000_003;
  const q = (rows: number, cols: number) => quantize({ dtype: "f32", data: randomGaussianF32(rows * cols, s++, 0.05) }, rows, cols, shape);
  return Array.from({ length: layers }, () => Array.from({ length: E + 1 }, () => ({ gate: q(I, D), up: q(I, D), down: q(D, I) })));
}

/** A random router weight: mostly in [-0.25, 1.25), an exact 0 one time in 32 (the sum kernel skips those). */
function routerWeight(rnd: () => number): number {
  return rnd() < 1 / 32 ? 0 : Math.fround(rnd() * 1.5 - 0.25);
}

/** S tokens, each routed to k distinct experts of E; `sharedWeights` gives per-token shared-expert weights. */
export function randomRouting(rnd: () => number, S: number, k: number, E: number, sharedWeights = false): Routing {
  const ids = new Int32Array(S * k), weights = new Float32Array(S * k);
  const perm = Int32Array.from({ length: E }, (_, i) => i);
  for (let s = 0; s < S; s++) {
    for (let j = 0; j < k; j++) { // partial Fisher-Yates: k distinct ids
      const at = j + Math.floor(rnd() * (E - j));
      const t = perm[j]!; perm[j] = perm[at]!; perm[at] = t;
      ids[s * k + j] = perm[j]!;
      weights[s * k + j] = routerWeight(rnd);
    }
  }
  const r: Routing = { S, k, ids, weights };
  if (sharedWeights) r.sharedWeights = Float32Array.from({ length: S }, () => Math.fround(0.5 + rnd()));
  return r;
}

/** The f64 oracle for one call on layer `experts` (shared expert = experts[E] when the layer has one). */
export function reference(x: Float32Array, r: Routing, experts: ExpertWeights[], E: number, shared: boolean, limit?: number, path: MoePath = "float"): Float64Array {
  return moeReference(x, r, (e) => experts[e]!, shared ? experts[E] : undefined, limit, path);
}

/** NMSE over every output of a test, plus a loose bound per case (see test/kernels.test.ts). */
export class PooledError {
  private err = 0;
  private ref = 0;
  cases = 0;
  worst = 0;
  worstLabel = "";
  /** Adds one case; throws if the case alone is above `caseBound`. Returns the case's NMSE. */
  add(ref: ArrayLike<number>, got: ArrayLike<number>, caseBound: number, label: string): number {
    if (got.length < ref.length) throw new Error(`${label}: ${got.length} outputs, expected ${ref.length}`);
    let e = 0, r = 0;
    for (let i = 0; i < ref.length; i++) {
      e += (ref[i]! - got[i]!) ** 2;
      r += ref[i]! ** 2;
    }
    const n = e / r;
    if (!(e <= caseBound * r)) throw new Error(`${label}: NMSE ${n} above the per-case bound ${caseBound}`);
    this.err += e;
    this.ref += r;
    this.cases++;
    if (n > this.worst) { this.worst = n; this.worstLabel = label; }
    return n;
  }
  get nmse(): number {
    return this.err / this.ref;
  }
}

/** NMSE of one comparison (no bound). */
export function caseNmse(ref: ArrayLike<number>, got: ArrayLike<number>): number {
  let e = 0, r = 0;
  for (let i = 0; i < ref.length; i++) {
    e += (ref[i]! - got[i]!) ** 2;
    r += ref[i]! ** 2;
  }
  return e / r;
}

export function formatMessages(messages: ValidationMessage[]): string {
  return messages.map((m) => `[${m.severity}] ${m.idName}: ${m.message.slice(0, 400)}`).join("\n");
}

/** A backend with its validation instance captured at open (it stays readable after disposal or a dropped device). */
export class MoeHarness implements Disposable {
  readonly moe: MoeBackend;
  readonly instance: Instance | undefined;
  readonly logs: string[] = [];
  private closed = false;

  constructor(options: Omit<MoeOptions, "log">, env: VkmoeEnv = validationEnv()) {
    this.moe = MoeBackend.open({ ...options, log: (line) => this.logs.push(line) }, env);
    this.instance = this.moe.context?.instance;
  }

  /** Disposes the backend (device destruction reports leaks) and returns every validation message. */
  close(): ValidationMessage[] {
    if (!this.closed) {
      this.closed = true;
      this.moe[Symbol.dispose]();
    }
    return this.instance?.takeMessages() ?? [];
  }

  /** Disposes and throws if the validation layer said anything. */
  finish(): void {
    const messages = this.close();
    if (messages.length) throw new Error(`${messages.length} validation message(s):\n${formatMessages(messages)}`);
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/** Output buffer with 4 NaN sentinel floats past S*D (take must write exactly S*D floats). */
export function outputWithSentinels(n: number): Float32Array {
  return new Float32Array(n + 4).fill(Number.NaN);
}

export function checkSentinels(y: Float32Array, n: number, label: string): void {
  for (let i = n; i < y.length; i++) if (!Number.isNaN(y[i]!)) throw new Error(`${label}: y[${i}] past S*D = ${n} was written`);
  for (let i = 0; i < n; i++) if (!Number.isFinite(y[i]!)) throw new Error(`${label}: y[${i}] = ${y[i]} (not written, or not finite)`);
}

export interface SweepSpec {
  label: string;
  shape: ExpertShape;
  E: number;
  /** experts[0][0..E] (one layer). */
  experts: ExpertWeights[][];
  shared: boolean;
  addressing: "bda" | "descriptor";
  limit?: number;
  cases: [S: number, k: number][];
  seed: number;
  topK?: number;
  /** Kernel shape override (MoeOptions.kernel), e.g. another vendor's row of the tuning table. */
  kernel?: MoeOptions["kernel"];
  /** "integer-dot": open with VKMOE_IDP=on and check against the integer-dot emulation. */
  path?: MoePath;
  /** Integer-dot path: also accumulate the error against the float reference here (no per-case bound). */
  vsFloat?: PooledError;
  /** MoeOptions.fusedTokens (default: the backend's). */
  fusedTokens?: number;
  /** More VKMOE_* variables for the backend. */
  env?: Record<string, string>;
}

export interface SweepResult {
  mode: "gpu" | "cpu";
  why: string;
  stats: MoeStats;
  /** The backend's fusedTokens: calls of at most this many tokens ran fused. */
  fusedTokens: number;
  /** (token, expert) pairs of all cases, shared expert included. */
  pairs: number;
  messages: ValidationMessage[];
  logs: string[];
}

/** Test 1: every case on one backend, each against the f64 reference; adds to `pooled`. */
export function runSweep(spec: SweepSpec, pooled: PooledError): SweepResult {
  const { shape, E, experts, shared, limit } = spec;
  const D = shape.hidden;
  const topK = spec.topK ?? Math.max(...spec.cases.map(([, k]) => k));
  const path = spec.path ?? "float";
  const env = validationEnv({ ...(path === "integer-dot" ? { VKMOE_IDP: "on" } : {}), ...spec.env });
  const h = new MoeHarness({ shape, experts: E, topK, layers: 1, shared, limit, weights: (_l, e) => experts[0]![e]!, addressing: spec.addressing, budgetMB: 256, kernel: spec.kernel, fusedTokens: spec.fusedTokens }, env);
  let pairs = 0;
  try {
    const rnd = mulberry32(spec.seed);
    spec.cases.forEach(([S, k], i) => {
      const label = `${spec.label} ${spec.addressing} E=${E}${shared ? " +shared" : ""} S=${S} k=${k}`;
      const r = randomRouting(rnd, S, k, E, shared && i % 2 === 1);
      const x = randomGaussianF32(S * D, spec.seed * 7919 + i);
      const y = outputWithSentinels(S * D);
      h.moe.forward(0, x, r, y);
      checkSentinels(y, S * D, label);
      pooled.add(reference(x, r, experts[0]!, E, shared, limit, path), y, CASE_BOUND, label);
      if (spec.vsFloat) spec.vsFloat.add(reference(x, r, experts[0]!, E, shared, limit), y, Infinity, label);
      pairs += S * (k + (shared ? 1 : 0));
    });
    return { mode: h.moe.mode, why: h.moe.why, stats: h.moe.stats(), fusedTokens: h.moe.fusedTokens, pairs, messages: [], logs: h.logs };
  } finally {
    const messages = h.close();
    if (messages.length) throw new Error(`${spec.label}: ${messages.length} validation message(s):\n${formatMessages(messages)}`);
  }
}

/**
 * The f64 reference for calls whose token rows come from a fixed bank: the output of each
 * (layer, expert, bank row) is computed once, then a call's reference is the router-weighted sum,
 * accumulated in the same order and precision as moeReference (so equal to it bit for bit; runReplay
 * checks that on its first calls).
 */
export class BankOracle {
  readonly rows: Float32Array[];
  private readonly outs = new Map<number, Float64Array>();
  constructor(readonly experts: ExpertWeights[][], readonly E: number, readonly D: number, rows: number, seed: number, readonly limit?: number, readonly path: MoePath = "float") {
    this.rows = Array.from({ length: rows }, (_, i) => randomGaussianF32(D, seed + i));
  }

  private out(layer: number, e: number, row: number): Float64Array {
    const key = (layer * (this.E + 1) + e) * this.rows.length + row;
    let o = this.outs.get(key);
    if (!o) {
      o = expertReference(this.experts[layer]![e]!, this.rows[row]!, this.limit, this.path);
      this.outs.set(key, o);
    }
    return o;
  }

  x(tokenRows: Int32Array): Float32Array {
    const x = new Float32Array(tokenRows.length * this.D);
    tokenRows.forEach((row, s) => x.set(this.rows[row]!, s * this.D));
    return x;
  }

  reference(layer: number, tokenRows: Int32Array, r: Routing, shared: boolean): Float64Array {
    const D = this.D;
    const y = new Float64Array(r.S * D);
    const add = (o: Float64Array, w: number, s: number) => {
      for (let d = 0; d < D; d++) y[s * D + d]! += w * o[d]!;
    };
    for (let s = 0; s < r.S; s++) {
      for (let j = 0; j < r.k; j++) add(this.out(layer, r.ids[s * r.k + j]!, tokenRows[s]!), r.weights[s * r.k + j]!, s);
      if (shared) add(this.out(layer, this.E, tokenRows[s]!), r.sharedWeights?.[s] ?? 1, s);
    }
    return y;
  }
}

export interface ReplaySpec {
  moe: MoeBackend;
  oracle: BankOracle;
  E: number;
  topK: number;
  layers: number;
  shared: boolean;
  calls: number;
  /** 1: forward(); 2: issue() the next call before take() of the previous one. */
  inFlight: 1 | 2;
  seed: number;
  label: string;
}

export interface ReplayResult {
  pooled: PooledError;
  /** Consecutive calls with the same S whose output was also compared to the previous call's reference. */
  staleChecks: number;
  /** ... of which the per-case bound rejected the previous reference (it must be all of them). */
  staleDetected: number;
  distinctS: number;
  maxS: number;
}

/** A token count: mostly 1..4, sometimes 5..16, now and then 17..64 (Lavapipe is slow on big calls). */
function nextS(rnd: () => number): number {
  const u = rnd();
  return u < 0.8 ? 1 + Math.floor(rnd() * 4) : u < 0.97 ? 5 + Math.floor(rnd() * 12) : 17 + Math.floor(rnd() * 48);
}

/** Test 2: `calls` consecutive calls with changing S, k, layer, routing and x, each against a fresh reference. */
export function runReplay(spec: ReplaySpec): ReplayResult {
  const { moe, oracle, E, shared } = spec;
  const D = oracle.D;
  const rnd = mulberry32(spec.seed);
  const pooled = new PooledError();
  const seen = new Set<number>();
  let staleChecks = 0, staleDetected = 0, maxS = 0;
  let prevRef: Float64Array | undefined;
  const pending: { take: (y: Float32Array) => void; ref: Float64Array; S: number; call: number }[] = [];
  const settle = () => {
    const p = pending.shift()!;
    const y = outputWithSentinels(p.S * D);
    p.take(y);
    const label = `${spec.label} call ${p.call} (S=${p.S})`;
    checkSentinels(y, p.S * D, label);
    pooled.add(p.ref, y, CASE_BOUND, label);
    // Negative control: a backend that replayed the previous call's tables would produce the
    // previous call's result; the per-case bound must tell the two apart.
    if (prevRef && prevRef.length === p.ref.length) {
      staleChecks++;
      if (!(caseNmse(prevRef, y) <= CASE_BOUND)) staleDetected++;
    }
    prevRef = p.ref;
  };
  for (let call = 0; call < spec.calls; call++) {
    const S = nextS(rnd);
    seen.add(S);
    maxS = Math.max(maxS, S);
    const k = 1 + Math.floor(rnd() * spec.topK);
    const layer = Math.floor(rnd() * spec.layers);
    const r = randomRouting(rnd, S, k, E, shared && rnd() < 0.5);
    const rows = Int32Array.from({ length: S }, () => Math.floor(rnd() * oracle.rows.length));
    const x = oracle.x(rows);
    const ref = oracle.reference(layer, rows, r, shared);
    if (call < 3) {
      const direct = reference(x, r, oracle.experts[layer]!, E, shared, oracle.limit, oracle.path);
      for (let i = 0; i < ref.length; i++) if (!Object.is(ref[i], direct[i])) throw new Error(`bank oracle differs from moeReference at call ${call}, output ${i}`);
    }
    if (spec.inFlight === 1) pending.push({ take: (y) => moe.forward(layer, x, r, y), ref, S, call });
    else {
      const ticket: MoeTicket = moe.issue(layer, x, r);
      pending.push({ take: (y) => ticket.take(y), ref, S, call });
    }
    if (pending.length >= spec.inFlight) settle();
  }
  while (pending.length) settle();
  return { pooled, staleChecks, staleDetected, distinctS: seen.size, maxS };
}

/** Slots an expert may take in one call (items of 1..MAX_ITEM_SLOTS slots). */
export const MAX_ITEM_SLOTS = 20;
/** Slot id dec_route writes for a token with no expert (NaN logits). */
export const NONE = 0xffffffff;


/**
 * S tokens, k distinct experts each, drawn with a skewed popularity (expert e weighs 1 / (1 + e/3))
 * and at most MAX_ITEM_SLOTS slots an expert, so a call's items range from 1 slot to the cap.
 * `none`: that slot gets no expert (id NONE).
 */
export function skewedRouting(rnd: () => number, S: number, k: number, E: number, none = -1): { chosen: Uint32Array; r: Routing } {
  const count = new Int32Array(E);
  const chosen = new Uint32Array(S * k), ids = new Int32Array(S * k), weights = new Float32Array(S * k);
  for (let t = 0; t < S; t++) {
    const taken = new Set<number>();
    for (let j = 0; j < k; j++) {
      const open = Array.from({ length: E }, (_, e) => e).filter((e) => !taken.has(e) && count[e]! < MAX_ITEM_SLOTS);
      const w = open.map((e) => 1 / (1 + e / 3));
      let u = rnd() * w.reduce((a, b) => a + b, 0), at = 0;
      while (at < open.length - 1 && (u -= w[at]!) > 0) at++;
      const e = open[at]!;
      taken.add(e);
      count[e]!++;
      const slot = t * k + j;
      chosen[slot] = e;
      ids[slot] = e;
      weights[slot] = rnd() < 1 / 32 ? 0 : Math.fround(rnd() * 1.5 - 0.25);
    }
  }
  if (none >= 0) {
    // dec_group_experts sets its weight to 0; the reference adds 0 x a real expert's output.
    chosen[none] = NONE;
    weights[none] = 0;
  }
  return { chosen, r: { S, k, ids, weights } };
}

/** Sizes of the items dec_group_experts makes from `chosen` (distinct experts, slots each). */
export function itemSizes(chosen: Uint32Array, E: number): number[] {
  const c = new Map<number, number>();
  for (const e of chosen) if (e < E) c.set(e, (c.get(e) ?? 0) + 1);
  return [...c.values()];
}
