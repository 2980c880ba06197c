/**
 * Submitting a recorded replay and waiting for it. A thread blocked in vkWaitForFences wakes some
 * time after the GPU signals (the driver's sleep), and every decode token pays that gap. "hybrid"
 * (as llama.cpp's Vulkan backend does) blocks for most of the time the same replay took last and
 * polls the fence for the rest, so the thread is awake when the replay ends; "block" only blocks.
 */
import { readConfig } from "../config.ts";
import type { Device, Fence, Submission } from "../vk/index.ts";

export type FenceWaitMode = "block" | "hybrid";

/**
 * VKMOE_FENCE_WAIT's mode on `device`: "auto" polls on a GPU and blocks on a CPU device (Lavapipe),
 * whose own threads need the core a poll would take.
 */
export function fenceWaitMode(device: Device, setting = readConfig().VKMOE_FENCE_WAIT): FenceWaitMode {
  return setting === "auto" ? (device.info.type === 4 ? "block" : "hybrid") : setting;
}

/** The part of the last duration spent blocked before polling. */
const BLOCK_FRACTION = 0.8;

export class ReplayWaiter {
  /** Each replay's last submit-to-signal time, ms. */
  private readonly lastMs = new WeakMap<Submission, number>();

  constructor(private readonly fence: Fence, readonly mode: FenceWaitMode) {}

  /** Submits `submission` (whose fence is this one) and waits for it; false on timeout. The fence is reset after. */
  run(submission: Submission, timeoutNs = 60_000_000_000n): boolean {
    submission.submit();
    let done: boolean;
    if (this.mode === "block") done = this.fence.wait(timeoutNs);
    else {
      const start = performance.now();
      const last = this.lastMs.get(submission);
      // the first run of a replay has no duration yet: it only blocks
      done = last === undefined
        ? this.fence.wait(timeoutNs)
        : this.fence.wait(BigInt(Math.floor(last * BLOCK_FRACTION * 1e6))) || this.fence.waitSpin(Math.max(last, 1) * 2e6, timeoutNs);
      this.lastMs.set(submission, performance.now() - start);
    }
    this.fence.reset();
    return done;
  }
}
