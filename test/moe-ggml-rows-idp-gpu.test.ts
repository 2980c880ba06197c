/**
 * moe_ggml_rows_idp (src/moe/ggml-experts.ts, shaders/moe_ggml_rows_idp.comp) on the real driver under
 * the validation layer: the prompt chunks' grouped MoE call over GGML block experts on the
 * integer-dot path (x and h quantized by quantize_act in groups of 16, OpSUDot on the blocks' quants).
 *
 * - Tight gate: against the CPU GEMVs over GGML's exact weights fed what the GPU quantizes (x, and h
 *   rounded to f32, each quantized by quantize_act's rule on the CPU), f64 sums: NMSE <= 1e-7. Only f32
 *   rounding separates the two (and an h value on a quantization step's edge, one step), so a wrong
 *   min, offset, scale or run layout fails it.
 * - Against the float path's CPU reference (x and h as they are): NMSE <= 1e-3, the 8-bit bound.
 * Shapes: every format pair a K-quant file mixes, partial row blocks (D 96, I 224), 1 / 2 / 4 / 8 lanes a
 * row, chunks of 3 and 8 slots, items of ~10 and ~17 slots; sentinels past every output.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { GGML_IDP_GROUP } from "../src/kernels/decoder/ggml-gemv.ts";
import { ExpertQuantScratch, GgmlExpertKernels, GgmlExpertLayer, type GgmlExpertKernelOptions } from "../src/moe/ggml-experts.ts";
import type { GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { dequantizedActivations } from "../src/quant/intdot.ts";
import { nmse } from "../src/quant/metrics.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { cpuMoe, gpuMoe, randomExperts, randomRouting } from "./support/moe-ggml-cases.ts";

const ctx = openTestContext({ integerDotProduct: "on" });
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => finish(ctx));

/** quantize_act's rule (groups of 16): the values the GPU's integer dots see, as f32 (exact: q times a power of two). */
const quantized = (x: Float32Array) => Float32Array.from(dequantizedActivations(x, GGML_IDP_GROUP));

const E = 8;
const noIdp = !device.enabled.integerDotProduct || !device.info.subgroup.shuffle;
if (noIdp) console.log(`moe_ggml_rows_idp: skipped: ${device.info.name} lacks shaderIntegerDotProduct or subgroup shuffles`);

