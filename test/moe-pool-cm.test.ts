/**
 * The graph stage's calls regrouped by expert (QuantGraphStage "by-expert", S > 4) on the matrix
 * cores (shaders/moe_pool_cm.glsl, matrixCores), validation layer on: each call against the f64
 * reference of the MoE layer. On a device with cooperative matrices the kernel itself; on every
 * device its test variant (matrixCores "emulated": the same loaders, f16 tiles and epilogue, plain
 * sums in place of the matrix products), so that Lavapipe checks all but the products.
 *
 * Bound NMSE <= 1e-5 per case, the matrix-core GEMMs' (weights and x rounded to f16 for the
 * products: random data gives ~1e-7). Covered: q4 and q8; f16 and f32 scales; groups of 32 and 128;
 * both addressing modes; S 5..64; items of 1..20 slots (dec_group_experts splits them into items of
 * at most 8, the tile's slots); partial row tiles (I = 80, D = 96, D = 130); rows not 16-byte
 * aligned and a partial last step (I = 98, D = 130); the SwiGLU clamp; a slot with no expert.
 * Negative controls (by hand, Lavapipe, 2026-12-07): the SwiGLU without the silu, and down reading
 * the gate/up rows' layout instead of its column blocks, each failed every case.
 */
import { describe, expect, test } from "bun:test";
import type { QuantGraphStage } from "../src/moe/graph-stage.ts";
import { moeReference, type ExpertWeights } from "../src/moe/reference.ts";
import type { ExpertShape } from "../src/pool/expert-layout.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/index.ts";
import { caseNmse, formatMessages, itemSizes, makeExperts, MoeHarness, skewedRouting, validationEnv } from "./cases/moe.ts";
import { StageCalls } from "./support/stage-calls.ts";

const BOUND = 1e-5;

interface Config { label: string; shape: ExpertShape; E: number; K: number; limit?: number; addressing: "bda" | "descriptor"; cases: number[]; seed: number }

function run(c: Config, variant: true | "emulated"): void {
  const { shape, E, K } = c;
  const D = shape.hidden, maxS = Math.max(...c.cases);
  const experts: ExpertWeights[] = makeExperts(shape, E, 1, c.seed)[0]!;
  const h = new MoeHarness({ shape, experts: E, topK: K, layers: 1, limit: c.limit, weights: (_l, e) => experts[e]!, addressing: c.addressing, budgetMB: 256 }, validationEnv());
  const owned: Disposable[] = [];
  const sizes: number[] = [];
  let worst = 0;
  try {
    expect(h.moe.mode, h.moe.why).toBe("gpu");
    expect(h.moe.preload([0]).complete).toEqual([0]);
    const device = h.moe.context!.device;
    const stage = h.moe.graphStage([0], maxS, { matrixCores: variant }) as QuantGraphStage;
    owned.push(stage);
    expect(stage.matrixCores).toBe(true);
    const calls = new StageCalls(device, maxS, D, K);
    owned.push(calls);
    const rnd = mulberry32(c.seed);
    c.cases.forEach((S, i) => {
      expect(stage.pathFor(S)).toBe("by-expert");
      expect(stage.dispatches(S)).toBe(4); // group, gate+up, down, sum
      const { chosen, r } = skewedRouting(rnd, S, K, E, i === 1 ? Math.floor((S * K) / 2) : -1);
      sizes.push(...itemSizes(chosen, E));
      const xs = randomGaussianF32(S * D, c.seed * 7919 + i);
      calls.write(S, xs, chosen);
      const label = `${c.label} ${c.addressing} S=${S}`;
      const e = caseNmse(moeReference(xs, r, (id) => experts[id]!, undefined, c.limit, "float"), calls.run(stage, S, r.weights, label));
      worst = Math.max(worst, e);
      expect(e, `${label}: NMSE against the f64 reference`).toBeLessThanOrEqual(BOUND);
      expect(h.moe.takeValidationMessages(), label).toEqual([]);
    });
  } finally {
    for (const o of owned.reverse()) o[Symbol.dispose]();
    const messages = h.close();
    if (messages.length) throw new Error(`${c.label}: ${messages.length} validation message(s):\n${formatMessages(messages)}`);
  }
  console.log(`  ${variant === true ? "matrix cores" : "emulated"}, ${c.label} ${c.addressing}: S ${c.cases.join(",")}, items of ${Math.min(...sizes)}..${Math.max(...sizes)} slots; worst NMSE ${worst.toExponential(2)}`);
  expect(Math.max(...sizes)).toBeGreaterThan(8); // an expert split over several items
}

const CONFIGS: Config[] = [
  // gate+up O = 80: a partial row tile; down O = 96, its I = 80: 2.5 q4 steps
  { label: "q4/g32/f16 D=96 I=80", shape: { format: "q4", groupSize: 32, scaleType: "f16", hidden: 96, intermediate: 80 }, E: 32, K: 4, addressing: "bda", cases: [5, 23, 64], seed: 51 },
  { label: "q4/g32/f16 D=96 I=80", shape: { format: "q4", groupSize: 32, scaleType: "f16", hidden: 96, intermediate: 80 }, E: 32, K: 4, addressing: "descriptor", cases: [6, 64], seed: 52 },
  // h rows of 98 floats: unaligned (scalar loads), the last q8 step 2 columns; the clamp
  { label: "q8/g128/f32 D=256 I=98 limit 0.75", shape: { format: "q8", groupSize: 128, scaleType: "f32", hidden: 256, intermediate: 98 }, E: 16, K: 2, limit: 0.75, addressing: "bda", cases: [5, 40, 64], seed: 53 },
  // x rows of 130 floats: unaligned, the last q4 step 2 columns, a partial second group of 128
  { label: "q4/g128/f32 D=130 I=64", shape: { format: "q4", groupSize: 128, scaleType: "f32", hidden: 130, intermediate: 64 }, E: 24, K: 6, addressing: "descriptor", cases: [5, 33], seed: 55 },
];

const probe = new MoeHarness({ shape: CONFIGS[0]!.shape, experts: 4, topK: 1, layers: 1, weights: () => makeExperts(CONFIGS[0]!.shape, 1, 1, 1)[0]![0]!, addressing: "bda", budgetMB: 16 }, validationEnv());
const device = probe.moe.context?.device;
const on = device?.enabled.cooperativeMatrix === true;
const canEmulate = device !== undefined && device.enabled.shaderFloat16 && device.enabled.vulkanMemoryModel;
const name = device?.info.name ?? "no GPU";
probe.close();
if (!on) console.log(`  moe_pool_cm's own cases are skipped on ${name} (its emulated variant runs): no cooperative matrices`);
if (!canEmulate) console.log(`  moe_pool_cm_emu skipped: ${name} lacks shaderFloat16 or vulkanMemoryModel`);
const VARIANTS: (true | "emulated")[] = [...(on ? [true as const] : []), ...(canEmulate ? ["emulated" as const] : [])];

describe.skipIf(VARIANTS.length === 0)("by-expert calls on the matrix cores (moe_pool_cm) vs the f64 reference", () => {
  for (const v of VARIANTS) for (const c of CONFIGS) test(`${v === true ? "matrix cores" : "emulated"}, ${c.label}, ${c.addressing}`, () => run(c, v), 600_000);
});
