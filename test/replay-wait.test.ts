/**
 * ReplayWaiter, the host's wait for a replay:
 * - its policy against a recording fence: "block" is one blocking wait; "hybrid" blocks on a replay's
 *   first run, then for 0.8x its last duration before polling, per replay; a timeout is reported;
 *   the fence is reset after every run;
 * - "auto": polling on a GPU, blocking on a CPU device; the others as set;
 * - on the real driver under the validation layer: a replay run again and again in both modes.
 */
import { afterAll, afterEach, expect, test } from "bun:test";
import { fenceWaitMode, ReplayWaiter } from "../src/graph/replay-wait.ts";
import { CommandPool, Fence, Submission } from "../src/vk/index.ts";
import { finish, openTestContext } from "./support/gpu.ts";

/** A fence whose waits are recorded and answered from a script (true: signaled). */
function recordingFence(answers: boolean[]) {
  const calls: string[] = [];
  const next = () => answers.shift() ?? true;
  const fence = {
    wait: (timeoutNs?: bigint) => (calls.push(`wait ${timeoutNs}`), next()),
    waitSpin: (spinNs: number) => (calls.push(`spin ${spinNs > 0}`), next()),
    reset: () => void calls.push("reset"),
  } as unknown as Fence;
  return { fence, calls };
}
const fakeSubmission = () => {
  let submits = 0;
  return { submission: { submit: () => void submits++ } as unknown as Submission, submits: () => submits };
};

test("block: one blocking wait with the caller's timeout, then a reset", () => {
  const { fence, calls } = recordingFence([true]);
  const s = fakeSubmission();
  expect(new ReplayWaiter(fence, "block").run(s.submission, 5n)).toBe(true);
  expect(calls).toEqual(["wait 5", "reset"]);
  expect(s.submits()).toBe(1);
});

test("hybrid: a replay's first run blocks; later ones block for part of the last duration, then poll; each replay its own", () => {
  // first run: signaled; second: the short wait times out, the poll sees it; third: the short wait sees it
  const { fence, calls } = recordingFence([true, false, true, true, true]);
  const waiter = new ReplayWaiter(fence, "hybrid");
  const a = fakeSubmission(), b = fakeSubmission();
  expect(waiter.run(a.submission, 7n)).toBe(true);
  expect(waiter.run(a.submission, 7n)).toBe(true);
  expect(waiter.run(a.submission, 7n)).toBe(true);
  expect(waiter.run(b.submission, 7n)).toBe(true);  // another replay: no duration of its own yet
  expect(calls[0]).toBe("wait 7");
  expect(calls[1]).toBe("reset");
  expect(calls[2]).toMatch(/^wait \d+$/);
  expect(calls[2]).not.toBe("wait 7");
  expect(calls.slice(3, 5)).toEqual(["spin true", "reset"]);
  expect(calls[5]).toMatch(/^wait \d+$/);
  expect(calls.slice(6)).toEqual(["reset", "wait 7", "reset"]);
});

test("a replay that does not finish is reported (false), in both modes", () => {
  for (const mode of ["block", "hybrid"] as const) {
    const { fence } = recordingFence([false, false, false, false]);
    const waiter = new ReplayWaiter(fence, mode);
    const s = fakeSubmission();
    expect(waiter.run(s.submission, 1n)).toBe(false);
    expect(waiter.run(s.submission, 1n)).toBe(false);
  }
});

const ctx = openTestContext();

test("auto polls on a GPU and blocks on a CPU device; block and hybrid stand as set", () => {
  const gpu = { info: { type: 2 } } as unknown as typeof ctx.device, cpu = { info: { type: 4 } } as unknown as typeof ctx.device;
  expect(fenceWaitMode(gpu, "auto")).toBe("hybrid");
  expect(fenceWaitMode(cpu, "auto")).toBe("block");
  for (const d of [gpu, cpu]) for (const m of ["block", "hybrid"] as const) expect(fenceWaitMode(d, m)).toBe(m);
  expect(fenceWaitMode(ctx.device, "auto")).toBe(ctx.device.info.type === 4 ? "block" : "hybrid");
});
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => finish(ctx));

test("on the driver: a replay run repeatedly, blocking and hybrid", () => {
  using pool = new CommandPool(ctx.device);
  const cb = pool.allocate().begin().barrier("computeToCompute").end();
  using fence = new Fence(ctx.device);
  using submission = new Submission(ctx.device, [cb], { fence });
  for (const mode of ["block", "hybrid"] as const) {
    const waiter = new ReplayWaiter(fence, mode);
    for (let i = 0; i < 4; i++) expect(waiter.run(submission)).toBe(true);
    expect(fence.signaled()).toBe(false);  // reset after each run
  }
});