describe.skipIf(noIdp)("moe_ggml_rows_idp: lists grouped by expert on the integer-dot path", () => {
  const cases: { what: string; gu: GgmlBlockType; dn: GgmlBlockType; D: number; I: number; options: GgmlExpertKernelOptions }[] = [
    // default lanes: gate+up 1 (8 slices a row), down 2 (16 slices)
    { what: "Q4_K/Q6_K D 256, I 512, default lanes", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: {} },
    { what: "Q4_K/Q4_K D 512, I 256, a lane a row, chunks of 3 slots", gu: "Q4_K", dn: "Q4_K", D: 512, I: 256, options: { rowsLanes: 1, rowsTokensPerChunk: 3 } },
    { what: "Q5_K/Q5_K D 256, I 256, 2 lanes a row", gu: "Q5_K", dn: "Q5_K", D: 256, I: 256, options: { rowsLanes: 2 } },
    { what: "Q6_K/Q6_K D 256, I 512", gu: "Q6_K", dn: "Q6_K", D: 256, I: 512, options: {} },
    { what: "Q5_0 D 96, I 224 (partial row blocks)", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: {} },
    { what: "Q4_1/Q5_1 D 96, I 224, 8 lanes a row", gu: "Q4_1", dn: "Q5_1", D: 96, I: 224, options: { rowsLanes: 8 } },
    // the next slice read ahead: 3 and 7 slices a row over 4 lanes (lanes with none to prefetch), and 2 lanes over 64
    { what: "Q5_0 D 96, I 224, 4 lanes a row, next slice prefetched", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: { rowsLanes: 4, rowsPrefetch: true } },
    { what: "Q4_K/Q6_K D 256, I 512, next slice prefetched", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: { rowsPrefetch: true } },
    // several rows a lane: rows past O in the last workgroup (224 and 96 rows are not multiples of the workgroup's), and with the prefetch
    { what: "Q5_0 D 96, I 224, 2 rows a lane, 4 lanes a row", gu: "Q5_0", dn: "Q5_0", D: 96, I: 224, options: { rowsPerLane: 2, rowsLanes: 4 } },
    { what: "Q4_K/Q6_K D 256, I 512, 4 rows a lane, chunks of 3 slots", gu: "Q4_K", dn: "Q6_K", D: 256, I: 512, options: { rowsPerLane: 4, rowsTokensPerChunk: 3 } },
    { what: "Q5_K/Q4_K D 512, I 256, 3 rows a lane, next slice prefetched", gu: "Q5_K", dn: "Q4_K", D: 512, I: 256, options: { rowsPerLane: 3, rowsPrefetch: true } },
  ];
  for (const c of cases) {
    test(`${c.what}: S 40 k 2, S 17 k 8; NMSE <= 1e-7 of the quantized CPU reference, <= 1e-3 of the float one`, () => {
      using kernels = new GgmlExpertKernels(device, { gateUp: c.gu, down: c.dn }, { ...c.options, integerDot: true });
      let seed = 2900 + cases.indexOf(c) * 10;
      const experts = randomExperts(E, c.D, c.I, c.gu, c.dn, seed++);
      using layer = new GgmlExpertLayer(device, experts);
      using scratch = new ExpertQuantScratch(device, c.D, c.I, 40, 8);
      let tight = 0, loose = 0;
      for (const [S, k] of [[40, 2], [17, 8]] as const) {
        const r = randomRouting(S, k, E, seed++);
        const x = randomGaussianF32(S * c.D, seed++);
        const got = gpuMoe(device, kernels, layer, x, r, false, scratch);
        const t = nmse(cpuMoe(experts, x, r, c.D, quantized), got), l = nmse(cpuMoe(experts, x, r, c.D), got);
        if (!(t <= 1e-7) || !(l <= 1e-3)) throw new Error(`${c.what}: S=${S} k=${k}: NMSE ${t} (quantized reference), ${l} (float)`);
        tight = Math.max(tight, t);
        loose = Math.max(loose, l);
      }
      console.log(`  ${c.what}: worst NMSE ${tight.toExponential(2)} (quantized reference), ${loose.toExponential(2)} (float)`);
    }, 60_000);
  }

  test("lanes a row by default: the most (up to 8 and the subgroup size) that leave each lane 6 or more slices; the float path 2; an option wins", () => {
    using idp = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { integerDot: true });
    const most = Math.min(8, device.info.subgroup.size);
    // Qwen3-30B-A3B's rows: 2048 columns (64 slices), 768 (24), Qwen3.6's 512 (16); a 96-column row (3)
    expect([2048, 768, 512, 96].map((c) => idp.rowsLanesFor(c))).toEqual([Math.min(8, most), Math.min(4, most), Math.min(2, most), 1]);
    using float = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" });
    expect(float.rowsLanesFor(2048)).toBe(Math.min(2, device.info.subgroup.size));
    using fixed = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { integerDot: true, rowsLanes: 2 });
    expect(fixed.rowsLanesFor(2048)).toBe(2);
  });

  test("no scratch, or one too small; integerDot without the rows kernel: one clear error", () => {
    using kernels = new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { integerDot: true });
    const experts = randomExperts(E, 256, 256, "Q4_K", "Q6_K", 5);
    using layer = new GgmlExpertLayer(device, experts);
    const r = randomRouting(16, 2, E, 6), x = randomGaussianF32(16 * 256, 7);
    expect(() => gpuMoe(device, kernels, layer, x, r, false)).toThrow(/need an ExpertQuantScratch/);
    using small = new ExpertQuantScratch(device, 256, 256, 8, 2);
    expect(() => gpuMoe(device, kernels, layer, x, r, false, small)).toThrow(/a quantized scratch of 4096 values for x 16 x 256 and h 32 x 256/);
    expect(() => new GgmlExpertKernels(device, { gateUp: "Q4_K", down: "Q6_K" }, { integerDot: true, rowsForGrouped: false })).toThrow(/rowsForGrouped must be on/);
  });
});
