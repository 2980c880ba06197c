/**
 * Qwen3.5 sequences decoding together on the GPU (src/graph/hybrid-batch.ts, Model.batch's device
 * path for this family) on the tiny Q8_0 GGUF, resident on Lavapipe (VKMOE_GRAPH=on), validation
 * layer on, float atomics off (deterministic sums). Every row a batch returns equals what its
 * slot's tokens give run alone, through a HybridSequence of its own (NMSE <= SAME, see its comment) and through the CPU decoder (NMSE <= 1e-6, the bound of the graph's own tests,
 * test/model-qwen35-graph.test.ts): prompts packed into one replay, decode rounds of a changing
 * set of slots, a prompt packed with other slots' decode tokens (mixed run), tokens of two slots
 * interleaved in entry order; a slot truncated starts over (its recurrent states reset) and
 * equals a fresh slot; out-of-order positions are one typed error.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { InvalidArgumentError } from "../src/errors.ts";
import type { DeviceDecoder } from "../src/graph/index.ts";
import { Model } from "../src/model/model.ts";
import type { Session } from "../src/model/session.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";

const env = (o: Partial<VkmoeEnv> = {}): VkmoeEnv => ({ ...readConfig(), VKMOE_VALIDATION: true, VKMOE_IDP: "off", VKMOE_GRAPH: "on", VKMOE_FLOAT_ATOMICS: "off", ...o });
/** Against the CPU decoder (f16 KV cache as the GPU's): the graph tests' bound. */
const CPU_BOUND = 1e-6;
/**
 * Against the same tokens through a HybridSequence: the same kernels, except that a batch's
 * attention takes each token as its own group (the sequence's splits a chunk's tokens otherwise),
 * so its sums round differently: measured 6e-10 at worst, bounded with 16x room. Batch against
 * batch (any packing of the same tokens) is bit for bit with float atomics off, as here, where
 * both runs take the same MoE path (4 tokens or fewer a run: per slot; more: by expert).
 */
const SAME = 1e-8;
const CTX = 96;
const T = 240_000;

const path = fixture("qwen3.5-moe-tiny.Q8_0.gguf");
let ps: number[][] = [];
let gpu: Model | undefined;
let cpu: Model | undefined;

beforeAll(async () => {
  const json = fixture("qwen3.5-moe-tiny/reference.json");
  if (!path || !json) return;
  ps = (JSON.parse(readFileSync(json, "utf8")).prompts as { input_ids: number[] }[]).map((p) => p.input_ids);
  gpu = await Model.load(path, { env: env(), log: () => {} });
  cpu = await Model.load(path, { env: env({ VKMOE_GPU: false }), log: () => {} });
});
afterAll(() => {
  gpu?.[Symbol.dispose]();
  cpu?.[Symbol.dispose]();
});

const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);
const it = path ? test : test.skip;

/** A slot's references: its tokens through a GPU sequence of its own and through the CPU decoder. */
interface Reference {
  own: Session;
  oracle: Session;
}

