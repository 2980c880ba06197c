/**
 * Test 1: the MoE layer on the real driver (Lavapipe in CI) against the f64 CPU reference, on both
 * addressing paths, with and without a shared expert: random routing, S in {1, 2, 7, 64},
 * k in {1, 8, 16}, E in {8, 128, 256} (every feasible combination, k ≤ E) on the main shape (q4,
 * group 32, f16 scales, D=64, I=32), and five cases each on q8/group 64/f32 (D=128, I=100),
 * q4/group 128/f32 (D=256, I=96) and q8/group 128/f16 with an unaligned I=98 and the SwiGLU clamp
 * (with the shared expert on one addressing path, without on the other). Pooled NMSE ≤ 1e-8 per
 * test, ≤ 1e-6 per case; every pair must have run on the GPU; take() writes exactly S*D floats;
 * no validation message, leaks at teardown included.
 * The integer-dot path (VKMOE_IDP=on: quantize_act, integer-dot gate+up, float down) runs the same
 * way against the CPU emulation of that path (NMSE ≤ 1e-8) and against the float reference
 * (≤ 1e-3, the kernels issue's bound; and far above 1e-8, so the test tells the two paths apart).
 * Shapes are small because Lavapipe runs these kernels slowly (~0.1 ms per workgroup on 2 cores,
 * and a cold pipeline compile takes seconds per variant): see the timings printed.
 */
import { describe, expect, test } from "bun:test";
import { mulberry32, nmse, randomGaussianF32 } from "../src/quant/index.ts";
import { FUSED_KERNEL, fusedIdpSharedBytes } from "../src/moe/shaders.ts";
import type { ExpertShape } from "../src/pool/expert-layout.ts";
import {
  CASE_BOUND, MoeHarness, NMSE_BOUND, PooledError, makeExperts, randomRouting, reference, runSweep, validationEnv, type SweepSpec,
} from "./cases/moe.ts";

const ADDRESSING = ["bda", "descriptor"] as const;
const TOKENS = [1, 2, 7, 64];
const TOPK = [1, 8, 16];

const MAIN: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 64, intermediate: 32 };
// E = 256 experts quantized once; the E = 8 and E = 128 backends use the first E (+ their own shared expert).
const mainExperts = makeExperts(MAIN, 256, 1, 11);
const firstE = (E: number) => [[...mainExperts[0]!.slice(0, E), mainExperts[0]![256]!]];

