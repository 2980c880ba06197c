/**
 * The K-quant GGUF files people download, end to end against llama.cpp itself: small random
 * Qwen3-MoE files that llama.cpp's llama-quantize made (Q4_K_M: Q4_K gate/up experts, a Q4_K down in
 * layer 0 and Q6_K in layer 1, Q4_K/Q6_K dense matrices; Q5_K_M: Q5_K gate/up, Q6_K down), with
 * llama.cpp CPU's prompt ids, greedy ids and text (test/fixtures/kquant-model, made by
 * scripts/fixtures/make-kquant-model-fixture.ts; committed, so this always runs).
 *
 * Margins: llama.cpp's CPU backend quantizes activations to Q8_K before every K-quant dot product
 * and keeps an f16 KV cache, so its logits differ from vkmoe's (GGML's exact dequantized weights,
 * f64 sums) a little: on the six logits llama.cpp prints (of the prompt's last position) by up to
 * 0.32 on these files. Each step is run on llama.cpp's own ids (teacher forcing, so one near tie
 * does not end the comparison), and vkmoe's argmax must be llama.cpp's at every step where vkmoe's
 * top-1 margin is >= MARGIN (0.5, above any flip this distance can cause at a normal step: every
 * disagreement seen had a margin <= 0.1); at least MIN_COMPARED of the 32 steps must be compared.
 *
 * Three ways to run each file: the CPU decoder (VKMOE_GPU=0); per-layer mode, the routed experts on
 * the GPU as the file holds them (src/moe/ggml-backend.ts; Lavapipe: the graph is not tried on a CPU
 * device), every step's logits within NMSE 1e-9 of the CPU path's (the same GGML weights, f32 sums
 * against f64); resident mode (VKMOE_GRAPH=on: the whole token in one submit, the experts through
 * GgmlGraphStage), within the graph's bound 1e-6 of the CPU path with an f16 KV cache
 * (test/model-graph.test.ts). And the CPU fallback when the experts do not fit the budget.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { truncateBpeTokenizer } from "../src/formats/bpe-truncate.ts";
import { encodeQ8_0 } from "../src/formats/ggml-quantize.ts";
import { openGguf } from "../src/formats/gguf.ts";
import { GgufWriter, ggmlTensorBytes, type GgmlTypeName } from "../src/formats/gguf-writer.ts";
import { tokenizerMetadata } from "../src/formats/hf-tokenizer-gguf.ts";
import { Model } from "../src/model/model.ts";
import { qwen3MoeMetadata, qwen3MoeTensors } from "../src/model/qwen3moe-gguf-layout.ts";
import { qwen3TokenizerFiles } from "../src/model/random-gguf.ts";
import { QWEN3_MOE_SHAPES } from "../src/model/shapes.ts";
import { dequantizeGgml, ggmlBlockTensor, isGgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { nmse } from "../src/quant/metrics.ts";
import { repoRoot } from "./support/paths.ts";
import { processEnv } from "./support/graph-switches.ts";
import { top } from "./support/logits.ts";

const DIR = `${repoRoot}test/fixtures/kquant-model`;
const MARGIN = 0.5;
/** vkmoe's logits against the six llama.cpp prints: measured <= 0.32 (a gross error, such as a skipped op, moves them by whole units). */
const LOGIT_TOLERANCE = 0.5;
const MIN_COMPARED = 12;

interface Reference {
  file: string;
  tensor_types: Record<string, string>;
  prompts: {
    text: string;
    prompt_ids: number[];
    greedy_ids: number[];
    greedy_text: string;
    last_prompt_logits: { ids: number[]; values: number[]; sum: number };
  }[];
}

const reference = (mix: string): Reference => JSON.parse(readFileSync(`${DIR}/random-qwen3moe.${mix}.llama-cpp.json`, "utf8"));

/**
 * At each step of llama.cpp's greedy ids (fed back as they are): vkmoe's argmax is llama.cpp's where
 * its margin allows; with `oracle`, every step's logits are also within NMSE `bound` of that model's
 * (the CPU path on the same file; KV cache `cache`).
 */
