/**
 * Longer prompt chunks in the graphs (VKMOE_PREFILL_CHUNK): a replay of up to 128 tokens, its
 * attention run 64 queries at a time over keys the chunk's RoPE step has all written, the Qwen3.5
 * graph's delta rule in its two passes (prepare, state: DeltaRuleSplitKernel; and, in a fourth run,
 * 64 tokens a dispatch carrying its state, VKMOE_DELTA_SPLIT=off), the experts regrouped over all of
 * them. make-model random tiny files of both expert stages (Q4_K_M: the GGML experts; Q4_0: the q4
 * pool's) and a random qwen3.5-tiny Q4_0 file (3 linear layers, 1 full), a 150-token prompt (a 128-token chunk, then 22) and 4
 * greedy steps, against the CPU decoder on the same file (f16 KV cache): every step's logits
 * within NMSE 1e-6 (the float path: VKMOE_IDP=off), greedy ids equal where the CPU's margin is
 * >= 0.01; and against the same file at 64-token chunks; a third run at 128 with the chunks'
 * attention on dec_attention_cm's emulation (VKMOE_ATTENTION_COOPMAT=emulated) within the same
 * bound (negative control by hand, 2026-12-07: its causal mask one key wider failed the Q4_K_M file).
 * Validation layer on.
 * The prefill plan (src/moe/prefill-plan.ts) on this device: "auto" takes 512-token chunks and the
 * matrix-core experts from CM_EXPERTS_MIN_TOKENS tokens only where the device has cooperative
 * matrices that pass the self-check, else 64-token chunks; explicit chunks are taken as given; the
 * attention kernel for chunks of more than 64 tokens under auto, more than 4 with on or emulated.
 * Negative controls (by hand, Lavapipe, 2026-12-07): every attention sub-chunk seeing the first's
 * positions (n = 1) failed both Qwen3 files; the delta rule's later sub-chunks reading the first's
 * decay inputs (a not offset) failed the Qwen3.5 file; the plan's "auto" taking 512-token chunks
 * without the matrix cores, and a wrong slot tile for 128-token chunks, each failed the plan's test.
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
import { nmse } from "../src/quant/metrics.ts";
import { attentionOnMatrixCores, CM_EXPERTS_MIN_TOKENS, cmSlotsFor, prefillPlan } from "../src/moe/prefill-plan.ts";
import { processEnv } from "./support/graph-switches.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { top } from "./support/logits.ts";

const VOCAB = 1024;
const BOUND = 1e-6;
/** The Qwen3.5 file's 128-token chunks against its 64-token ones (float path, the same sums in another order). */
const SPLIT_BOUND = 1e-9;
const env = (o: Partial<VkmoeEnv>): VkmoeEnv => ({ ...readConfig(), ...o });
const tmp = mkdtempSync(join(tmpdir(), "vkmoe-chunk-"));
const files = { q4_k_m: join(tmp, "tiny.Q4_K_M.gguf"), q4_0: join(tmp, "tiny.Q4_0.gguf"), "qwen3.5 q4_0": join(tmp, "qwen3.5-tiny.Q4_0.gguf") };
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
beforeAll(async () => {
  const tokenizer = truncateBpeTokenizer(qwen3TokenizerFiles(), VOCAB);
  for (const [what, path] of Object.entries(files)) {
    const shape = { ...shapeByName(what.startsWith("qwen3.5") ? "qwen3.5-tiny" : "tiny")!, vocab: VOCAB };
    await writeRandomModel({ shape, fileType: what.endsWith("q4_k_m") ? "q4_k_m" : "q4_0", path, seed: 9, tokenizer });
  }
}, 120_000);

const PROMPT = Array.from({ length: 150 }, (_, i) => (53 * i + 7) % VOCAB);

/** The prompt's logits and 4 greedy steps' (the CPU's ids fed to both), each within BOUND of the CPU's. */
function steps(gpu: Model, cpu: Model, label: string): Float32Array[] {
  using a = gpu.session({ ctx: 256 });
  using b = cpu.session({ ctx: 256, cpuCache: "f16" });
  let x = a.prefill(PROMPT).slice(), y = b.prefill(PROMPT).slice();
  const out: Float32Array[] = [];
  let worst = 0;
  for (let step = 0; ; step++) {
    out.push(x);
    const e = nmse(y, x);
    worst = Math.max(worst, e);
    expect({ label, step, e: e <= BOUND }).toEqual({ label, step, e: true });
    const want = top(y);
    if (want.margin >= 0.01) expect({ label, step, id: top(x).id }).toEqual({ label, step, id: want.id });
    if (step === 4) break;
    x = a.step(want.id).slice();
    y = b.step(want.id).slice();
  }
  console.log(`  ${label}: worst NMSE ${worst.toExponential(2)} over the prompt and 4 steps`);
  return out;
}

