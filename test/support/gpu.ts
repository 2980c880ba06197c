/**
 * Every GPU test opens its context through here: the Khronos validation layer is always on, and
 * `finish()` disposes everything and throws if the layer said anything (leaks at vkDestroyDevice included).
 */
import { VulkanContext, type ContextOptions, type ValidationMessage } from "../../src/vk/index.ts";

/**
 * The time a test that makes pipelines may take: Lavapipe compiles a pipeline at its first dispatch,
 * and with a cold shader cache on a 2-core host one compile took ~60 s and a test's eight 159 s (CI,
 * 2026-12-08), where a warm cache takes seconds.
 */
export const COLD_COMPILE_MS = 600_000;

export function openTestContext(options: ContextOptions = {}): VulkanContext {
  return new VulkanContext({ validation: true, ...options });
}

export class ValidationFailure extends Error {
  constructor(readonly messages: ValidationMessage[]) {
    super(`${messages.length} validation message(s):\n${messages.map((m) => `[${m.severity}] ${m.idName}: ${m.message}`).join("\n")}`);
  }
}

/** Disposes the context (LIFO after the caller's own resources) and fails on any validation message. */
export function finish(ctx: VulkanContext): void {
  ctx[Symbol.dispose]();
  const messages = ctx.instance.takeMessages();
  if (messages.length) throw new ValidationFailure(messages);
}

export function assert(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}
