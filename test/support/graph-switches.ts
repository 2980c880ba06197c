/** What the tests of the graphs' switches share: a VKMOE_* variable set for a scope, a decode token's GPU commands, rows compared bit for bit. */
import { expect } from "bun:test";
import type { Model } from "../../src/model/model.ts";
import { countCalls, openLoader } from "../../src/vk/loader.ts";

/**
 * Sets process.env[name] until disposed (then restores it): the graphs read their fold switches
 * from the process env when they are made, not from the model's env.
 */
export function processEnv(name: string, value: string): Disposable {
  const saved = process.env[name];
  process.env[name] = value;
  return { [Symbol.dispose]: () => (saved === undefined ? delete process.env[name] : (process.env[name] = saved)) };
}

/** The dispatches and pipeline barriers one recorded decode token of `m` makes. */
export function decodeTokenCommands(m: Model): { dispatches: number; barriers: number } {
  const calls = countCalls(openLoader().vk);
  using probe = m.session({ ctx: 8 });
  calls.reset();
  const dispatches = probe.dispatchesPerToken; // records the decode token
  return { dispatches, barriers: calls.counts.get("vkCmdPipelineBarrier") ?? 0 };
}

/** Indices of the rows of `a` whose bits differ from `b`'s. */
export function differingRows(a: Float32Array[], b: Float32Array[]): number[] {
  const bits = (x: Float32Array) => new Uint32Array(x.buffer, x.byteOffset, x.length);
  return a.flatMap((x, i) => {
    const y = bits(b[i]!);
    return bits(x).every((w, j) => w === y[j]) ? [] : [i];
  });
}

/** One run of a model under a switch: a decode token's commands and the logits rows it gave. */
export interface SwitchRun {
  dispatches: number;
  barriers: number;
  logits: Float32Array[];
}

/** `more` records `extra` dispatches and barriers a decode token more than `fewer`, and gives the same logits bit for bit. */
export function expectSameBits(more: SwitchRun, fewer: SwitchRun, extra: { dispatches: number; barriers: number }): void {
  expect(more.dispatches - fewer.dispatches).toBe(extra.dispatches);
  expect(more.barriers - fewer.barriers).toBe(extra.barriers);
  expect(more.logits.length).toBe(fewer.logits.length);
  expect(differingRows(more.logits, fewer.logits)).toEqual([]);
}