function checkAgainstLlamaCpp(
  model: Model, ref: Reference, oracle?: { model: Model; bound: number; cache: "f32" | "f16" },
): { compared: number[]; logitDistance: number; worstNmse: number } {
  const compared: number[] = [];
  let logitDistance = 0, worstNmse = 0;
  for (const p of ref.prompts) {
    expect(model.tokenizer.encode(p.text)).toEqual(p.prompt_ids);
    // llama.cpp's text is its pieces' bytes decoded as UTF-8 (invalid bytes as U+FFFD), control tokens left out.
    expect(model.tokenizer.decode(p.greedy_ids, { skipSpecial: true })).toBe(p.greedy_text);
    const ctx = p.prompt_ids.length + p.greedy_ids.length + 1;
    const session = model.session({ ctx });
    const cpu = oracle?.model.session({ ctx, cpuCache: oracle.cache });
    const against = (logits: Float32Array, want: Float32Array | undefined) => {
      if (!want) return;
      const e = nmse(want, logits);
      worstNmse = Math.max(worstNmse, e);
      expect(e).toBeLessThanOrEqual(oracle!.bound);
    };
    let logits = session.prefill(p.prompt_ids);
    against(logits, cpu?.prefill(p.prompt_ids));
    const { ids, values } = p.last_prompt_logits;
    ids.forEach((id, i) => (logitDistance = Math.max(logitDistance, Math.abs(logits[id]! - values[i]!))));
    let n = 0;
    p.greedy_ids.forEach((want, step) => {
      const { id, margin } = top(logits);
      if (margin >= MARGIN) {
        expect({ step, id }).toEqual({ step, id: want });
        n++;
      }
      logits = session.step(want);
      against(logits, cpu?.step(want));
    });
    compared.push(n);
    expect(n).toBeGreaterThanOrEqual(MIN_COMPARED);
  }
  expect(logitDistance).toBeLessThanOrEqual(LOGIT_TOLERANCE);
  return { compared, logitDistance, worstNmse };
}

const env = (overrides: Partial<VkmoeEnv>): VkmoeEnv => ({ ...readConfig(), ...overrides });

