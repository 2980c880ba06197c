/**
 * The graph stage's calls regrouped by expert (QuantGraphStage "by-expert", S > 4) on the rows
 * kernels (shaders/moe_rows.glsl: a row per lane, float path) on the real driver (Lavapipe),
 * validation layer on: each call against the f64 reference of the MoE layer (NMSE <= 1e-9 per
 * case) and against the same call on the old grouped kernels (rowsForGrouped false: gemv_float's
 * moe_gateup / moe_down). The router's outputs the stage reads (chosen ids, slot weights) are
 * written by the test; dec_group_experts then builds the work list as in the graphs.
 *
 * Covered: q4 and q8; f16 and f32 scales; groups of 32, 64 and 128; both addressing modes; S 5..64;
 * items of 1..20 slots (several register chunks of 8, and partial ones); O with a partial 64-row
 * workgroup (I = 80, D = 96, D = 130); inputs whose rows are not 16-byte aligned (D = 130, I = 98)
 * and whose last 16-byte step is partial; the SwiGLU clamp; a slot with no expert (weight 0);
 * and the integer-dot path, where the rows kernels still read the float x (so they match the float
 * reference, while the old kernels match the integer-dot emulation: x and h quantized), there also a
 * call of 100 tokens (a longer prompt chunk: x's quantization pushed the per-layer call's 64 tokens
 * until 2026-12-07, and the old kernels' S = 100 case failed against the emulation; it also gave an
 * 8-layer Qwen3-30B-like Q4_0 file logits NMSE 0.42 from the CPU's on an H100).
 */
import { describe, expect, test } from "bun:test";
import type { QuantGraphStage } from "../src/moe/graph-stage.ts";
import { moeReference, type ExpertWeights, type MoePath } from "../src/moe/reference.ts";
import type { Routing } from "../src/moe/routing.ts";
import type { ExpertShape } from "../src/pool/expert-layout.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/index.ts";
import { caseNmse, formatMessages, itemSizes, makeExperts, MAX_ITEM_SLOTS, MoeHarness, skewedRouting, validationEnv } from "./cases/moe.ts";
import { StageCalls } from "./support/stage-calls.ts";

/** Float path against the f64 reference, per case. */
const ROWS_BOUND = 1e-9;
/** The old kernels against their own reference (as test/moe-layer.test.ts's per-case bound). */
const OLD_BOUND = 1e-8;
interface Config {
  label: string;
  shape: ExpertShape;
  E: number;
  K: number;
  limit?: number;
  addressing: "bda" | "descriptor";
  path: MoePath;
  cases: number[];
  seed: number;
}