describe("prompt chunks of 128 tokens in the graphs (VKMOE_PREFILL_CHUNK=128)", () => {
  for (const [type, path] of Object.entries(files)) {
    test(`${type}: a 150-token prompt in chunks of 128 within NMSE ${BOUND} of the CPU decoder, as at 64`, async () => {
      using cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
      const runs: Float32Array[][] = [];
      // the third run: dec_attention_cm's emulation for the chunks' attention (its tiles, masks and
      // softmax in the graph; on the matrix cores where the device has them, in the other runs)
      // the Qwen3.5 file's fourth: the delta rule 64 tokens a dispatch (VKMOE_DELTA_SPLIT=off), not the two passes
      const variants: (readonly ["128" | "64", "off" | "emulated", "auto" | "off"])[] = [["128", "off", "auto"], ["64", "off", "auto"], ["128", "emulated", "auto"]];
      if (type.startsWith("qwen3.5")) variants.push(["128", "off", "off"]);
      for (const [chunk, attention, deltaSplit] of variants) {
        using restoreChunk = processEnv("VKMOE_PREFILL_CHUNK", chunk); // the graph reads these from the process env when it is made
        using restoreAttention = processEnv("VKMOE_ATTENTION_COOPMAT", attention);
        using restoreSplit = processEnv("VKMOE_DELTA_SPLIT", deltaSplit);
        using gpu = await Model.load(path, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "off", VKMOE_PREFILL_CHUNK: chunk }), log: () => {} });
        expect(gpu.device.mode, gpu.device.why).toBe("resident");
        {
          using probe = gpu.session({ ctx: 256 });
          probe.prefill(PROMPT);
          expect(probe.counts.submits).toBe(chunk === "128" ? 2 : 3);
        }
        runs.push(steps(gpu, cpu, `${type}, chunks of ${chunk}${attention === "emulated" ? ", dec_attention_cm emulated" : ""}${deltaSplit === "off" ? ", the delta rule 64 tokens a dispatch" : ""}`));
        expect(gpu.takeValidationMessages()).toEqual([]);
      }
      // the same sums either way but the experts' (regrouped over other tokens): near, not equal
      runs[0]!.forEach((x, i) => expect(nmse(runs[1]![i]!, x)).toBeLessThanOrEqual(BOUND));
      if (type.startsWith("qwen3.5")) {
        // the delta rule's two passes and its 64-token dispatches against the 64-token chunks, tighter: the
        // random tiny layers' later chunks weigh little in the logits (a state pass that forgot the state's
        // part of the second chunk's deltas measured 7.6e-8 here, inside BOUND)
        for (const run of [runs[0]!, runs[3]!]) run.forEach((x, i) => expect(nmse(runs[1]![i]!, x)).toBeLessThanOrEqual(SPLIT_BOUND));
      }
    }, 300_000);
  }
});

test("the prefill plan: 512-token chunks and the matrix-core experts only where the matrix cores pass, else 64; explicit chunks as given; where the attention kernel runs", () => {
  const ctx = openTestContext();
  try {
    const device = ctx.device;
    const cm = device.enabled.cooperativeMatrix; // and the self-check: it passes wherever it is enabled in this suite
    const auto = prefillPlan(device, readConfig({}));
    expect(auto).toEqual(cm ? { chunk: 512, expertsOnMatrixCoresFrom: CM_EXPERTS_MIN_TOKENS } : { chunk: 64, expertsOnMatrixCoresFrom: undefined });
    expect(prefillPlan(device, readConfig({ VKMOE_PREFILL_CHUNK: "128" }))).toEqual({ chunk: 128, expertsOnMatrixCoresFrom: cm ? CM_EXPERTS_MIN_TOKENS : undefined });
    expect(prefillPlan(device, readConfig({ VKMOE_MOE_COOPMAT: "off" }))).toEqual({ chunk: 64, expertsOnMatrixCoresFrom: undefined });
    expect(prefillPlan(device, readConfig({ VKMOE_MOE_COOPMAT: "on", VKMOE_PREFILL_CHUNK: "256" }))).toEqual({ chunk: 256, expertsOnMatrixCoresFrom: cm ? 1 : undefined });
    // the attention's matrix-core kernel: chunks of more than 64 tokens under auto, of more than 4 with on, never with off
    expect(attentionOnMatrixCores(device, readConfig({}))).toEqual(cm ? { variant: true, fromTokens: 65 } : undefined);
    expect(attentionOnMatrixCores(device, readConfig({ VKMOE_ATTENTION_COOPMAT: "on" }))).toEqual(cm ? { variant: true, fromTokens: 5 } : undefined);
    expect(attentionOnMatrixCores(device, readConfig({ VKMOE_ATTENTION_COOPMAT: "off" }))).toBeUndefined();
    expect(attentionOnMatrixCores(device, readConfig({ VKMOE_ATTENTION_COOPMAT: "emulated" }))).toEqual({ variant: "emulated", fromTokens: 5 });
    // a graph of 64-token chunks never takes it under auto
    expect(attentionOnMatrixCores(device, readConfig({ VKMOE_ATTENTION_COOPMAT: "emulated" }), 64)).toEqual({ variant: "emulated", fromTokens: 5 });
    expect(attentionOnMatrixCores(device, readConfig({}), 64)).toBeUndefined();
    expect(attentionOnMatrixCores(device, readConfig({ VKMOE_ATTENTION_COOPMAT: "emulated" }), 4)).toBeUndefined(); // chunks of at most 4 tokens never take it
    // the matrix-core experts' slots a tile, by the chunk
    expect([64, 128, 256, 512].map(cmSlotsFor)).toEqual([8, 16, 32, 32]);
    console.log(`  ${device.info.name}: cooperative matrices ${cm ? "on" : "off"}; auto plan ${JSON.stringify(auto)}`);
  } finally {
    finish(ctx);
  }
});
