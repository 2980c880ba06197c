/**
 * GGML block experts through openExperts (src/model/experts.ts -> src/moe/ggml-backend.ts) on the
 * real driver under the validation layer: the per-layer MoE call of a model whose layers mix
 * formats (Q4_K/Q6_K, Q4_K/Q4_K, Q5_0/Q5_0, Q5_K/Q6_K, Q4_1/Q5_1, as K-quant files mix them), one
 * pipeline set per (gate/up, down) pair, against the CPU path on the same blocks (openExperts with
 * VKMOE_GPU=0: CpuExperts, f64 sums): NMSE <= 1e-9 at S = 1, 3, 17, 64. Also: a layer the kernels
 * do not take stays on the CPU (one line), a lost device falls back to the CPU with the same answers,
 * and bad input gets a typed error.
 */
import { describe, expect, test } from "bun:test";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { InvalidArgumentError } from "../src/errors.ts";
import { GgmlMoeBackend } from "../src/moe/ggml-backend.ts";
import { RoutingError } from "../src/moe/routing.ts";
import { openExperts, type ExpertConfig, type ExpertSource } from "../src/model/experts.ts";
import { FloatLinear, GgmlBlockLinear } from "../src/model/linear.ts";
import type { ExpertMatrices, LayerWeights } from "../src/model/weights.ts";
import { type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import { randomGgmlBlocks as randomBlocks } from "./support/ggml-blocks.ts";
import { randomRouting } from "./support/moe-ggml-cases.ts";

// the float path (its bounds are the float path's): the integer-dot one is tested in moe-ggml-rows-idp-gpu.test.ts
const env = (o: Partial<VkmoeEnv>): VkmoeEnv => ({ ...readConfig(), VKMOE_IDP: "off", ...o });

/** Per layer: gate/up type, down type ("F32": a float down matrix, which the GPU kernels do not take). */
type LayerTypes = [GgmlBlockType, GgmlBlockType | "F32"];

/** An ExpertSource of random GGML experts, layer l's types from `types[l]`, D x I. */
function source(types: LayerTypes[], E: number, D: number, I: number, seed: number): ExpertSource {
  const rand = mulberry32(seed);
  const experts = types.map(([gu, dn]) => Array.from({ length: E }, (): ExpertMatrices => {
    const g = new GgmlBlockLinear(gu, randomBlocks(gu, I, D, rand), I, D);
    const u = new GgmlBlockLinear(gu, randomBlocks(gu, I, D, rand), I, D);
    const d = dn === "F32" ? new FloatLinear("F32", randomGaussianF32(D * I, Math.floor(rand() * 2 ** 31), 0.02), D, I) : new GgmlBlockLinear(dn, randomBlocks(dn, D, I, rand), D, I);
    return { kind: "linear", gate: g, up: u, down: d };
  }));
  const layers: Pick<LayerWeights, "expertFormat" | "expertTypes" | "expertBytes">[] = types.map(([gu, dn]) => ({
    expertFormat: "ggml", expertTypes: [...new Set([gu, dn])], expertBytes: 0,
  }));
  return { layers, expert: (l, e) => experts[l]![e]!, releaseExperts: () => {} };
}

const MIX: LayerTypes[] = [["Q4_K", "Q6_K"], ["Q4_K", "Q4_K"], ["Q5_0", "Q5_0"], ["Q5_K", "Q6_K"], ["Q4_1", "Q5_1"], ["Q4_K", "Q6_K"]];
const E = 8, K = 3, D = 256, I = 512;
const cfg = (layers: number): ExpertConfig => ({ hidden: D, expertIntermediate: I, experts: E, topK: K, layers });

describe("GGML block experts, per-layer call: the GPU against the CPU path (NMSE <= 1e-9)", () => {
  test(`a layer mix of ${MIX.length} layers, ${new Set(MIX.map((t) => t.join("/"))).size} format pairs; S = 1, 3, 17, 64`, () => {
    const weights = source(MIX, E, D, I, 5);
    const lines: string[] = [];
    using gpu = openExperts(cfg(MIX.length), weights, { env: env({ VKMOE_VALIDATION: true }), log: (l) => lines.push(l) });
    using cpu = openExperts(cfg(MIX.length), weights, { env: env({ VKMOE_GPU: false }), log: () => {} });
    expect(gpu.mode, gpu.why).toBe("gpu");
    expect(cpu.mode).toBe("cpu");
    expect(lines).toEqual([]);
    expect(gpu.gpuBackend).toBeInstanceOf(GgmlMoeBackend);
    // one pipeline set per (gate/up, down) pair the layers use, not one per layer
    expect((gpu.gpuBackend as GgmlMoeBackend).kernelPairs.sort()).toEqual(["Q4_1/Q5_1", "Q4_K/Q4_K", "Q4_K/Q6_K", "Q5_0/Q5_0", "Q5_K/Q6_K"]);
    let worst = 0;
    for (const S of [1, 3, 17, 64]) {
      for (let l = 0; l < MIX.length; l++) {
        const r = randomRouting(S, K, E, 100 * S + l);
        const x = randomGaussianF32(S * D, 7 * S + l, 1);
        const a = new Float32Array(S * D).fill(NaN), b = new Float32Array(S * D);
        gpu.forward(l, x, r, a);
        cpu.forward(l, x, r, b);
        const e = nmse(b, a);
        worst = Math.max(worst, e);
        expect({ S, l, types: MIX[l]!.join("/"), ok: e <= 1e-9 }).toEqual({ S, l, types: MIX[l]!.join("/"), ok: true });
      }
    }
    expect(gpu.takeValidationMessages()).toEqual([]);
    console.log(`GGML per-layer call, ${MIX.length} layers: worst NMSE ${worst.toExponential(2)}; ${gpu.why}`);
  }, 90_000);

  test("a layer whose down matrix the kernels do not take (F32 beside Q5_0) stays on the CPU, said in one line; the others on the GPU", () => {
    const types: LayerTypes[] = [["Q4_K", "Q6_K"], ["Q5_0", "F32"]];
    const weights = source(types, E, D, I, 9);
    const lines: string[] = [];
    using gpu = openExperts(cfg(2), weights, { env: env({ VKMOE_VALIDATION: true }), log: (l) => lines.push(l) });
    using cpu = openExperts(cfg(2), weights, { env: env({ VKMOE_GPU: false }), log: () => {} });
    expect(gpu.mode).toBe("cpu");
    expect(gpu.gpuBackend).toBeUndefined();
    expect(lines).toEqual([expect.stringMatching(/^vkmoe: Q5_0\/F32 experts run on the CPU: the GPU's GGML MoE kernels take Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K with gate and up alike \(read in place/)]);
    expect(gpu.why).toMatch(/^GPU: .*Q4_K\/Q6_K experts resident as the file holds them.*; Q5_0\/F32 experts run on the CPU/);
    for (const l of [0, 1]) {
      const r = randomRouting(5, K, E, l), x = randomGaussianF32(5 * D, l + 1, 1);
      const a = new Float32Array(5 * D), b = new Float32Array(5 * D);
      gpu.forward(l, x, r, a);
      cpu.forward(l, x, r, b);
      expect(nmse(b, a)).toBeLessThanOrEqual(1e-9);
    }
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, 60_000);

  test("a lost device: the call's answer from the CPU path, every later call there too", () => {
    const weights = source(MIX.slice(0, 2), E, D, I, 3);
    using gpu = openExperts(cfg(2), weights, { env: env({ VKMOE_VALIDATION: true }), log: () => {} });
    using cpu = openExperts(cfg(2), weights, { env: env({ VKMOE_GPU: false }), log: () => {} });
    expect(gpu.mode).toBe("gpu");
    gpu.simulateDeviceLoss();
    for (const l of [0, 1]) {
      const r = randomRouting(2, K, E, l), x = randomGaussianF32(2 * D, l + 1, 1);
      const a = new Float32Array(2 * D), b = new Float32Array(2 * D);
      gpu.forward(l, x, r, a);
      cpu.forward(l, x, r, b);
      expect(nmse(b, a)).toBeLessThanOrEqual(1e-9);
      expect(gpu.mode).toBe("cpu");
    }
    expect(gpu.why).toContain("device lost");
  }, 60_000);

  test("bad input: one typed error each", () => {
    const weights = source(MIX.slice(0, 1), E, D, I, 4);
    using gpu = openExperts(cfg(1), weights, { env: env({ VKMOE_VALIDATION: true }), log: () => {} });
    const x = new Float32Array(D), y = new Float32Array(D);
    const r = randomRouting(1, K, E, 1);
    expect(() => gpu.forward(0, x, { ...r, ids: Int32Array.from([0, 0, 1]) }, y)).toThrow(RoutingError);
    expect(() => gpu.forward(0, x, { ...r, ids: Int32Array.from([0, 1, E]) }, y)).toThrow(RoutingError);
    expect(() => gpu.forward(0, new Float32Array(D - 1), r, y)).toThrow(InvalidArgumentError);
    expect(() => gpu.forward(0, x, r, new Float32Array(D - 1))).toThrow(InvalidArgumentError);
    expect(() => gpu.forward(0, x, randomRouting(65, K, E, 1), new Float32Array(65 * D))).toThrow(RoutingError);
    expect(gpu.takeValidationMessages()).toEqual([]);
  });
});
