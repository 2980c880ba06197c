/**
 * CommandBuffer's dependency forms between compute dispatches, judged by the Khronos
 * synchronization validation (the oracle) and by the values: two dependent RMSNorms, the second
 * reading what the first wrote (read after write), ordered by
 * - the global barrier (computeToCompute), its reads-only form (computeToComputeRead), and a buffer
 *   barrier on the buffer written: no hazard, the CPU's values;
 * - negative controls: a buffer barrier on another buffer, and an execution-only barrier
 *   (computeExecution), each reported as a read-after-write hazard;
 * - an execution-only barrier where the second dispatch only writes what the first read (write after
 *   read): no hazard.
 */
import { afterAll, afterEach, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { RmsNormKernel } from "../src/kernels/decoder/rmsnorm.ts";
import { rmsNorm } from "../src/model/ops.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { CommandBuffer } from "../src/vk/index.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer } from "./support/host-buffers.ts";

const ctx = openTestContext({ syncValidation: true });
const device = ctx.device;
const norm = new RmsNormKernel(device, device.info.type === 4 ? { workgroupSize: 8 } : {});
const N = 96, EPS = 1e-6;
const x = hostBuffer(device, N), w = hostBuffer(device, N), y = hostBuffer(device, N), z = hostBuffer(device, N), other = hostBuffer(device, N);
const xs = randomGaussianF32(N, 7), ws = randomGaussianF32(N, 8);
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const b of [other, z, y, w, x]) b[Symbol.dispose]();
  norm[Symbol.dispose]();
  finish(ctx);
});

/** x -> y, the dependency `between`, then y -> z; the validation messages' ids and z. */
function chain(between: (cb: CommandBuffer) => void): { ids: string[]; z: Float32Array } {
  f32(x, N).set(xs);
  f32(w, N).set(ws);
  f32(z, N).fill(0);
  submitAndWait(device, (cb) => {
    norm.record(cb, { x, w, y, rows: 1, n: N, eps: EPS });
    between(cb);
    norm.record(cb, { x: y, w, y: z, rows: 1, n: N, eps: EPS });
  });
  return { ids: ctx.instance.takeMessages().map((m) => m.idName), z: f32(z, N).slice() };
}

const expected = (() => {
  const once = new Float32Array(N), twice = new Float32Array(N);
  rmsNorm(xs, ws, N, 1, EPS, once);
  rmsNorm(once, ws, N, 1, EPS, twice);
  return twice;
})();
const maxRelative = (a: Float32Array, b: Float32Array) => Math.max(...Array.from(a, (v, i) => Math.abs(v - b[i]!) / Math.max(1e-6, Math.abs(b[i]!))));

test("a read after write ordered by the global, reads-only or one-buffer barrier: no hazard, the CPU's values", () => {
  for (const between of [(cb: CommandBuffer) => cb.barrier("computeToCompute"), (cb: CommandBuffer) => cb.barrier("computeToComputeRead"), (cb: CommandBuffer) => cb.bufferBarrier("computeToCompute", [y])]) {
    const r = chain(between);
    expect(r.ids).toEqual([]);
    expect(maxRelative(r.z, expected)).toBeLessThan(1e-5);
  }
});

test("negative controls: a buffer barrier on another buffer, or an execution-only barrier, is a read-after-write hazard", () => {
  for (const between of [(cb: CommandBuffer) => cb.bufferBarrier("computeToCompute", [other, x]), (cb: CommandBuffer) => cb.barrier("computeExecution")]) {
    const r = chain(between);
    expect(r.ids.some((id) => id.includes("READ-AFTER-WRITE"))).toBe(true);
  }
});

test("an execution-only barrier orders a write after a read (write after read): no hazard", () => {
  f32(x, N).set(xs);
  f32(w, N).set(ws);
  submitAndWait(device, (cb) => {
    norm.record(cb, { x, w, y, rows: 1, n: N, eps: EPS });  // reads x
    cb.barrier("computeExecution");
    norm.record(cb, { x: w, w, y: x, rows: 1, n: N, eps: EPS });  // writes x
  });
  expect(ctx.instance.takeMessages().map((m) => m.idName)).toEqual([]);
});

test("a buffer barrier over no buffers is refused", () => {
  submitAndWait(device, (cb) => {
    expect(() => cb.bufferBarrier("computeToCompute", [])).toThrow(InvalidArgumentError);
  });
});
