/**
 * Several sequences decoding together (Model.batch, the device path for a server's continuous
 * batching) on the fixture's Q8_0 GGUF, resident on Lavapipe: every slot's logits after a batched
 * step equal what a Session of its own gives for the same tokens (NMSE <= 1e-6, the bound the
 * whole-token path holds against its oracle), with slots at different lengths stepped together,
 * a subset of slots per step, a slot truncated and reused, and a prompt longer than a replay's 64
 * tokens; the per-session fallback (cpu mode) gives the same; a lost device moves the batch to the
 * CPU path with one line and the same tokens. Negative control: a slot's logits against another
 * slot's session fail the bound.
 */
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { readConfig, type VkmoeEnv } from "../src/config.ts";
import { Model } from "../src/model/model.ts";
import type { SessionBatch } from "../src/model/session-batch.ts";
import { nmse } from "../src/quant/metrics.ts";
import { fixture } from "./support/fixtures.ts";

const BOUND = 1e-6;
const env = (o: Partial<VkmoeEnv> = {}): VkmoeEnv => ({ ...readConfig(), VKMOE_VALIDATION: true, VKMOE_IDP: "off", VKMOE_GRAPH: "on", ...o });

function prompts(): number[][] | undefined {
  const json = fixture("qwen3-moe-tiny/reference.json");
  if (!json) return undefined;
  return (JSON.parse(readFileSync(json, "utf8")).prompts as { input_ids: number[] }[]).map((p) => p.input_ids);
}

async function load(e: VkmoeEnv, lines: string[] = []): Promise<Model | undefined> {
  const path = fixture("qwen3-moe-tiny.Q8_0.gguf");
  if (!path) return undefined;
  return Model.load(path, { env: e, log: (l) => lines.push(l) });
}

const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);

/**
 * Drives `batch` and one reference Session per slot through the same schedule: prompts into
 * slots, then greedy steps of the active slots together (slot 1 joins late, slot 2 stops early).
 * Returns the worst NMSE of a batch row against its own session's logits.
 */
function schedule(model: Model, batch: SessionBatch, ps: number[][]): number {
  const long = ps.flat().concat(ps.flat()).slice(0, 90); // more than one 64-token replay
  const inputs = [ps[0]!, long, ps[2] ?? ps[1]!];
  const refs = inputs.map(() => model.session({ ctx: batch.ctx }));
  let worst = 0;
  const compare = (a: Float32Array, b: Float32Array) => {
    const e = nmse(b, a);
    worst = Math.max(worst, e);
    expect(e).toBeLessThanOrEqual(BOUND);
  };
  try {
    const next: number[] = [];
    for (const s of [0, 2]) {
      const got = batch.prefill(s, inputs[s]!);
      compare(got, refs[s]!.prefill(inputs[s]!));
      next[s] = argmax(got);
    }
    for (let step = 0; step < 6; step++) {
      if (step === 2) {
        const got = batch.prefill(1, inputs[1]!);
        compare(got, refs[1]!.prefill(inputs[1]!));
        next[1] = argmax(got);
      }
      const active = [0, 1, 2].filter((s) => (s !== 1 || step >= 2) && (s !== 2 || step < 4));
      const rows = batch.step(active.map((slot) => ({ slot, id: next[slot]! })));
      const own = active.map((slot) => refs[slot]!.step(next[slot]!).slice());
      active.forEach((slot, i) => {
        compare(rows[i]!, own[i]!);
        next[slot] = argmax(rows[i]!);
      });
      // negative control: a row against another slot's session
      expect(nmse(own[1]!, rows[0]!)).toBeGreaterThan(1e-3);
    }
    // a slot truncated to a prefix and reused gives what a fresh run of the new tokens gives
    batch.truncate(0, 3);
    using fresh = model.session({ ctx: batch.ctx });
    const again = [...inputs[0]!.slice(0, 3), ...ps[1]!.slice(0, 5)];
    compare(batch.prefill(0, ps[1]!.slice(0, 5)), fresh.prefill(again));
    expect(batch.tokens(0)).toEqual(again);
  } finally {
    for (const r of refs) r[Symbol.dispose]();
  }
  return worst;
}

describe("Model.batch: several sequences decoding together", () => {
  test("resident (one replay a step) and per-session (cpu mode): every slot's logits equal its own session's", async () => {
    const ps = prompts();
    using gpu = await load(env());
    using cpu = await load(env({ VKMOE_GPU: false }));
    if (!ps || !gpu || !cpu) return console.log("skipping Model.batch: the fixture model is missing");
    expect(gpu.device.mode).toBe("resident");
    using onDevice = gpu.batch({ slots: 3, ctx: 160 });
    expect(onDevice.path).toBe("device-batch");
    const worstDevice = schedule(gpu, onDevice, ps);
    using sessions = cpu.batch({ slots: 3, ctx: 160 });
    expect(sessions.path).toBe("sessions");
    const worstCpu = schedule(cpu, sessions, ps);
    console.log(`  Model.batch: worst NMSE ${worstDevice.toExponential(2)} (device, ${onDevice.counts.runs} replays), ${worstCpu.toExponential(2)} (sessions)`);
    expect(gpu.takeValidationMessages()).toEqual([]);
  }, 300_000);

  test("a lost device: the batch goes on on the CPU path with one line, same greedy tokens", async () => {
    const ps = prompts();
    const lines: string[] = [];
    using gpu = await load(env(), lines);
    using cpu = await load(env({ VKMOE_GPU: false }));
    if (!ps || !gpu || !cpu) return console.log("skipping Model.batch device loss: the fixture model is missing");
    const run = (m: Model, lose: boolean) => {
      using b = m.batch({ slots: 2, ctx: 64 });
      const next = [argmax(b.prefill(0, ps[0]!)), argmax(b.prefill(1, ps[1]!))];
      const ids: number[][] = [[], []];
      for (let step = 0; step < 5; step++) {
        if (lose && step === 2) m.simulateDeviceLoss();
        const rows = b.step([{ slot: 0, id: next[0]! }, { slot: 1, id: next[1]! }]);
        rows.forEach((r, s) => { next[s] = argmax(r); ids[s]!.push(next[s]!); });
      }
      return { ids, path: b.path };
    };
    const lost = run(gpu, true), ref = run(cpu, false);
    expect(lost.path).toBe("sessions");
    expect(lost.ids).toEqual(ref.ids);
    expect(lines.filter((l) => /device lost/.test(l))).toHaveLength(1);
  }, 300_000);

  test("bad calls are refused with one clear error", async () => {
    using cpu = await load(env({ VKMOE_GPU: false }));
    if (!cpu) return console.log("skipping: the fixture model is missing");
    using b = cpu.batch({ slots: 2, ctx: 8 });
    expect(() => b.step([{ slot: 2, id: 1 }])).toThrow(/slot 2 is outside 0..1/);
    expect(() => b.step([{ slot: 0, id: 1 }, { slot: 0, id: 2 }])).toThrow(/appears twice/);
    expect(() => b.prefill(0, [1, 2, 3, 4, 5, 6, 7, 8, 9])).toThrow(/do not fit the context of 8/);
    expect(() => b.prefill(1, [-1])).toThrow(/outside the vocabulary/);
    expect(() => cpu.batch({ slots: 0 })).toThrow(/slots must be/);
  });
});
