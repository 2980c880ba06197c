// Sweep of the grouped MoE kernels' workgroup shape on this device: host µs per layer call (S=1
// and S=16, Qwen3-30B-A3B shape, experts rotated over layers). The chosen shape goes in
// src/kernels/tuning.ts; this script is how it was chosen.
//   bun scripts/tune-moe.ts [--layers N]
import { readConfig } from "../src/config.ts";
import { MoeBackend } from "../src/moe/backend.ts";
import { preloadExperts } from "./lib/moe-setup.ts";
import { expertShapeOf, QWEN3_30B_A3B, randomActivations, randomExpert, RoutingGenerator } from "./lib/synthetic.ts";

const args = (globalThis as any).Deno ? (globalThis as any).Deno.args : process.argv.slice(2);
const layers = args.includes("--layers") ? Number(args[args.indexOf("--layers") + 1]) : 16;
const model = QWEN3_30B_A3B;
const shape = expertShapeOf(model);
const host = Array.from({ length: model.experts }, (_, e) => randomExpert(shape, e + 1));
const configs = args.includes("--fine") ? [
  { workgroupSize: 32, rowsPerWorkgroup: 2, colThreads: 0, rowLanes: 1 },
  { workgroupSize: 32, rowsPerWorkgroup: 1, colThreads: 0, rowLanes: 1 },
  { workgroupSize: 64, rowsPerWorkgroup: 2, colThreads: 0, rowLanes: 1 },
  { workgroupSize: 64, rowsPerWorkgroup: 1, colThreads: 0, rowLanes: 1 },
] : [
  { workgroupSize: 32, rowsPerWorkgroup: 8, colThreads: 0, rowLanes: 1 },
  { workgroupSize: 32, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1 },
  { workgroupSize: 32, rowsPerWorkgroup: 2, colThreads: 0, rowLanes: 1 },
  { workgroupSize: 64, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1 },
  { workgroupSize: 64, rowsPerWorkgroup: 2, colThreads: 32, rowLanes: 2 },
  { workgroupSize: 128, rowsPerWorkgroup: 4, colThreads: 32, rowLanes: 4 },
  { workgroupSize: 128, rowsPerWorkgroup: 8, colThreads: 32, rowLanes: 4 },
  { workgroupSize: 256, rowsPerWorkgroup: 8, colThreads: 32, rowLanes: 8 },
];
const env = readConfig();
const rows: string[] = [];
for (const kernel of configs) {
  using moe = MoeBackend.open({ shape, experts: model.experts, topK: model.topK, layers, weights: (_l, e) => host[e]!, kernel, tickets: 1, log: () => {} }, env);
  preloadExperts(moe, layers, model.experts, (_l, e) => host[e]!);
  const gen = new RoutingGenerator(model, 7);
  const result: string[] = [];
  for (const S of [1, 16]) {
    const x = randomActivations(S, shape.hidden, 3);
    const y = new Float32Array(S * shape.hidden);
    const samples: number[] = [];
    for (let i = 0; i < 20 * layers; i++) {
      const r = gen.next(S);
      const t0 = performance.now();
      moe.forward(i % layers, x, r, y);
      if (i >= layers) samples.push((performance.now() - t0) * 1000);
    }
    samples.sort((a, b) => a - b);
    result.push(`S=${S} ${samples[samples.length >> 1]!.toFixed(0)} µs`);
  }
  rows.push(`| WG ${kernel.workgroupSize}, rows ${kernel.rowsPerWorkgroup}, colThreads ${kernel.colThreads}, rowLanes ${kernel.rowLanes} | ${result.join(" | ")} |`);
  console.log(rows.at(-1));
}
