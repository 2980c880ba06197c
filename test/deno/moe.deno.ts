/**
 * Test 1, smaller, under Deno: the MoE layer against the f64 reference on both addressing paths,
 * with and without a shared expert (pooled NMSE ≤ 1e-8, ≤ 1e-6 per case, every pair on the GPU,
 * no validation message), and the integer-dot path against its emulation. Same helpers as the Bun
 * suite (test/cases/moe.ts).
 */
import { NMSE_BOUND, PooledError, makeExperts, runSweep } from "../cases/moe.ts";
import type { ExpertShape } from "../../src/pool/expert-layout.ts";

declare const Deno: any;

function assert(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

const SHAPE: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 64, intermediate: 32 };
const Q8: ExpertShape = { format: "q8", groupSize: 64, scaleType: "f32", hidden: 128, intermediate: 100 };
const experts = makeExperts(SHAPE, 128, 1, 11);
const q8Experts = makeExperts(Q8, 16, 1, 12);
const firstE = (E: number) => [[...experts[0]!.slice(0, E), experts[0]![128]!]];

for (const addressing of ["bda", "descriptor"] as const) {
  Deno.test(`MoE layer under Deno, ${addressing}: S × k × E vs the f64 reference, ± shared`, () => {
    const pooled = new PooledError();
    const runs = [
      { label: "q4/g32/f16", shape: SHAPE, E: 8, experts: firstE(8), cases: [[1, 1], [2, 8], [7, 8], [64, 1]] as [number, number][] },
      { label: "q4/g32/f16", shape: SHAPE, E: 128, experts: firstE(128), cases: [[1, 16], [7, 8], [64, 16]] as [number, number][] },
      { label: "q8/g64/f32 I=100", shape: Q8, E: 16, experts: q8Experts, cases: [[1, 1], [7, 8], [64, 2]] as [number, number][] },
    ];
    let n = 0;
    for (const run of runs) for (const shared of [false, true]) {
      const r = runSweep({ ...run, shared, addressing, seed: 300 + n++ }, pooled);
      const label = `${run.label} E=${run.E}${shared ? " +shared" : ""}`;
      assert(r.mode === "gpu", `${label}: not on the GPU (${r.why})`);
      assert(r.why.includes(`${addressing} addressing`), `${label}: ${r.why}`);
      assert(r.stats.gpuPairs === r.pairs && r.stats.cpuPairs === 0, `${label}: ${r.stats.gpuPairs} GPU / ${r.stats.cpuPairs} CPU pairs, expected ${r.pairs} on the GPU`);
      assert(r.logs.length === 0, `${label}: ${r.logs.join("; ")}`);
    }
    assert(pooled.nmse <= NMSE_BOUND, `pooled NMSE ${pooled.nmse} > ${NMSE_BOUND} (worst case ${pooled.worst}: ${pooled.worstLabel})`);
    console.log(`  ${addressing}: ${pooled.cases} cases, pooled NMSE ${pooled.nmse.toExponential(2)}`);
  });
}

Deno.test("MoE layer under Deno, integer-dot path (VKMOE_IDP=on): vs the integer-dot emulation, and within 1e-3 of float", () => {
  const pooled = new PooledError();
  const vsFloat = new PooledError();
  let n = 0;
  for (const addressing of ["bda", "descriptor"] as const) {
    const r = runSweep({ label: "q4/g32/f16 idp", shape: SHAPE, E: 128, experts: firstE(128), cases: [[1, 8], [7, 16], [64, 8]], shared: n === 1, addressing, seed: 400 + n++, path: "integer-dot", vsFloat }, pooled);
    assert(r.mode === "gpu" && r.why.includes("integer-dot path"), `${addressing}: ${r.why}`);
    assert(r.stats.gpuPairs === r.pairs, `${addressing}: ${r.stats.gpuPairs} GPU pairs, expected ${r.pairs}`);
  }
  assert(pooled.nmse <= NMSE_BOUND, `NMSE vs emulation ${pooled.nmse} > ${NMSE_BOUND}`);
  assert(vsFloat.nmse <= 1e-3 && vsFloat.nmse > 100 * NMSE_BOUND, `NMSE vs float ${vsFloat.nmse}: expected in (1e-6, 1e-3]`);
  console.log(`  integer-dot: ${pooled.cases} cases, NMSE vs emulation ${pooled.nmse.toExponential(2)}, vs float ${vsFloat.nmse.toExponential(2)}`);
});
