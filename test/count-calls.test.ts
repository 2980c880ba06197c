/** countCalls: the "FFI calls per layer call" figure of the benchmarks depends on it. */
import { expect, test } from "bun:test";
import { coreSymbols, countCalls, type CoreCommands } from "../src/vk/loader.ts";
import { finish, openTestContext } from "./support/gpu.ts";

test("on the real loader table: each call counted once; a second install shares the counter", () => {
  const ctx = openTestContext();
  try {
    const a = countCalls(ctx.device.vk);
    const waits = () => a.counts.get("vkDeviceWaitIdle") ?? 0;
    const w0 = waits(), t0 = a.total();
    ctx.device.waitIdle();
    ctx.device.waitIdle();
    expect([waits() - w0, a.total() - t0]).toEqual([2, 2]);
    expect(countCalls(ctx.device.vk)).toBe(a);
  } finally {
    finish(ctx);
  }
});

test("after a caller puts the original functions back, the next install counts again (not into a dead map)", () => {
  const originals = Object.fromEntries(Object.keys(coreSymbols).map((n) => [n, () => 0]));
  const table = { ...originals } as unknown as CoreCommands;
  const a = countCalls(table);
  table.vkDeviceWaitIdle(0n);
  expect(a.total()).toBe(1);
  Object.assign(table, originals);
  const b = countCalls(table);
  expect(b).not.toBe(a);
  table.vkDeviceWaitIdle(0n);
  expect([a.total(), b.total()]).toEqual([1, 1]);
});