describe("K-quant GGUF files from llama-quantize: vkmoe's greedy ids are llama.cpp CPU's", () => {
  for (const mix of ["Q4_K_M", "Q5_K_M"]) {
    const ref = reference(mix);
    const file = `${DIR}/${ref.file}`;
    const expertTypes = [...new Set(Object.entries(ref.tensor_types).filter(([n]) => n.includes("_exps.")).map(([, t]) => t))].sort();
    const types = expertTypes.join("/");
    const typesRe = types.replaceAll("/", "\\/");

    test(`${mix}, CPU decoder (VKMOE_GPU=0): experts on the CPU, said in one line; greedy ids equal wherever margins >= ${MARGIN}`, async () => {
      const lines: string[] = [];
      using model = await Model.load(file, { env: env({ VKMOE_GPU: false }), log: (l) => lines.push(l) });
      expect(model.device.mode).toBe("cpu");
      expect(model.device.experts).toBe("cpu");
      expect(model.device.why).toContain(`${types} experts run on the CPU: VKMOE_GPU=0`);
      expect(lines.filter((l) => l.includes("experts"))).toEqual([`vkmoe: ${types} experts run on the CPU: VKMOE_GPU=0`]);
      const { compared, logitDistance } = checkAgainstLlamaCpp(model, ref);
      console.log(`${mix} CPU: ${model.device.why}; argmax equal at ${compared.join(" and ")} of 32 steps; logits within ${logitDistance.toFixed(3)} of llama.cpp's`);
    }, 60_000);

    test(`${mix}, GPU per-layer: the experts on the GPU as the file holds them; logits NMSE <= 1e-9 of the CPU path, greedy ids llama.cpp's`, async () => {
      const lines: string[] = [];
      using model = await Model.load(file, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "auto" }), log: (l) => lines.push(l) });
      using cpu = await Model.load(file, { env: env({ VKMOE_GPU: false }), log: () => {} });
      expect(model.device.mode, model.device.why).toBe("per-layer");
      expect(model.device.experts).toBe("gpu");
      expect(model.device.why).toMatch(new RegExp(`GPU: .*, ${typesRe} experts resident as the file holds them`));
      expect(lines.filter((l) => l.includes("run on the CPU"))).toEqual([]);
      const { compared, logitDistance, worstNmse } = checkAgainstLlamaCpp(model, ref, { model: cpu, bound: 1e-9, cache: "f32" });
      expect(model.takeValidationMessages()).toEqual([]);
      console.log(`${mix} GPU per-layer: ${model.device.why}; argmax equal at ${compared.join(" and ")} of 32 steps; logits within ${logitDistance.toFixed(3)} of llama.cpp's; NMSE vs CPU ${worstNmse.toExponential(2)}`);
    }, 90_000);

    // Q4_K_M on the defaults (two dispatches, the norm a dispatch of its own), Q5_K_M with the next
    // layer's norm (and the final norm) in down's last workgroup (VKMOE_NORM_TAIL=on, an option:
    // slower on the H100).
    const options = mix === "Q4_K_M" ? {} : { VKMOE_NORM_TAIL: "on" as const };
    test(`${mix}, GPU resident (${["VKMOE_GRAPH=on", ...Object.entries(options).map(([k, v]) => `${k}=${v}`)].join(", ")}): the whole token in one submit; logits NMSE <= 1e-6 of the CPU path (f16 KV cache), greedy ids llama.cpp's`, async () => {
      using model = await Model.load(file, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "off", ...options }), log: () => {} });
      using cpu = await Model.load(file, { env: env({ VKMOE_GPU: false }), log: () => {} });
      expect(model.device.mode, model.device.why).toBe("resident");
      expect(model.device.experts).toBe("gpu");
      const { compared, logitDistance, worstNmse } = checkAgainstLlamaCpp(model, ref, { model: cpu, bound: 1e-6, cache: "f16" });
      expect(model.takeValidationMessages()).toEqual([]);
      console.log(`${mix} GPU resident: ${model.device.why}; argmax equal at ${compared.join(" and ")} of 32 steps; logits within ${logitDistance.toFixed(3)} of llama.cpp's; NMSE vs CPU ${worstNmse.toExponential(2)}`);
    }, 90_000);

    // The integer-dot path (what GPUs with fast 8-bit dots take at decode): the dense GGML matrices
    // read an 8-bit x, q, k, v (and lm_head) the input norm's quantized rows (NormFeed)
    if (mix === "Q4_K_M") test(`${mix}, GPU resident on the integer-dot path (VKMOE_IDP=on; the input norms write q, k and v's quantized rows): logits NMSE <= 5e-3 of the CPU path, greedy ids llama.cpp's`, async () => {
      // the graph's matrices take the integer-dot decision from the process env (device-linear.ts)
      using restore = processEnv("VKMOE_IDP", "on");
      using model = await Model.load(file, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "on" }), log: () => {} });
      using cpu = await Model.load(file, { env: env({ VKMOE_GPU: false }), log: () => {} });
      expect(model.device.mode, model.device.why).toBe("resident");
      const { compared, logitDistance, worstNmse } = checkAgainstLlamaCpp(model, ref, { model: cpu, bound: 5e-3, cache: "f16" });
      expect(worstNmse).toBeGreaterThan(1e-7); // it did take the 8-bit path
      expect(model.takeValidationMessages()).toEqual([]);
      console.log(`${mix} GPU resident, integer-dot: argmax equal at ${compared.join(" and ")} of 32 steps; logits within ${logitDistance.toFixed(3)} of llama.cpp's; NMSE vs CPU ${worstNmse.toExponential(2)}`);
    }, 90_000);
  }

  // The norm tail's final norm over a batch step's rows (one row a sequence) and over a one-token
  // replay's: a batch stepped together equals each sequence's own session (the graph's bound)
  test("Q5_K_M, GPU resident with VKMOE_NORM_TAIL=on: 3 sequences stepped together (Model.batch) give each one's own session's logits (NMSE <= 1e-6)", async () => {
    const ref = reference("Q5_K_M");
    using model = await Model.load(`${DIR}/${ref.file}`, { env: env({ VKMOE_VALIDATION: true, VKMOE_GRAPH: "on", VKMOE_IDP: "off", VKMOE_NORM_TAIL: "on" }), log: () => {} });
    expect(model.device.mode, model.device.why).toBe("resident");
    const prompts = [0, 1, 2].map((i) => ref.prompts[i % ref.prompts.length]!.prompt_ids.slice(0, 4 + 3 * i));
    const ctx = 64;
    using batch = model.batch({ slots: 3, ctx });
    expect(batch.path).toBe("device-batch");
    const sessions = prompts.map(() => model.session({ ctx }));
    try {
      let worst = 0;
      const next = prompts.map((p, slot) => {
        const got = batch.prefill(slot, p), own = sessions[slot]!.prefill(p);
        worst = Math.max(worst, nmse(own, got));
        return top(got).id;
      });
      for (let step = 0; step < 4; step++) {
        const rows = batch.step(next.map((id, slot) => ({ slot, id })));
        rows.forEach((row, slot) => {
          worst = Math.max(worst, nmse(sessions[slot]!.step(next[slot]!), row));
          next[slot] = top(row).id;
        });
      }
      expect(worst).toBeLessThanOrEqual(1e-6);
      expect(model.takeValidationMessages()).toEqual([]);
    } finally {
      for (const s of sessions) s[Symbol.dispose]();
    }
  }, 120_000);

  test("Q4_K_M, GPU enabled, a budget the experts do not fit: the CPU path, one line saying how much did not fit", async () => {
    const ref = reference("Q4_K_M");
    const lines: string[] = [];
    using model = await Model.load(`${DIR}/${ref.file}`, { env: env({ VKMOE_VALIDATION: true }), budgetMB: 1, log: (l) => lines.push(l) });
    expect(model.device.mode).toBe("cpu");
    expect(model.device.experts).toBe("cpu");
    expect(lines.filter((l) => l.includes("experts"))).toEqual([expect.stringMatching(/^vkmoe: Q4_K\/Q6_K experts run on the CPU: [\d.]+ MiB do not fit the GPU budget of 1\.0 MiB \(they run resident or not at all\)$/)]);
    checkAgainstLlamaCpp(model, ref);
  }, 60_000);
});