function sweep(spec: Omit<SweepSpec, "shared" | "seed">, seed: number, sharedValues = [false, true]): void {
  const t0 = performance.now();
  const pooled = new PooledError();
  for (const shared of sharedValues) {
    const r = runSweep({ ...spec, shared, seed: seed + (shared ? 1 : 0) }, pooled);
    expect(r.mode, `${spec.label}: ${r.why}`).toBe("gpu");
    expect(r.why).toContain(`${spec.addressing} addressing`);
    expect(r.logs).toEqual([]);
    expect(r.stats.gpuPairs).toBe(r.pairs);
    expect(r.stats.cpuPairs).toBe(0);
    expect(r.stats.calls).toBe(spec.cases.length);
    expect(r.stats.fusedCalls).toBe(spec.cases.filter(([S]) => S <= r.fusedTokens).length);
  }
  console.log(`  ${spec.label} ${spec.addressing} E=${spec.E}: ${pooled.cases} cases, pooled NMSE ${pooled.nmse.toExponential(2)}, worst ${pooled.worst.toExponential(2)} (${pooled.worstLabel}), ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
}

describe("layer vs f64 reference: q4 group 32 f16, D=64 I=32, every S × k × E, ± shared", () => {
  for (const addressing of ADDRESSING) for (const E of [8, 128, 256]) {
    const cases = TOKENS.flatMap((S) => TOPK.filter((k) => k <= E).map((k) => [S, k] as [number, number]));
    test(`${addressing}, E=${E}: ${cases.length} (S, k) cases × {no shared, shared}`, () => {
      sweep({ label: "q4/g32/f16", shape: MAIN, E, experts: firstE(E), addressing, cases }, 100 * E + (addressing === "bda" ? 1 : 5));
    });
  }
});

describe("other formats, group sizes, scale types, odd I and the SwiGLU clamp (E=32)", () => {
  const E = 32;
  const cases: [number, number][] = [[1, 1], [2, 16], [7, 8], [64, 4], [64, 1]];
  const configs: { label: string; shape: ExpertShape; limit?: number }[] = [
    { label: "q8/g64/f32 I=100", shape: { format: "q8", groupSize: 64, scaleType: "f32", hidden: 128, intermediate: 100 } },
    { label: "q4/g128/f32 D=256 I=96", shape: { format: "q4", groupSize: 128, scaleType: "f32", hidden: 256, intermediate: 96 } },
    { label: "q8/g128/f16 D=256 I=98 limit 0.75", shape: { format: "q8", groupSize: 128, scaleType: "f16", hidden: 256, intermediate: 98 }, limit: 0.75 },
  ];
  configs.forEach(({ label, shape, limit }, c) => {
    const experts = makeExperts(shape, E, 1, 20 + c);
    ADDRESSING.forEach((addressing, a) => {
      const shared = (a + c) % 2 === 0;
      test(`${label}, ${addressing}, ${shared ? "with" : "without"} a shared expert`, () => {
        sweep({ label, shape, E, experts, addressing, cases, limit }, 7000 + 10 * c + a, [shared]);
      });
    });
  });
});

describe("the NVIDIA MoE kernel shape (32 threads × 4 rows, chooseMoeKernelConfig) on this driver, via the kernel option", () => {
  // CI has no NVIDIA GPU: run the H200 row of the tuning table here so its workgroup shape is
  // checked too (E=256, k=16 included).
  for (const addressing of ADDRESSING) {
    test(`${addressing}`, () => {
      const cases: [number, number][] = [[1, 16], [7, 8], [64, 16], [2, 1]];
      sweep({ label: "q4/g32/f16 32x4", shape: MAIN, E: 256, experts: firstE(256), addressing, cases, kernel: { workgroupSize: 32, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1 } },
        9100 + (addressing === "bda" ? 0 : 1), [addressing === "bda"]);
    });
  }
});

describe("both call modes at every S: grouped (fusedTokens 0) and fused (fusedTokens 64, one dispatch)", () => {
  // By default calls of few tokens run fused and larger ones grouped; here each mode runs every S,
  // on both paths and both addressing paths, with a shared expert. The integer-dot fused call
  // quantizes x in each workgroup: checked against the same emulation as the grouped one.
  const E = 32;
  const cases: [number, number][] = [[1, 8], [2, 16], [7, 1], [64, 8]];
  for (const path of ["float", "integer-dot"] as const) for (const addressing of ADDRESSING) for (const fusedTokens of [0, 64]) {
    test(`${path}, ${addressing}, ${fusedTokens ? "fused" : "grouped"}`, () => {
      const t0 = performance.now();
      const pooled = new PooledError();
      const r = runSweep({ label: "q4/g32/f16", shape: MAIN, E, experts: firstE(E), addressing, cases, shared: true, seed: 8300 + fusedTokens, path, fusedTokens }, pooled);
      expect(r.mode, r.why).toBe("gpu");
      expect(r.why).toContain(`${path} path`);
      expect(r.stats.gpuPairs).toBe(r.pairs);
      expect(r.fusedTokens).toBe(fusedTokens);
      expect(r.stats.fusedCalls).toBe(fusedTokens ? cases.length : 0);
      console.log(`  ${path} ${addressing} ${fusedTokens ? "fused" : "grouped"}: ${pooled.cases} cases, NMSE ${pooled.nmse.toExponential(2)} vs ${path === "float" ? "f64 reference" : "emulation"}, ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    });
  }

  // The fused kernel needs float atomics (VK_EXT_shader_atomic_float); without them, or with
  // VKMOE_FLOAT_ATOMICS=off, every call runs grouped and the answer is the same.
  test("VKMOE_FLOAT_ATOMICS=off: no fused calls at any S, same results", () => {
    const pooled = new PooledError();
    const r = runSweep({ label: "q4/g32/f16", shape: MAIN, E, experts: firstE(E), addressing: "bda", cases, shared: true, seed: 8400, env: { VKMOE_FLOAT_ATOMICS: "off" } }, pooled);
    expect(r.mode, r.why).toBe("gpu");
    expect(r.why).toContain("no fused calls (no float atomics)");
    expect(r.fusedTokens).toBe(0);
    expect(r.stats.fusedCalls).toBe(0);
    expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
  });
});

