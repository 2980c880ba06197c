/**
 * The Qwen3.5 graph's folds on a file whose norms are not all ones. The fixtures' norm weights are
 * zeros in the Hub checkpoint (so 1 + w = 1 everywhere in the GGUF): a fold reading the wrong norm
 * vector gives the same bits there. make-model's random qwen3.5-tiny draws every norm near 1
 * (std 0.1), so here a wrong vector, a missing residual or a fold reading rows before they are
 * written moves the logits. A Q4_0 file: a float router, q4 shared gate/up of one shape, a shared
 * expert of the routed experts' shape, so every decode fold applies (the shared expert in the fused
 * experts' call with the post norm and the route in the router, or the route beside the shared
 * expert's fused gate/up; the conv in the delta rule, the RoPE in the attention).
 *
 * Each fold setting against the CPU decoder on the same file (f16 KV cache): every step's logits
 * NMSE <= 1e-6, greedy ids equal where the CPU's margin is >= 0.01. Validation layer on.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { truncateBpeTokenizer } from "../src/formats/bpe-truncate.ts";
import { Model } from "../src/model/model.ts";
import { qwen3TokenizerFiles, writeRandomModel } from "../src/model/random-gguf.ts";
import { shapeByName } from "../src/model/shapes.ts";
import { decodeTokenCommands, processEnv } from "./support/graph-switches.ts";
import { compareWithCpu } from "./support/logits.ts";
import { nmse } from "../src/quant/metrics.ts";

const VOCAB = 1024;
const BOUND = 1e-6;
const env = (o: Partial<VkmoeEnv>): VkmoeEnv => ({ ...readConfig(), ...o });
const tmp = mkdtempSync(join(tmpdir(), "vkmoe-q4-35-"));
const path = join(tmp, "qwen3.5-tiny.Q4_0.gguf");
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
beforeAll(async () => {
  const shape = { ...shapeByName("qwen3.5-tiny")!, vocab: VOCAB };
  await writeRandomModel({ shape, fileType: "q4_0", path, seed: 5, tokenizer: truncateBpeTokenizer(qwen3TokenizerFiles(), VOCAB) });
}, 60_000);

const PROMPTS = [[785, 11, 879, 0, 409], Array.from({ length: 19 }, (_, i) => (37 * i + 11) % VOCAB)];

describe("the Qwen3.5 graph's decode folds on a Q4_0 file with random norms", () => {
  // float atomics off: the grouped experts' kernels (no shared slot), so auto is off and route folds beside the shared expert's GEMVs
  test(`VKMOE_ROUTE_FOLD route (the route and SwiGLU folded), auto and off: each within NMSE ${BOUND} of the CPU decoder at every step, route one barrier a layer fewer`, async () => {
    using cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
    const barriers: Record<string, number> = {};
    for (const fold of ["auto", "route", "off"] as const) {
      using restore = processEnv("VKMOE_ROUTE_FOLD", fold); // the graph reads it from the process env when it is made
      using gpu = await Model.load(path, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "off", VKMOE_ROUTE_FOLD: fold, VKMOE_FLOAT_ATOMICS: "off" }), log: () => {} });
      expect(gpu.device.mode, gpu.device.why).toBe("resident");
      barriers[fold] = decodeTokenCommands(gpu).barriers;
      const worst = compareWithCpu(gpu, cpu, PROMPTS, { cache: "f16", bound: BOUND });
      expect(gpu.takeValidationMessages()).toEqual([]);
      console.log(`qwen3.5 Q4_0 random norms, VKMOE_ROUTE_FOLD=${fold}: ${barriers[fold]} barriers a decode token, worst NMSE ${worst.toExponential(2)}`);
    }
    expect(barriers.off! - barriers.route!).toBe(cpu.config.layers);
    expect(barriers.auto).toBe(barriers.off);
  }, 180_000);
});

describe("the shared expert as one more slot of the fused experts' call (VKMOE_SHARED_SLOT)", () => {
  // float atomics on: the fused call (one dispatch) is what takes the shared expert; its sums land in any order
  test(`auto: the shared expert inside the experts' call, the post norm and the route in the router: two barriers and seven dispatches a layer fewer than off; with that step warmed beside the mixer (VKMOE_ROUTER_WARM, the default) one dispatch a layer more and no barrier, and so with the next norm warmed beside it (VKMOE_NORM_WARM, the default, where the experts are one step); each within NMSE ${BOUND} of the CPU decoder at every step, a batch's decode rounds too; synchronization validation clean`, async () => {
    using cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
    const counts: Record<string, { dispatches: number; barriers: number }> = {};
    // the fused call's sums land in any order: each run against the CPU, not against each other bit for bit
    for (const [key, slot, warm, normWarm] of [["auto", "auto", "on", "on"], ["auto, no warm", "auto", "off", "on"], ["auto, no norm warm", "auto", "on", "off"], ["off", "off", "on", "on"]] as const) {
      using restore = processEnv("VKMOE_SHARED_SLOT", slot); // read from the process env when the graph is made
      using restoreWarm = processEnv("VKMOE_ROUTER_WARM", warm);
      using restoreNormWarm = processEnv("VKMOE_NORM_WARM", normWarm);
      using gpu = await Model.load(path, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "off", VKMOE_SHARED_SLOT: slot, VKMOE_ROUTER_WARM: warm, VKMOE_NORM_WARM: normWarm }), syncValidation: true, log: () => {} });
      expect(gpu.device.mode, gpu.device.why).toBe("resident");
      expect(gpu.device.why).toContain(slot === "auto" ? "fused MoE call (decode: the shared expert in it)" : "fused MoE call;");
      counts[key] = decodeTokenCommands(gpu);
      let worst = compareWithCpu(gpu, cpu, PROMPTS, { cache: "f16", bound: BOUND });
      // a batch's decode rounds (3 sequences a replay: S = 3 fused calls) against each sequence's own CPU session
      {
        using batch = gpu.batch({ slots: 3, ctx: 64 });
        expect(batch.path).toBe("device-batch");
        const own = [0, 1, 2].map(() => cpu.session({ ctx: 64, cpuCache: "f16" }));
        const starts = [PROMPTS[0]!, PROMPTS[1]!.slice(0, 7), PROMPTS[1]!.slice(5, 9)];
        const first = batch.prefillMany(starts.map((ids, slot) => ({ slot, ids }))).map((x) => x.slice());
        first.forEach((x, i) => (worst = Math.max(worst, nmse(own[i]!.prefill(starts[i]!), x))));
        for (let r = 0; r < 4; r++) {
          const ids = [11 + r, 300 + r, 700 + 5 * r];
          const got = batch.step(ids.map((id, slot) => ({ slot, id }))).map((x) => x.slice());
          got.forEach((x, i) => (worst = Math.max(worst, nmse(own[i]!.step(ids[i]!), x))));
        }
        for (const o of own) o[Symbol.dispose]();
      }
      expect(worst).toBeLessThanOrEqual(BOUND);
      expect(gpu.takeValidationMessages()).toEqual([]);
      console.log(`qwen3.5 Q4_0 random norms, VKMOE_SHARED_SLOT=${slot} VKMOE_ROUTER_WARM=${warm} VKMOE_NORM_WARM=${normWarm}: ${counts[key]!.barriers} barriers and ${counts[key]!.dispatches} dispatches a decode token, worst NMSE ${worst.toExponential(2)}`);
    }
    const layers = cpu.config.layers;
    // off: post norm | router, shared gate, up, scale | route, SwiGLU | experts + shared down; auto: post norm + router + route | experts
    const cold = counts["auto, no warm"]!;
    expect(counts.off!.barriers - cold.barriers).toBe(2 * layers);
    expect(counts.off!.dispatches - cold.dispatches).toBe(7 * layers);
    // the warm: where the step folds the norm in (auto's decode tokens), one dispatch beside the mixer; off has no such step
    expect(counts.auto!.barriers).toBe(cold.barriers);
    expect(counts.auto!.dispatches - cold.dispatches).toBe(layers);
    // the next norm's warm: one dispatch a layer beside the router's step (the experts' call is one step), no barrier
    expect(counts.auto!.barriers).toBe(counts["auto, no norm warm"]!.barriers);
    expect(counts.auto!.dispatches - counts["auto, no norm warm"]!.dispatches).toBe(layers);
  }, 180_000);
});