const tmp = mkdtempSync(join(tmpdir(), "vkmoe-kquant-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/**
 * The Q4_K_M file with its routed experts requantized to Q8_0 (GGML's dequantized Q4_K/Q6_K values
 * through quantize_row_q8_0), every other tensor's bytes copied: K-quant dense matrices beside experts
 * the GPU's MoE kernels take. Metadata as make-model writes it for this shape and vocab.
 */
async function withQ8Experts(src: string, out: string): Promise<void> {
  using file = await openGguf(src);
  const shape = { ...QWEN3_MOE_SHAPES.tiny!, vocab: 1024 };
  const tokenizer = tokenizerMetadata(truncateBpeTokenizer(qwen3TokenizerFiles(), shape.vocab), { vocabSize: shape.vocab, pre: "qwen2", fallbackBosToken: "<|endoftext|>" });
  const specs = qwen3MoeTensors(shape, "q8_0").map((t) => (t.name.includes("_exps.") ? t : { ...t, type: file.tensors.get(t.name)!.dtype as GgmlTypeName }));
  using writer = GgufWriter.open(out, qwen3MoeMetadata(shape, "q8_0", tokenizer), specs);
  for (const spec of specs) {
    const view = file.tensors.get(spec.name)!;
    if (spec.type !== "Q8_0" || view.dtype === "Q8_0") {
      writer.write(view.bytes);
      continue;
    }
    if (!isGgmlBlockType(view.dtype)) throw new Error(`${spec.name} is ${view.dtype}`);
    const cols = spec.ne[0]!;
    const values = dequantizeGgml(ggmlBlockTensor(view.dtype, view.bytes, view.bytes.byteLength / ggmlTensorBytes(view.dtype as GgmlTypeName, [cols]), cols));
    const bytes = new Uint8Array(ggmlTensorBytes("Q8_0", spec.ne));
    encodeQ8_0(values, bytes);
    writer.write(bytes);
  }
  writer.close();
}

describe("K-quant dense matrices beside Q8_0 experts", () => {
  test("GPU enabled: the whole token on the GPU (the K-quant dense matrices through dec_gemv_ggml), the CPU path's logits and tokens", async () => {
    const path = join(tmp, "q8-experts.gguf");
    await withQ8Experts(`${DIR}/${reference("Q4_K_M").file}`, path);
    const lines: string[] = [];
    // VKMOE_GRAPH=on: on Lavapipe (a CPU device) the graph is not tried otherwise.
    using gpu = await Model.load(path, { env: env({ VKMOE_IDP: "off", VKMOE_GRAPH: "on", VKMOE_VALIDATION: true }), log: (l) => lines.push(l) });
    using cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
    expect(gpu.device.mode, gpu.device.why).toBe("resident");
    expect(gpu.device.experts).toBe("gpu");
    expect(cpu.device.mode).toBe("cpu");
    for (const p of reference("Q4_K_M").prompts) {
      const a = gpu.session({ ctx: 64 }), b = cpu.session({ ctx: 64 });
      let x = a.prefill(p.prompt_ids).slice(), y = b.prefill(p.prompt_ids);
      // The same weights and ops; the GPU sums in another order and keeps an f16 KV cache: the
      // resident graph's bound against the CPU decoder (test/model-graph.test.ts)
      expect(nmse(y, x)).toBeLessThan(1e-6);
      for (let step = 0; step < 8; step++) {
        const want = top(y);
        if (want.margin >= 0.01) expect(top(x).id).toBe(want.id);
        x = a.step(want.id).slice();
        y = b.step(want.id);
      }
    }
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, 60_000);
});
