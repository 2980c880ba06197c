/** Logits comparisons the model tests share: the top id and its margin, and a GPU model's steps against the CPU decoder's. */
import { expect } from "bun:test";
import type { Model } from "../../src/model/model.ts";
import { nmse } from "../../src/quant/metrics.ts";

/** The top id and its margin over the runner-up. */
export function top(logits: Float32Array): { id: number; margin: number } {
  let a = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[a]!) a = i;
  let b = a === 0 ? 1 : 0;
  for (let i = 0; i < logits.length; i++) if (i !== a && logits[i]! > logits[b]!) b = i;
  return { id: a, margin: logits[a]! - logits[b]! };
}

/**
 * Each prompt's prefill and 8 greedy decode steps (the CPU's ids fed to both): every step's logits
 * within NMSE `bound` of the CPU decoder's (KV cache `cache`), the same top id wherever the CPU's
 * margin is at least `margin`. Returns the worst NMSE.
 */
export function compareWithCpu(gpu: Model, cpu: Model, prompts: readonly number[][], o: { cache: "f32" | "f16"; bound: number; margin?: number }): number {
  let worst = 0;
  for (const ids of prompts) {
    using a = gpu.session({ ctx: 64 });
    using b = cpu.session({ ctx: 64, cpuCache: o.cache });
    let x = a.prefill(ids).slice(), y = b.prefill(ids).slice();
    for (let step = 0; ; step++) {
      const e = nmse(y, x);
      worst = Math.max(worst, e);
      expect({ step, e: e <= o.bound }).toEqual({ step, e: true });
      const want = top(y);
      if (want.margin >= (o.margin ?? 0.01)) expect({ step, id: top(x).id }).toEqual({ step, id: want.id });
      if (step === 8) break;
      x = a.step(want.id).slice();
      y = b.step(want.id).slice();
    }
  }
  return worst;
}