function run(c: Config): void {
  const t0 = performance.now();
  const { shape, E, K } = c;
  const D = shape.hidden, maxS = Math.max(...c.cases);
  const experts: ExpertWeights[] = makeExperts(shape, E, 1, c.seed)[0]!;
  const env = validationEnv(c.path === "integer-dot" ? { VKMOE_IDP: "on" } : {});
  const h = new MoeHarness({ shape, experts: E, topK: K, layers: 1, limit: c.limit, weights: (_l, e) => experts[e]!, addressing: c.addressing, budgetMB: 256 }, env);
  const owned: Disposable[] = [];
  const sizes: number[] = [];
  let worstRows = 0, worstOld = 0, worstBetween = 0;
  try {
    expect(h.moe.mode, h.moe.why).toBe("gpu");
    expect(h.moe.why).toContain(`${c.addressing} addressing, ${c.path} path`);
    expect(h.moe.preload([0]).complete).toEqual([0]);
    const device = h.moe.context!.device;
    const rows = h.moe.graphStage([0], maxS, { rowsForGrouped: true }) as QuantGraphStage;
    owned.push(rows);
    const old = h.moe.graphStage([0], maxS, { rowsForGrouped: false }) as QuantGraphStage;
    owned.push(old);
    expect(rows.rowsForGrouped).toBe(true);
    expect(old.rowsForGrouped).toBe(false);
    const calls = new StageCalls(device, maxS, D, K);
    owned.push(calls);
    const rnd = mulberry32(c.seed);
    c.cases.forEach((S, i) => {
      expect(rows.pathFor(S)).toBe("by-expert");
      expect(rows.dispatches(S)).toBe(4);
      // integer-dot: quantize x, gate+up, quantize h, down, sum, after the regrouping
      expect(old.dispatches(S)).toBe(h.moe.gemvPath === "integer-dot" ? 6 : 4);
      const { chosen, r } = skewedRouting(rnd, S, K, E, i === 1 ? Math.floor(S * K / 2) : -1);
      sizes.push(...itemSizes(chosen, E));
      const xs = randomGaussianF32(S * D, c.seed * 7919 + i);
      calls.write(S, xs, chosen);
      const outputs = [rows, old].map((stage) => calls.run(stage, S, r.weights, `${c.label} S=${S}`));
      const label = `${c.label} ${c.addressing} ${c.path} S=${S}`;
      const ref = moeReference(xs, r, (e) => experts[e]!, undefined, c.limit, "float");
      const nRows = caseNmse(ref, outputs[0]!);
      const refOld = c.path === "float" ? ref : moeReference(xs, r, (e) => experts[e]!, undefined, c.limit, "integer-dot-grouped");
      const nOld = caseNmse(refOld, outputs[1]!);
      const nBetween = caseNmse(outputs[1]!, outputs[0]!);
      worstRows = Math.max(worstRows, nRows);
      worstOld = Math.max(worstOld, nOld);
      worstBetween = Math.max(worstBetween, nBetween);
      expect(nRows, `${label}: rows kernels vs f64 reference`).toBeLessThanOrEqual(ROWS_BOUND);
      expect(nOld, `${label}: old kernels vs their reference`).toBeLessThanOrEqual(OLD_BOUND);
      // Float path: both kernels compute the same f32 sums in another order.
      if (c.path === "float") expect(nBetween, `${label}: rows vs old kernels`).toBeLessThanOrEqual(ROWS_BOUND);
      const messages = h.moe.takeValidationMessages();
      expect(messages, label).toEqual([]);
    });
  } finally {
    for (const o of owned.reverse()) o[Symbol.dispose]();
    const messages = h.close();
    if (messages.length) throw new Error(`${c.label}: ${messages.length} validation message(s):\n${formatMessages(messages)}`);
  }
  const slots = sizes.reduce((a, b) => a + b, 0);
  console.log(`  ${c.label} ${c.addressing} ${c.path}: S ${c.cases.join(",")}, ${sizes.length} items of ${Math.min(...sizes)}..${Math.max(...sizes)} slots (${slots} slots); NMSE rows vs f64 ${worstRows.toExponential(2)}, old vs ${c.path === "float" ? "f64" : "emulation"} ${worstOld.toExponential(2)}, rows vs old ${worstBetween.toExponential(2)}; ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  // The sweep must reach items of one slot and of more than two register chunks of 8.
  expect(Math.min(...sizes)).toBe(1);
  expect(Math.max(...sizes)).toBeGreaterThanOrEqual(17);
  expect(Math.max(...sizes)).toBeLessThanOrEqual(MAX_ITEM_SLOTS);
}

const CONFIGS: Config[] = [
  // gate+up O = 80 and down O = 96: a partial second workgroup each; down's I = 80: 2.5 q4 steps.
  { label: "q4/g32/f16 D=96 I=80", shape: { format: "q4", groupSize: 32, scaleType: "f16", hidden: 96, intermediate: 80 }, E: 32, K: 4, addressing: "bda", path: "float", cases: [5, 9, 23, 64], seed: 31 },
  { label: "q4/g32/f16 D=96 I=80", shape: { format: "q4", groupSize: 32, scaleType: "f16", hidden: 96, intermediate: 80 }, E: 32, K: 4, addressing: "descriptor", path: "float", cases: [6, 17, 64], seed: 32 },
  // h rows of 98 floats: not 16-byte aligned (scalar loads), last q8 step 2 columns; the clamp.
  { label: "q8/g128/f32 D=256 I=98 limit 0.75", shape: { format: "q8", groupSize: 128, scaleType: "f32", hidden: 256, intermediate: 98 }, E: 16, K: 2, limit: 0.75, addressing: "bda", path: "float", cases: [5, 40, 64], seed: 33 },
  { label: "q8/g128/f32 D=256 I=98 limit 0.75", shape: { format: "q8", groupSize: 128, scaleType: "f32", hidden: 256, intermediate: 98 }, E: 16, K: 2, limit: 0.75, addressing: "descriptor", path: "float", cases: [7, 64], seed: 34 },
  // x rows of 130 floats (unaligned, last q4 step 2 columns, a partial second group of 128); down O = 130.
  { label: "q4/g128/f32 D=130 I=64", shape: { format: "q4", groupSize: 128, scaleType: "f32", hidden: 130, intermediate: 64 }, E: 24, K: 6, addressing: "bda", path: "float", cases: [5, 33, 64], seed: 35 },
  { label: "q8/g64/f16 D=160 I=130", shape: { format: "q8", groupSize: 64, scaleType: "f16", hidden: 160, intermediate: 130 }, E: 20, K: 3, addressing: "descriptor", path: "float", cases: [11, 64], seed: 36 },
  { label: "q8/g32/f16 D=64 I=48", shape: { format: "q8", groupSize: 32, scaleType: "f16", hidden: 64, intermediate: 48 }, E: 32, K: 8, addressing: "bda", path: "float", cases: [5, 64], seed: 37 },
];

describe("by-expert calls on the rows kernels vs the f64 reference and the old grouped kernels (float path)", () => {
  for (const c of CONFIGS) test(`${c.label}, ${c.addressing}`, () => run(c), 600_000);
});

describe("integer-dot path: the rows kernels read the float x (float reference), the old ones x quantized (emulation)", () => {
  const shape: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 96, intermediate: 80 };
  test("q4/g32/f16 D=96 I=80, bda", () => run({ label: "q4/g32/f16 D=96 I=80", shape, E: 32, K: 4, addressing: "bda", path: "integer-dot", cases: [5, 64, 100], seed: 41 }), 600_000);
  test("q8/g128/f32 D=256 I=98, descriptor", () => run({ label: "q8/g128/f32 D=256 I=98", shape: { format: "q8", groupSize: 128, scaleType: "f32", hidden: 256, intermediate: 98 }, E: 16, K: 3, addressing: "descriptor", path: "integer-dot", cases: [9, 64], seed: 42 }), 600_000);
});