describe("a HybridBatch equals each slot run alone", () => {
  it("3 slots: two prompts packed, decode rounds, a prompt packed with decode tokens, a subset stepping; every row vs a HybridSequence and the CPU decoder", () => {
    const m = gpu!, c = cpu!;
    expect(m.device.mode).toBe("resident");
    using batch = m.batch({ slots: 3, ctx: CTX });
    expect(batch.path).toBe("device-batch");
    const inputs = [ps[0]!, ps[1]!, ps[1]!.slice(5, 16)];
    const refs: Reference[] = inputs.map(() => ({ own: m.session({ ctx: CTX }), oracle: c.session({ ctx: CTX, cpuCache: "f16" }) }));
    let worstSame = 0, worstCpu = 0, rows = 0;
    const check = (slot: number, row: Float32Array, own: Float32Array, oracle: Float32Array) => {
      const a = nmse(own, row), b = nmse(oracle, row);
      worstSame = Math.max(worstSame, a);
      worstCpu = Math.max(worstCpu, b);
      rows++;
      expect({ slot, same: a <= SAME, cpu: b <= CPU_BOUND }).toEqual({ slot, same: true, cpu: true });
    };
    /** Runs `tokens` of each slot on its references and checks the batch's row for each. */
    const compare = (got: Float32Array[], items: { slot: number; ids: number[] }[]) => {
      items.forEach(({ slot, ids }, i) => {
        const r = refs[slot]!;
        expect(r.own.path).toBe("device");
        const own = (ids.length === 1 && r.own.length > 0 ? r.own.step(ids[0]!) : r.own.prefill(ids)).slice();
        const oracle = (ids.length === 1 && r.oracle.length > 0 ? r.oracle.step(ids[0]!) : r.oracle.prefill(ids)).slice();
        check(slot, got[i]!, own, oracle);
      });
    };
    try {
      const next: number[] = [];
      const record = (slot: number, row: Float32Array) => (next[slot] = argmax(row));
      // slots 0 and 2's prompts in one replay (25 + 11 tokens)
      let items = [{ slot: 0, ids: inputs[0]! }, { slot: 2, ids: inputs[2]! }];
      const runs0 = batch.counts.runs;
      let got = batch.prefillMany(items);
      expect(batch.counts.runs - runs0).toBe(1);
      compare(got, items);
      items.forEach(({ slot }, i) => record(slot, got[i]!));
      for (let step = 0; step < 5; step++) {
        if (step === 2) {
          // mixed: slot 1's 37-token prompt between slots 0 and 2's decode tokens, one replay
          items = [{ slot: 0, ids: [next[0]!] }, { slot: 1, ids: inputs[1]! }, { slot: 2, ids: [next[2]!] }];
          const before = batch.counts.runs;
          got = batch.prefillMany(items);
          expect(batch.counts.runs - before).toBe(1);
        } else {
          const active = [0, 1, 2].filter((s) => (s !== 1 || step > 2) && (s !== 2 || step < 4));
          items = active.map((slot) => ({ slot, ids: [next[slot]!] }));
          got = batch.step(items.map(({ slot, ids }) => ({ slot, id: ids[0]! })));
        }
        compare(got, items);
        items.forEach(({ slot }, i) => record(slot, got[i]!));
      }
      console.log(`qwen3.5 batch: ${rows} rows; worst NMSE vs a HybridSequence ${worstSame.toExponential(1)}, vs the CPU decoder ${worstCpu.toExponential(1)}`);
      expect(m.takeValidationMessages()).toEqual([]);
    } finally {
      for (const r of refs) {
        r.own[Symbol.dispose]();
        r.oracle[Symbol.dispose]();
      }
    }
  }, T);

  it("a truncated slot starts over: emptied, a new prompt equals the same prompt in a fresh slot (bit for bit); kept 3, the next 5 equal a fresh session of all 8", () => {
    const m = gpu!;
    using batch = m.batch({ slots: 2, ctx: CTX });
    const prompt = ps[1]!.slice(0, 9);
    const fresh = batch.prefill(1, prompt).slice();
    // slot 0 used, then emptied: what it held must leave no trace in its states
    batch.prefill(0, ps[0]!);
    batch.step([{ slot: 0, id: 7 }, { slot: 1, id: 9 }]);
    batch.truncate(0, 0);
    const reused = batch.prefill(0, prompt);
    console.log(`reset slot vs fresh slot: NMSE ${nmse(fresh, reused).toExponential(1)}`);
    expect(Array.from(reused)).toEqual(Array.from(fresh));
    // keep a prefix: the kept tokens run again from empty states
    batch.truncate(1, 3);
    expect(batch.tokens(1)).toEqual(prompt.slice(0, 3));
    const more = ps[0]!.slice(0, 5);
    const got = batch.prefill(1, more);
    using alone = m.session({ ctx: CTX });
    expect(nmse(alone.prefill([...prompt.slice(0, 3), ...more]), got)).toBeLessThanOrEqual(SAME);
    expect(m.takeValidationMessages()).toEqual([]);
  }, T);
});

describe("the device batch itself", () => {
  /** The model's device decoder (private: the batch's raw API, below SessionBatch's bookkeeping). */
  const decoder = () => (gpu as unknown as { deviceDecoder: DeviceDecoder }).deviceDecoder;

  it("two slots' tokens interleaved in one run ([a0 b0 a1 b1 a2]) equal each slot's tokens run alone; positions that do not follow a slot's states are a typed error", () => {
    const m = gpu!, V = m.config.vocab;
    using batch = decoder().batch(2, 32);
    expect(batch.rewindable).toBe(false);
    const a = ps[0]!.slice(0, 3), b = ps[1]!.slice(0, 2);
    const mixed = batch.run([
      { slot: 0, id: a[0]!, position: 0 }, { slot: 1, id: b[0]!, position: 0 }, { slot: 0, id: a[1]!, position: 1 },
      { slot: 1, id: b[1]!, position: 1 }, { slot: 0, id: a[2]!, position: 2 },
    ]).slice();
    using alone = decoder().batch(1, 32);
    const ra = alone.run(a.map((id, position) => ({ slot: 0, id, position }))).slice();
    alone.reset!(0);
    const rb = alone.run(b.map((id, position) => ({ slot: 0, id, position }))).slice();
    const row = (x: Float32Array, r: number) => x.subarray(r * V, (r + 1) * V);
    // batch against batch: the same kernels on each row except the MoE layer's, which a run of
    // more than 4 tokens (the mixed one) regroups by expert (with rowsForGrouped its sums run in another order
    // than the per-slot kernels of the 3- and 2-token runs alone)
    const pairs: [number, Float32Array, number][] = [[0, ra, 0], [2, ra, 1], [4, ra, 2], [1, rb, 0], [3, rb, 1]];
    for (const [r, ref, i] of pairs) expect({ r, nmse: nmse(row(ref, i), row(mixed, r)) <= SAME }).toEqual({ r, nmse: true });
    // slot 0 holds 3 tokens: position 1 again (a rewind) or 5 (a gap) is refused, nothing run
    expect(() => batch.run([{ slot: 0, id: 1, position: 1 }])).toThrow(InvalidArgumentError);
    expect(() => batch.run([{ slot: 0, id: 1, position: 3 }, { slot: 0, id: 1, position: 5 }])).toThrow(/next token is at position 4/);
    expect(() => batch.run([{ slot: 2, id: 1, position: 0 }])).toThrow(/slot 2 is outside 0..1/);
    expect(() => batch.run([{ slot: 1, id: V, position: 2 }])).toThrow(/outside the vocabulary/);
    expect(() => batch.run([])).toThrow(InvalidArgumentError);
    batch.reset!(0);
    expect(Array.from(batch.run(a.map((id, position) => ({ slot: 0, id, position }))))).toEqual(Array.from(ra));
    expect(m.takeValidationMessages()).toEqual([]);
  }, T);
});
