/**
 * Dense MLP layers (config mlp_only_layers / decoder_sparse_step), which the fixtures do not have.
 * transformers' rule: layer i is MoE iff i is not in mlp_only_layers, num_experts > 0 and
 * (i + 1) % decoder_sparse_step == 0. A dense layer is down(silu(gate x) ⊙ up x), which is what
 * an MoE layer with one expert routed at weight 1 computes: the same weights in both places must
 * give the same logits. And transformers' own logits and routing for a small random checkpoint with
 * dense layers (test/fixtures/qwen3-moe-dense-layers, made by scripts/fixtures/make-dense-layers-fixture.py).
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { openTensorFile } from "../src/formats/index.ts";
import { repoRoot } from "./support/paths.ts";
import { configFromHf } from "../src/model/config.ts";
import { Decoder } from "../src/model/decoder.ts";
import { openExperts } from "../src/model/experts.ts";
import { KvCache } from "../src/model/kv-cache.ts";
import { loadWeights } from "../src/model/weights.ts";
import type { TensorFile, TensorView } from "../src/formats/tensor.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32 } from "../src/quant/random.ts";

const base = {
  model_type: "qwen3_moe", hidden_size: 64, num_hidden_layers: 3, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
  num_experts: 1, num_experts_per_tok: 1, moe_intermediate_size: 48, intermediate_size: 48, vocab_size: 100,
  rope_theta: 10000, rms_norm_eps: 1e-6, norm_topk_prob: true, max_position_embeddings: 256,
};

test("which layers are dense follows transformers' rule", () => {
  expect(configFromHf({ ...base, num_hidden_layers: 4, mlp_only_layers: [0], decoder_sparse_step: 2 }).moeLayers).toEqual([false, true, false, true]);
  expect(configFromHf({ ...base, num_hidden_layers: 4, mlp_only_layers: [2, 3], decoder_sparse_step: 1 }).moeLayers).toEqual([true, true, false, false]);
  expect(configFromHf({ ...base, num_experts: 0 }).moeLayers).toEqual([false, false, false]);
  expect(() => configFromHf({ ...base, mlp_only_layers: [1], intermediate_size: undefined })).toThrow(/intermediate_size/);
});

/** An in-memory HF checkpoint: f32 tensors from a seeded generator, the same values for the same name. */
function checkpoint(moeLayers: boolean[]): TensorFile {
  const D = 64, H = 4, KV = 2, hd = 16, I = 48, V = 100;
  const tensors = new Map<string, TensorView>();
  const add = (name: string, shape: number[], seedName = name, scale = 0.2, offset = 0) => {
    const n = shape.reduce((a, b) => a * b, 1);
    let seed = 0;
    for (const ch of seedName) seed = (seed * 31 + ch.charCodeAt(0)) >>> 0;
    const rand = mulberry32(seed);
    const data = new Float32Array(n).map(() => offset + scale * (rand() * 2 - 1));
    tensors.set(name, { name, dtype: "F32", shape, bytes: new Uint8Array(data.buffer) });
  };
  add("model.embed_tokens.weight", [V, D], undefined, 1);
  add("model.norm.weight", [D], undefined, 0.1, 1);
  add("lm_head.weight", [V, D]);
  for (let l = 0; l < moeLayers.length; l++) {
    const p = `model.layers.${l}`;
    for (const n of ["input_layernorm", "post_attention_layernorm"]) add(`${p}.${n}.weight`, [D], undefined, 0.1, 1);
    for (const n of ["q_norm", "k_norm"]) add(`${p}.self_attn.${n}.weight`, [hd], undefined, 0.1, 1);
    add(`${p}.self_attn.q_proj.weight`, [H * hd, D]);
    add(`${p}.self_attn.k_proj.weight`, [KV * hd, D]);
    add(`${p}.self_attn.v_proj.weight`, [KV * hd, D]);
    add(`${p}.self_attn.o_proj.weight`, [D, H * hd]);
    // The same values under either name: the dense MLP and the single expert.
    const mlp = (m: string) => (moeLayers[l] ? `${p}.mlp.experts.0.${m}_proj.weight` : `${p}.mlp.${m}_proj.weight`);
    add(mlp("gate"), [I, D], `${p}.${"gate"}`);
    add(mlp("up"), [I, D], `${p}.${"up"}`);
    add(mlp("down"), [D, I], `${p}.${"down"}`);
    if (moeLayers[l]) add(`${p}.mlp.gate.weight`, [1, D]);
  }
  return { format: "safetensors", tensors, mappedBytes: 0, [Symbol.dispose]() {} };
}

function logits(config: object, moeLayers: boolean[]): Float32Array {
  const cfg = configFromHf(config);
  expect(cfg.moeLayers).toEqual(moeLayers);
  const weights = loadWeights(checkpoint(moeLayers), cfg, { experts: "none", dense: "none" }, "in-memory");
  using experts = openExperts(cfg, weights, { log: () => {} });
  const decoder = new Decoder(cfg, weights, experts);
  const kv = new KvCache(cfg.layers, 32, cfg.kvHeads, cfg.headDim);
  const out = new Float32Array(cfg.vocab);
  decoder.forward([3, 14, 15, 92, 65, 35], kv, 1, out);
  return out;
}

test("a dense layer computes what a one-expert MoE layer with the same weights does", () => {
  const allMoe = logits({ ...base }, [true, true, true]);
  const middleDense = logits({ ...base, mlp_only_layers: [1] }, [true, false, true]);
  const sparseStep = logits({ ...base, decoder_sparse_step: 2 }, [false, true, false]);
  expect(nmse(allMoe, middleDense)).toBeLessThan(1e-12);
  expect(nmse(allMoe, sparseStep)).toBeLessThan(1e-12);
});

test("a checkpoint with dense layers (mlp_only_layers [0], decoder_sparse_step 2) matches transformers' logits and routing", async () => {
  // Made by scripts/fixtures/make-dense-layers-fixture.py with transformers 5.17 (f32 weights and compute).
  const dir = `${repoRoot}test/fixtures/qwen3-moe-dense-layers`;
  const ref = JSON.parse(readFileSync(`${dir}/reference.json`, "utf8"));
  const refBytes = readFileSync(`${dir}/reference-logits.f32`);
  const refLogits = new Float32Array(refBytes.buffer, refBytes.byteOffset, refBytes.byteLength / 4);
  const cfg = configFromHf(JSON.parse(readFileSync(`${dir}/config.json`, "utf8")));
  expect(cfg.moeLayers).toEqual(ref.layer_kinds.map((k: string) => k === "Qwen3MoeSparseMoeBlock"));
  using file = await openTensorFile(dir);
  const weights = loadWeights(file, cfg, { experts: "none", dense: "none" }, dir);
  using experts = openExperts(cfg, weights, { log: () => {} });
  const decoder = new Decoder(cfg, weights, experts);
  const ids: number[] = ref.input_ids;
  const kv = new KvCache(cfg.layers, 32, cfg.kvHeads, cfg.headDim);
  const logits = new Float32Array(ids.length * cfg.vocab);
  const routes: number[][][] = [];
  decoder.forward(ids, kv, ids.length, logits, {
    routing: (_l, r, S, k) => routes.push(Array.from({ length: S }, (_, t) => Array.from(r.subarray(t * k, (t + 1) * k)))),
  });
  expect(nmse(refLogits, logits)).toBeLessThan(1e-8);
  expect(routes).toEqual(ref.router_topk_per_moe_layer);
});