describe("the integer-dot fused call quantizes x in each workgroup, as quantize_act does", () => {
  // Each group's max and sum come from subgroup shuffles when a group's words fit in one subgroup
  // (GROUP_SIZE/4 lanes), else through shared memory: both must match the emulation, including a D
  // that is not a multiple of 4 (scalar loads, a partial last word) or of 16 (padding words).
  const cases: [number, number][] = [[1, 8], [2, 3], [4, 8]];
  for (const shape of [
    { format: "q4", groupSize: 32, scaleType: "f16", hidden: 90, intermediate: 40 },
    { format: "q4", groupSize: 64, scaleType: "f32", hidden: 200, intermediate: 64 },
    { format: "q8", groupSize: 32, scaleType: "f16", hidden: 132, intermediate: 36 },
  ] as ExpertShape[]) {
    test(`${shape.format}/g${shape.groupSize} D=${shape.hidden}`, () => {
      const E = 16;
      const experts = makeExperts(shape, E, 1, 29 + shape.hidden);
      const pooled = new PooledError();
      const r = runSweep({ label: `${shape.format}/g${shape.groupSize} D=${shape.hidden}`, shape, E, experts, addressing: "bda", cases, shared: false, seed: 8500 + shape.hidden, path: "integer-dot", fusedTokens: 4 }, pooled);
      expect(r.mode, r.why).toBe("gpu");
      expect(r.why).toContain("integer-dot path");
      expect(r.stats.fusedCalls).toBe(cases.length);
      console.log(`  fused integer-dot ${shape.format}/g${shape.groupSize} D=${shape.hidden}: ${pooled.cases} cases, NMSE ${pooled.nmse.toExponential(2)} vs emulation`);
      expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    });
  }
});

describe("the integer-dot fused call needs its token's int8 x in shared memory", () => {
  // moe_fused_*_idp keeps ~2.4 bytes per column of x (plus 8 KiB for the row reduction) in shared
  // memory. A D that does not fit maxComputeSharedMemorySize (past ~10k on Lavapipe's 32 KiB, ~17k
  // on the H200's 48 KiB) runs the float fused kernel instead (float x: the float reference, not
  // the integer-dot emulation), and grouped calls stay on the integer-dot path.
  test("D = 32768: the fused call falls back to float x; the grouped call stays integer-dot", () => {
    const shape: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 32768, intermediate: 32 };
    const E = 4, k = 2, S = 1;
    const experts = makeExperts(shape, E, 1, 19);
    const rnd = mulberry32(23);
    const r = randomRouting(rnd, S, k, E);
    const x = randomGaussianF32(S * shape.hidden, 24);
    const float = reference(x, r, experts[0]!, E, false);
    const idp = reference(x, r, experts[0]!, E, false, undefined, "integer-dot");
    for (const fusedTokens of [S, 0]) {
      using h = new MoeHarness({ shape, experts: E, topK: k, layers: 1, weights: (_l, e) => experts[0]![e]!, addressing: "bda", budgetMB: 64, fusedTokens }, validationEnv({ VKMOE_IDP: "on" }));
      expect(h.moe.mode, h.moe.why).toBe("gpu");
      expect(h.moe.gemvPath).toBe("integer-dot");
      expect(fusedIdpSharedBytes(shape.hidden, FUSED_KERNEL)).toBeGreaterThan(h.moe.context!.device.info.limits.maxComputeSharedMemorySize);
      const y = new Float32Array(S * shape.hidden);
      h.moe.forward(0, x, r, y);
      expect(h.moe.stats().fusedCalls).toBe(fusedTokens ? 1 : 0);
      const [want, other] = fusedTokens ? [float, idp] : [idp, float];
      expect(nmse(want, y)).toBeLessThanOrEqual(NMSE_BOUND);
      expect(nmse(other, y)).toBeGreaterThan(1e-6);
      h.finish();
    }
  });
});

