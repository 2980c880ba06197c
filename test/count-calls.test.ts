/** countCalls: the "FFI calls per layer call" figure of the benchmarks depends on it. */
import { expect, test } from "bun:test";
import { countCalls } from "../src/vk/index.ts";
import { finish, openTestContext } from "./support/gpu.ts";

test("counts each Vulkan call once; a second install shares the counter; after the originals are restored it counts again", () => {
  const ctx = openTestContext();
  try {
    const vk = ctx.device.vk as any;
    const originals = { ...vk };
    const a = countCalls(ctx.device.vk);
    ctx.device.waitIdle();
    ctx.device.waitIdle();
    expect(a.counts.get("vkDeviceWaitIdle")).toBe(2);
    expect(countCalls(ctx.device.vk)).toBe(a);
    ctx.device.waitIdle();
    expect(a.total()).toBe(3);
    Object.assign(vk, originals);
    const c = countCalls(ctx.device.vk);
    expect(c).not.toBe(a);
    ctx.device.waitIdle();
    expect([a.total(), c.total()]).toEqual([3, 1]);
    Object.assign(vk, originals);
  } finally {
    finish(ctx);
  }
});
