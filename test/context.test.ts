/**
 * VulkanContext shares one VkInstance per (loader, validation settings) across the contexts of a
 * process and keeps it for the next one: NVIDIA's 580 driver refuses vkCreateInstance
 * (VK_ERROR_INCOMPATIBLE_DRIVER) after ~30 create/destroy cycles in one process, so a host that
 * reopens the backend must not create an instance per context. Devices stay per context.
 */
import { expect, test } from "bun:test";
import { VulkanContext } from "../src/vk/index.ts";
import { readConfig } from "../src/config.ts";

const env = { ...readConfig(), VKMOE_VALIDATION: true };

test("40 contexts opened and closed in turn (each with its own device): one VkInstance, no validation message", () => {
  const first = new VulkanContext({}, env);
  const instance = first.instance;
  first[Symbol.dispose]();
  for (let i = 1; i < 40; i++) {
    const ctx = new VulkanContext({}, env);
    expect(ctx.instance).toBe(instance);
    expect(ctx.instance.handle).toBe(instance.handle);
    expect(ctx.device.handle).not.toBe(0n);
    ctx[Symbol.dispose]();
  }
  expect(instance.takeMessages()).toEqual([]);
});

test("two contexts open at once share the instance; other validation settings get their own", () => {
  const a = new VulkanContext({}, env);
  const b = new VulkanContext({}, env);
  const sync = new VulkanContext({ syncValidation: true }, env);
  try {
    expect(b.instance).toBe(a.instance);
    expect(b.device.handle).not.toBe(a.device.handle);
    expect(sync.instance).not.toBe(a.instance);
  } finally {
    sync[Symbol.dispose]();
    b[Symbol.dispose]();
    a[Symbol.dispose]();
  }
  expect(a.instance.takeMessages()).toEqual([]);
});

test("a context with its own onMessage callback gets a private instance, destroyed with it", () => {
  const shared = new VulkanContext({}, env);
  const seen: string[] = [];
  const own = new VulkanContext({ onMessage: (m) => seen.push(m.idName) }, env);
  try {
    expect(own.instance).not.toBe(shared.instance);
  } finally {
    own[Symbol.dispose]();
    shared[Symbol.dispose]();
  }
  expect(seen).toEqual([]);
});

test("releaseInstances destroys idle shared instances only; the next context creates a new one", () => {
  const open = new VulkanContext({}, env);
  VulkanContext.releaseInstances(); // in use: kept
  const again = new VulkanContext({}, env);
  expect(again.instance).toBe(open.instance);
  again[Symbol.dispose]();
  open[Symbol.dispose]();
  const old = open.instance;
  VulkanContext.releaseInstances();
  const fresh = new VulkanContext({}, env);
  try {
    expect(fresh.instance).not.toBe(old);
  } finally {
    fresh[Symbol.dispose]();
  }
});
