/** The miss policy: "cpu" runs non-resident experts on the CPU (no upload); "upload" makes them resident. */
import { expect, test } from "bun:test";
import { validationEnv } from "./cases/moe.ts";
import { MoeBackend } from "../src/moe/backend.ts";
import { moeReference, type ExpertWeights } from "../src/moe/reference.ts";
import { nmse, quantize, randomGaussianF32 } from "../src/quant/index.ts";

const [D, I, E, k, S] = [64, 32, 6, 2, 2];
const shape = { format: "q8", groupSize: 32, scaleType: "f32", hidden: D, intermediate: I } as const;
const experts: ExpertWeights[] = Array.from({ length: E }, (_, e) => {
  const q = (r: number, c: number, s: number) => quantize({ dtype: "f32", data: randomGaussianF32(r * c, s, 0.1) }, r, c, shape);
  return { gate: q(I, D, 3 * e + 1), up: q(I, D, 3 * e + 2), down: q(D, I, 3 * e + 3) };
});
const routing = { S, k, ids: Int32Array.from([0, 1, 2, 3]), weights: Float32Array.from([0.6, 0.4, 0.3, 0.7]) };
const x = randomGaussianF32(S * D, 5);
const reference = moeReference(x, routing, (e) => experts[e]!);

for (const onMiss of ["cpu", "upload"] as const) {
  test(`onMiss=${onMiss}: right answers; ${onMiss === "cpu" ? "nothing uploaded, every pair on the CPU" : "every expert uploaded, every pair on the GPU"}`, () => {
    const moe = MoeBackend.open({ shape, experts: E, topK: k, layers: 1, weights: (_l, e) => experts[e]!, onMiss, log: () => {} }, validationEnv()); // float path: checked against the f64 reference
    const instance = moe.context!.instance;
    try {
      const y = new Float32Array(S * D);
      moe.forward(0, x, routing, y);
      expect(nmse(reference, y)).toBeLessThanOrEqual(1e-9);
      const s = moe.stats();
      if (onMiss === "cpu") expect([s.gpuPairs, s.cpuPairs, s.cache!.uploads]).toEqual([0, 4, 0]);
      else expect([s.gpuPairs, s.cpuPairs, s.cache!.uploads]).toEqual([4, 0, 4]);
    } finally {
      moe[Symbol.dispose]();
    }
    expect(instance.takeMessages()).toEqual([]);
  });
}
