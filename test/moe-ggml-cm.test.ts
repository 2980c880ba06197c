/**
 * moe_ggml_cm (src/moe/ggml-experts.ts with matrixCores, shaders/moe_ggml_cm.comp): the prompt
 * chunks' grouped MoE call over GGML block experts on the matrix cores, under the validation layer.
 * On a device with cooperative matrices the kernel itself; on every device its test variant
 * (matrixCores "emulated": the same loaders, f16 tiles and epilogue, plain sums in place of the
 * matrix products), so that Lavapipe checks all but the products.
 *
 * Against the CPU reference (f64 GEMVs over GGML's exact weights; h rounded to f32): NMSE <= 1e-5,
 * the matrix-core GEMMs' bound (the products' inputs rounded to f16: random data gives ~1e-7). x is
 * scaled by 2^-10 so that h stays within f16's range over the random blocks' large weights.
 * Shapes: the format pairs a K-quant file mixes, partial row tiles (I 96, D 96), items of 64 slots
 * (walked a tile of cmSlots at a time), a top-8 chunk of 64 tokens; sentinels past every output;
 * every slot tile size (cmSlots 8, 16, 32, 64) on some of them.
 * Negative controls (by hand, Lavapipe; 2026-12-06 on the 64 x 64 tile, 2026-12-07 on this one): the SwiGLU without the silu, and down without
 * the slot weight, each failed every case (NMSE 0.3..1).
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { cmSharedBytes, GgmlExpertKernels, GgmlExpertLayer } from "../src/moe/ggml-experts.ts";
import type { GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { nmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { cpuMoe, gpuMoe, randomExperts, randomRouting } from "./support/moe-ggml-cases.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => finish(ctx));

const on = device.enabled.cooperativeMatrix;
const why = device.decisions.find((d) => d.name === "cooperativeMatrix")?.reason ?? "no decision";
if (!on) console.log(`  moe_ggml_cm's own cases are skipped on ${device.info.name} (its emulated variant runs): ${why}`);
const canEmulate = device.enabled.shaderFloat16 && device.enabled.vulkanMemoryModel;
if (!canEmulate) console.log(`  moe_ggml_cm_emu skipped: ${device.info.name} lacks shaderFloat16 or vulkanMemoryModel`);
type Variant = true | "emulated";
const VARIANTS: Variant[] = [...(on ? [true as const] : []), ...(canEmulate ? ["emulated" as const] : [])];
const BOUND = 1e-5;
const sharedLimit = device.info.limits.maxComputeSharedMemorySize;

describe.skipIf(VARIANTS.length === 0)("moe_ggml_cm: lists grouped by expert on the matrix cores", () => {
  const cases: { what: string; gu: GgmlBlockType; dn: GgmlBlockType; D: number; I: number; E: number; calls: [number, number][]; slots: number[] }[] = [
    { what: "Q4_K/Q6_K D 256, I 512", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, E: 8, calls: [[40, 2], [64, 8]], slots: [8, 32] },
    // 2 experts, both chosen by each of 64 tokens: items of 64 slots (an item holds at most S <= 64)
    { what: "Q4_K/Q4_K D 512, I 256, items of 64 slots", gu: "Q4_K", dn: "Q4_K", D: 512, I: 256, E: 2, calls: [[64, 2]], slots: [8, 16, 32, 64] },
    { what: "Q5_K/Q6_K D 256, I 256", gu: "Q5_K", dn: "Q6_K", D: 256, I: 256, E: 8, calls: [[17, 8]], slots: [8, 16] },
    { what: "Q5_0 D 96, I 224 (partial row tiles)", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, E: 8, calls: [[33, 4]], slots: [8, 64] },
    { what: "Q4_1/Q5_1 D 224, I 96 (partial row tiles)", gu: "Q4_1", dn: "Q5_1", D: 224, I: 96, E: 8, calls: [[9, 2]], slots: [8] },
  ];
  for (const v of VARIANTS) {
    for (const c of cases) for (const cmSlots of c.slots) {
      if (cmSharedBytes(cmSlots) > sharedLimit) {
        console.log(`  ${c.what} at ${cmSlots} slots a tile skipped: it needs ${cmSharedBytes(cmSlots)} B of shared memory, ${device.info.name} has ${sharedLimit}`);
        continue;
      }
      test(`${v === true ? "matrix cores" : "emulated"}, ${c.what}, tiles of ${cmSlots} slots: ${c.calls.map(([S, k]) => `S ${S} k ${k}`).join(", ")}; NMSE <= ${BOUND} of the CPU reference`, () => {
        using kernels = new GgmlExpertKernels(device, { gateUp: c.gu, down: c.dn }, { matrixCores: v, cmSlots });
        expect(kernels.cmSlots).toBe(cmSlots);
        expect(kernels.matrixCores).toBe(true);
        expect(kernels.groupedDispatches()).toBe(3);
        let seed = 4100 + cases.indexOf(c) * 10;
        const experts = randomExperts(c.E, c.D, c.I, c.gu, c.dn, seed++);
        using layer = new GgmlExpertLayer(device, experts);
        let worst = 0;
        for (const [S, k] of c.calls) {
          const r = randomRouting(S, k, c.E, seed++);
          // x scaled by 2^-10: the random blocks' weights reach ~1e3, and h must stay within f16's range
          const x = randomGaussianF32(S * c.D, seed++).map((v) => v / 1024);
          const e = nmse(cpuMoe(experts, x, r, c.D), gpuMoe(device, kernels, layer, x, r, false));
          if (!(e <= BOUND)) throw new Error(`${c.what}: S=${S} k=${k}: NMSE ${e}`);
          worst = Math.max(worst, e);
        }
        console.log(`  ${v === true ? "matrix cores" : "emulated"}, ${c.what}, ${cmSlots} slots a tile: worst NMSE ${worst.toExponential(2)}`);
      }, 120_000);
    }
  }
});

test("a slot tile size the kernel has not, or one past the device's shared memory: one clear error", () => {
  for (const cmSlots of [0, 12, 128]) expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { cmSlots })).toThrow(/cmSlots must be one of 8, 16, 32, 64/);
  if (cmSharedBytes(64) > sharedLimit && canEmulate) {
    expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { matrixCores: "emulated", cmSlots: 64 })).toThrow(/needs \d+ B of shared memory/);
  }
});

test("matrix cores asked for where the device has none: one clear error", () => {
  if (on) {
    console.log(`  skipped: ${device.info.name} has cooperative matrices`);
    return;
  }
  expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { matrixCores: true })).toThrow(InvalidArgumentError);
  expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { matrixCores: true })).toThrow(/cooperative_matrix/);
});