describe("negative control: the NMSE gate rejects a result that is slightly wrong", () => {
  test("a reference with one router weight 0.2% off fails the pooled bound; one expert dropped fails the per-case bound", () => {
    const E = 16, S = 7, k = 8, D = MAIN.hidden;
    using h = new MoeHarness({ shape: MAIN, experts: E, topK: k, layers: 1, shared: true, weights: (_l, e) => firstE(E)[0]![e]!, addressing: "bda", budgetMB: 64 });
    const rnd = mulberry32(77);
    const r = randomRouting(rnd, S, k, E);
    r.weights[3] = 0.5; // a weight that matters
    const x = randomGaussianF32(S * D, 78);
    const y = new Float32Array(S * D);
    h.moe.forward(0, x, r, y);
    expect(h.moe.mode).toBe("gpu");
    const experts = firstE(E)[0]!;

    const exact = new PooledError();
    exact.add(reference(x, r, experts, E, true), y, CASE_BOUND, "exact");
    expect(exact.nmse).toBeLessThanOrEqual(NMSE_BOUND);

    const off = { ...r, weights: r.weights.slice() };
    off.weights[3] = Math.fround(0.5 * 1.002);
    const perturbed = new PooledError();
    perturbed.add(reference(x, off, experts, E, true), y, CASE_BOUND, "one weight 0.2% off"); // within the loose case bound...
    expect(perturbed.nmse).toBeGreaterThan(NMSE_BOUND); // ...but the gate of the test fails

    const dropped = { ...r, weights: r.weights.slice() };
    dropped.weights[3] = 0;
    expect(() => new PooledError().add(reference(x, dropped, experts, E, true), y, CASE_BOUND, "one pair dropped")).toThrow(/above the per-case bound/);
    h.finish();
  });
});

describe("integer-dot path (VKMOE_IDP=on): quantize_act + integer-dot gate+up, float down", () => {
  // Checked against the CPU emulation of the integer-dot path (same int8 activations, exact
  // integer dot products): pooled NMSE ≤ 1e-8; and against the float reference within the bound
  // the kernels issue set for the integer-dot GEMV (≤ 1e-3), which is the quantization of x.
  const E = 32;
  const cases: [number, number][] = [[1, 8], [2, 16], [7, 1], [64, 8]];
  const configs: { label: string; shape: ExpertShape; experts: ReturnType<typeof makeExperts>; limit?: number }[] = [
    { label: "q4/g32/f16", shape: MAIN, experts: firstE(E) },
    { label: "q8/g128/f16 D=256 I=98 limit 0.75", shape: { format: "q8", groupSize: 128, scaleType: "f16", hidden: 256, intermediate: 98 }, experts: makeExperts({ format: "q8", groupSize: 128, scaleType: "f16", hidden: 256, intermediate: 98 }, E, 1, 31), limit: 0.75 },
    { label: "q4/g64/f32 D=192 I=40", shape: { format: "q4", groupSize: 64, scaleType: "f32", hidden: 192, intermediate: 40 }, experts: makeExperts({ format: "q4", groupSize: 64, scaleType: "f32", hidden: 192, intermediate: 40 }, E, 1, 32) },
  ];
  configs.forEach(({ label, shape, experts, limit }, c) => {
    ADDRESSING.forEach((addressing, a) => {
      const shared = (a + c) % 2 === 1;
      test(`${label}, ${addressing}, ${shared ? "with" : "without"} a shared expert`, () => {
        const t0 = performance.now();
        const pooled = new PooledError();
        const vsFloat = new PooledError();
        const r = runSweep({ label, shape, E, experts, addressing, cases, limit, shared, seed: 8100 + 10 * c + a, path: "integer-dot", vsFloat }, pooled);
        expect(r.mode, r.why).toBe("gpu");
        expect(r.why).toContain("integer-dot path");
        expect(r.stats.gpuPairs).toBe(r.pairs);
        console.log(`  idp ${label} ${addressing}: ${pooled.cases} cases, NMSE vs emulation ${pooled.nmse.toExponential(2)}, vs float ${vsFloat.nmse.toExponential(2)}, ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
        expect(vsFloat.nmse).toBeLessThanOrEqual(1e-3);
        // The two references differ by far more than the bound: the test tells the paths apart.
        expect(vsFloat.nmse).toBeGreaterThan(100 * NMSE_BOUND);
      });
    });
  });
  for (const E of [8, 256]) {
    const addressing = E === 8 ? "descriptor" : "bda";
    test(`q4/g32/f16, E=${E}, ${addressing}, every S × k ≤ E, with a shared expert`, () => {
      const pooled = new PooledError();
      const cases = [1, 2, 7, 64].flatMap((S) => [1, 8, 16].filter((k) => k <= E).map((k) => [S, k] as [number, number]));
      const r = runSweep({ label: "q4/g32/f16", shape: MAIN, E, experts: firstE(E), addressing, cases, shared: true, seed: 8200 + E, path: "integer-dot" }, pooled);
      expect(r.why).toContain("integer-dot path");
      expect(r.stats.gpuPairs).toBe(r.pairs);
      console.log(`  idp q4/g32/f16 E=${E} ${addressing}: ${pooled.cases} cases, NMSE vs emulation ${pooled.nmse.toExponential(2)}`);
      expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    });
  }
});
