/**
 * A Qwen3.5 MoE (qwen35moe) Q4_K_M file with its routed experts on the GPU as the file holds them
 * (src/moe/ggml-backend.ts): make-model's random qwen3.5-tiny, 4 layers, Q4_K gate/up experts with a
 * Q4_K down in layers 0-1 and Q6_K in layers 2-3 (llama-quantize's Q4_K_M mix), K-quant shared
 * experts (dense matrices, run by the dense path), vocab 1024. Made at test time (3 s).
 *
 * Against the CPU decoder on the same file: per-layer mode (Lavapipe: the graph is not tried on a CPU
 * device) with the same f32 KV cache, NMSE <= 1e-9 at every step; resident mode (VKMOE_GRAPH=on: the
 * hybrid graph, GgmlGraphStage), against the CPU decoder with an f16 KV cache, the graph's bound 1e-6;
 * greedy ids equal wherever the CPU's top-1 margin is >= 0.01. Validation layer on.
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

const VOCAB = 1024;
const env = (o: Partial<VkmoeEnv>): VkmoeEnv => ({ ...readConfig(), ...o });
const tmp = mkdtempSync(join(tmpdir(), "vkmoe-kquant35-"));
const path = join(tmp, "qwen3.5-tiny.Q4_K_M.gguf");
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
beforeAll(async () => {
  const shape = { ...shapeByName("qwen3.5-tiny")!, vocab: VOCAB };
  await writeRandomModel({ shape, fileType: "q4_k_m", path, seed: 3, tokenizer: truncateBpeTokenizer(qwen3TokenizerFiles(), VOCAB) });
}, 60_000);

const PROMPTS = [[785, 11, 879, 0, 409], Array.from({ length: 19 }, (_, i) => (37 * i + 11) % VOCAB)];

/** Prefill and 8 greedy steps: the worst NMSE of `gpu`'s logits against `cpu`'s (support/logits.ts). */
const compare = (gpu: Model, cpu: Model, cache: "f32" | "f16", bound: number, margin = 0.01) => compareWithCpu(gpu, cpu, PROMPTS, { cache, bound, margin });

describe("Qwen3.5 MoE Q4_K_M: the routed experts on the GPU as the file holds them", () => {
  test("per-layer mode: every step's logits NMSE <= 1e-9 of the CPU decoder's, greedy ids equal", async () => {
    const lines: string[] = [];
    using gpu = await Model.load(path, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "auto" }), log: (l) => lines.push(l) });
    using cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
    expect(gpu.device.mode, gpu.device.why).toBe("per-layer");
    expect(gpu.device.experts).toBe("gpu");
    expect(gpu.device.why).toMatch(/Q4_K\/Q6_K experts resident as the file holds them \([\d.]+ MiB; Q4_K\/Q4_K, Q4_K\/Q6_K\)/);
    expect(lines.filter((l) => l.includes("run on the CPU"))).toEqual([]);
    const worst = compare(gpu, cpu, "f32", 1e-9);
    expect(gpu.takeValidationMessages()).toEqual([]);
    console.log(`qwen35 Q4_K_M per-layer: worst NMSE ${worst.toExponential(2)}`);
  }, 90_000);

  test("resident mode (VKMOE_GRAPH=on): the hybrid graph, logits NMSE <= 1e-6 of the CPU decoder's (f16 KV cache), greedy ids equal", async () => {
    using gpu = await Model.load(path, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "off" }), log: () => {} });
    using cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
    expect(gpu.device.mode, gpu.device.why).toBe("resident");
    expect(gpu.device.experts).toBe("gpu");
    expect(gpu.device.why).toContain("shared expert");
    const worst = compare(gpu, cpu, "f16", 1e-6);
    expect(gpu.takeValidationMessages()).toEqual([]);
    console.log(`qwen35 Q4_K_M resident: worst NMSE ${worst.toExponential(2)}`);
  }, 90_000);

  // The integer-dot path: the dense GGML matrices read an 8-bit x; those after a norm (qkv, z, the
  // shared expert's gate and up, lm_head) its quantized rows (NormFeed)
  // synchronization validation: the delta rule writes out_proj's quantized rows; the shared down quantizes its input beside the experts' first step and runs beside their last
  test("resident mode on the integer-dot path (VKMOE_IDP=on): logits NMSE <= 5e-3 of the CPU decoder's, greedy ids equal where the margin is >= 0.5; out_proj and the shared down with no quantize step of their own (43 barriers a decode token, 50 when each had one)", async () => {
    // the graph's matrices take the integer-dot decision from the process env (device-linear.ts)
    using restore = processEnv("VKMOE_IDP", "on");
    using gpu = await Model.load(path, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "on" }), syncValidation: true, log: () => {} });
    const { barriers } = decodeTokenCommands(gpu);
    console.log(`qwen35 Q4_K_M resident, integer-dot: ${barriers} barriers a decode token`);
    expect(barriers).toBe(43);
    using cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
    expect(gpu.device.mode, gpu.device.why).toBe("resident");
    const worst = compare(gpu, cpu, "f16", 5e-3, 0.5);
    expect(worst).toBeGreaterThan(1e-7); // it did take the 8-bit path
    expect(gpu.takeValidationMessages()).toEqual([]);
    console.log(`qwen35 Q4_K_M resident, integer-dot: worst NMSE ${worst.toExponential(2)}`);
  }, 90_000);
});
