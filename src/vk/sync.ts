/** Fences, timeline semaphores, timestamp queries, and a prebuilt submission that replays in one FFI call. */
import { NativeArena } from "../ffi/index.ts";
import { InvalidArgumentError } from "../errors.ts";
import { VK_FENCE_CREATE_SIGNALED_BIT, VK_QUERY_RESULT_64_BIT, VK_QUERY_RESULT_WAIT_BIT, VK_QUERY_TYPE_TIMESTAMP, VK_SEMAPHORE_TYPE_TIMELINE, VK_TIMEOUT } from "./constants.ts";
import type { CommandBuffer } from "./commands.ts";
import type { Device } from "./device.ts";
import { check } from "./errors.ts";
import { VkFenceCreateInfo, VkQueryPoolCreateInfo, VkSemaphoreCreateInfo, VkSemaphoreSignalInfo, VkSemaphoreTypeCreateInfo, VkSemaphoreWaitInfo, VkSubmitInfo, VkTimelineSemaphoreSubmitInfo } from "./structs.ts";

export class Fence implements Disposable {
  readonly device: Device;
  readonly handle: bigint;
  /** Native array holding this fence's handle, for vkWaitForFences/vkResetFences without allocation. */
  private readonly slot: bigint;
  private readonly arena = new NativeArena(64);
  private disposed = false;

  constructor(device: Device, signaled = false) {
    this.device = device;
    const a = device.arena;
    using _ = a.scope();
    const info = a.alloc(VkFenceCreateInfo.size);
    VkFenceCreateInfo.write(a.view, info, { flags: signaled ? VK_FENCE_CREATE_SIGNALED_BIT : 0 });
    const out = a.alloc(8);
    check("vkCreateFence", device.vk.vkCreateFence(device.handle, a.address(info), 0n, a.address(out)));
    this.handle = a.view.getBigUint64(out, true);
    const at = this.arena.alloc(8);
    this.arena.view.setBigUint64(at, this.handle, true);
    this.slot = this.arena.address(at);
  }

  /** True when signaled, false on timeout. Throws DeviceLostError and friends. */
  wait(timeoutNs = 60_000_000_000n): boolean {
    return check("vkWaitForFences", this.device.vk.vkWaitForFences(this.device.handle, 1, this.slot, 1, timeoutNs)) !== VK_TIMEOUT;
  }

  /**
   * Polls vkGetFenceStatus for up to `spinNs` (a short GPU job finishes before the driver's
   * sleep/wake-up would), then blocks in vkWaitForFences.
   */
  waitSpin(spinNs: number, timeoutNs = 60_000_000_000n): boolean {
    const { vk, handle } = this.device;
    const start = performance.now();
    const spinMs = spinNs / 1e6;
    do {
      if (check("vkGetFenceStatus", vk.vkGetFenceStatus(handle, this.handle)) === 0) return true;
    } while (performance.now() - start < spinMs);
    return this.wait(timeoutNs);
  }

  /** Waits without holding the JS thread in Deno (the call runs on a worker thread); in Bun it is `wait()`. */
  async waitAsync(timeoutNs = 60_000_000_000n): Promise<boolean> {
    const r = await this.device.vk.vkWaitForFencesAsync(this.device.handle, 1, this.slot, 1, timeoutNs);
    return check("vkWaitForFences", r) !== VK_TIMEOUT;
  }

  signaled(): boolean {
    return check("vkGetFenceStatus", this.device.vk.vkGetFenceStatus(this.device.handle, this.handle)) === 0;
  }

  reset(): void {
    check("vkResetFences", this.device.vk.vkResetFences(this.device.handle, 1, this.slot));
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.device.vk.vkDestroyFence(this.device.handle, this.handle, 0n);
    this.arena[Symbol.dispose]();
  }
}

export class TimelineSemaphore implements Disposable {
  readonly device: Device;
  readonly handle: bigint;
  private disposed = false;

  constructor(device: Device, initial = 0n) {
    this.device = device;
    const a = device.arena;
    using _ = a.scope();
    const type = a.alloc(VkSemaphoreTypeCreateInfo.size);
    VkSemaphoreTypeCreateInfo.write(a.view, type, { semaphoreType: VK_SEMAPHORE_TYPE_TIMELINE, initialValue: initial });
    const info = a.alloc(VkSemaphoreCreateInfo.size);
    VkSemaphoreCreateInfo.write(a.view, info, { pNext: a.address(type) });
    const out = a.alloc(8);
    check("vkCreateSemaphore", device.vk.vkCreateSemaphore(device.handle, a.address(info), 0n, a.address(out)));
    this.handle = a.view.getBigUint64(out, true);
  }

  value(): bigint {
    const a = this.device.arena;
    using _ = a.scope();
    const out = a.alloc(8);
    check("vkGetSemaphoreCounterValue", this.device.vk.vkGetSemaphoreCounterValue(this.device.handle, this.handle, a.address(out)));
    return a.view.getBigUint64(out, true);
  }

  /** Waits until the counter reaches `value`; false on timeout. */
  wait(value: bigint, timeoutNs = 10_000_000_000n): boolean {
    const a = this.device.arena;
    using _ = a.scope();
    const sems = a.alloc(8);
    a.view.setBigUint64(sems, this.handle, true);
    const vals = a.alloc(8);
    a.view.setBigUint64(vals, value, true);
    const info = a.alloc(VkSemaphoreWaitInfo.size);
    VkSemaphoreWaitInfo.write(a.view, info, { semaphoreCount: 1, pSemaphores: a.address(sems), pValues: a.address(vals) });
    return check("vkWaitSemaphores", this.device.vk.vkWaitSemaphores(this.device.handle, a.address(info), timeoutNs)) !== VK_TIMEOUT;
  }

  signal(value: bigint): void {
    const a = this.device.arena;
    using _ = a.scope();
    const info = a.alloc(VkSemaphoreSignalInfo.size);
    VkSemaphoreSignalInfo.write(a.view, info, { semaphore: this.handle, value });
    check("vkSignalSemaphore", this.device.vk.vkSignalSemaphore(this.device.handle, a.address(info)));
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.device.vk.vkDestroySemaphore(this.device.handle, this.handle, 0n);
  }
}

export interface SubmissionOptions {
  fence?: Fence;
  /** Signal this timeline semaphore; set the value per submit with `signalValue`. */
  timeline?: TimelineSemaphore;
}

/**
 * A VkSubmitInfo built once in native memory. `submit()` is one vkQueueSubmit call; with a
 * timeline semaphore, `submit(value)` rewrites one u64 in place first.
 */
export class Submission implements Disposable {
  readonly device: Device;
  private readonly arena = new NativeArena(512);
  private readonly info: bigint;
  private readonly fence: bigint;
  private readonly signalValueAt: number;

  constructor(device: Device, commandBuffers: readonly CommandBuffer[], options: SubmissionOptions = {}) {
    if (commandBuffers.length === 0) throw new InvalidArgumentError("a submission needs at least one command buffer");
    this.device = device;
    const a = this.arena;
    const cbs = a.alloc(8 * commandBuffers.length);
    commandBuffers.forEach((c, i) => a.view.setBigUint64(cbs + 8 * i, c.handle, true));
    let next = 0n;
    let signal = 0n;
    this.signalValueAt = -1;
    if (options.timeline) {
      const sem = a.alloc(8);
      a.view.setBigUint64(sem, options.timeline.handle, true);
      signal = a.address(sem);
      this.signalValueAt = a.alloc(8);
      const ts = a.alloc(VkTimelineSemaphoreSubmitInfo.size);
      VkTimelineSemaphoreSubmitInfo.write(a.view, ts, { signalSemaphoreValueCount: 1, pSignalSemaphoreValues: a.address(this.signalValueAt) });
      next = a.address(ts);
    }
    const info = a.alloc(VkSubmitInfo.size);
    VkSubmitInfo.write(a.view, info, {
      pNext: next, commandBufferCount: commandBuffers.length, pCommandBuffers: a.address(cbs),
      signalSemaphoreCount: options.timeline ? 1 : 0, pSignalSemaphores: signal,
    });
    this.info = a.address(info);
    this.fence = options.fence?.handle ?? 0n;
  }

  submit(signalValue?: bigint): void {
    if (signalValue !== undefined) {
      if (this.signalValueAt < 0) throw new InvalidArgumentError("this submission has no timeline semaphore");
      this.arena.view.setBigUint64(this.signalValueAt, signalValue, true);
    }
    check("vkQueueSubmit", this.device.vk.vkQueueSubmit(this.device.queue, 1, this.info, this.fence));
  }

  [Symbol.dispose](): void {
    this.arena[Symbol.dispose]();
  }
}

export class QueryPool implements Disposable {
  readonly device: Device;
  readonly handle: bigint;
  readonly count: number;
  private disposed = false;

  constructor(device: Device, count: number) {
    this.device = device;
    this.count = count;
    const a = device.arena;
    using _ = a.scope();
    const info = a.alloc(VkQueryPoolCreateInfo.size);
    VkQueryPoolCreateInfo.write(a.view, info, { queryType: VK_QUERY_TYPE_TIMESTAMP, queryCount: count });
    const out = a.alloc(8);
    check("vkCreateQueryPool", device.vk.vkCreateQueryPool(device.handle, a.address(info), 0n, a.address(out)));
    this.handle = a.view.getBigUint64(out, true);
  }

  /** Raw 64-bit timestamps of queries [first, first+count), waiting for them. */
  results(first = 0, count = this.count): BigUint64Array {
    const a = this.device.arena;
    using _ = a.scope();
    const at = a.alloc(8 * count);
    check("vkGetQueryPoolResults", this.device.vk.vkGetQueryPoolResults(this.device.handle, this.handle, first, count, BigInt(8 * count), a.address(at), 8n, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    return new BigUint64Array(a.bytes.buffer.slice(at, at + 8 * count));
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.device.vk.vkDestroyQueryPool(this.device.handle, this.handle, 0n);
  }
}
