/** The first compute round trip (y = a*x + b), shared by the Bun and Deno suites. Throws on any wrong element. */
import { Buffer, CommandPool, ComputePipeline, DescriptorPool, Fence, Submission } from "../../src/vk/index.ts";
import { assert, finish, openTestContext } from "../support/gpu.ts";
import { shaderPath } from "../support/paths.ts";

const SENTINEL = 0x7fc0dead; // a NaN payload no kernel writes

export function saxpyRoundTrip(n: number, a = 2.5, b = -0.75): void {
  const ctx = openTestContext();
  try {
    const dev = ctx.device;
    using x = new Buffer(dev, { size: BigInt(4 * n), memory: "upload" });
    using y = new Buffer(dev, { size: BigInt(4 * (n + 4)), memory: "readback" });
    const xs = new Float32Array(x.host());
    for (let i = 0; i < n; i++) xs[i] = Math.fround(Math.sin(i) * 1000);
    new Uint32Array(y.host()).fill(SENTINEL);
    const wg = 64;
    using pipeline = new ComputePipeline(dev, { spirv: shaderPath("saxpy"), storageBuffers: 2, pushConstantBytes: 12, specialization: { 0: wg } });
    using pool = new DescriptorPool(dev, 1, 2);
    const set = pool.allocate(pipeline, [{ buffer: x }, { buffer: y, range: BigInt(4 * n) }]);
    using commands = new CommandPool(dev);
    const pc = new DataView(new ArrayBuffer(12));
    pc.setUint32(0, n, true);
    pc.setFloat32(4, a, true);
    pc.setFloat32(8, b, true);
    const cb = commands.allocate().begin().bind(pipeline, set).pushConstants(pipeline, pc).dispatch(Math.ceil(n / wg)).barrier("computeToHost").end();
    using fence = new Fence(dev);
    using submission = new Submission(dev, [cb], { fence });
    submission.submit();
    assert(fence.wait(), "fence timed out");
    const ys = new Float32Array(y.host());
    const words = new Uint32Array(y.host());
    const fa = Math.fround(a), fb = Math.fround(b);
    for (let i = 0; i < n; i++) {
      // The GPU may fuse a*x+b into an FMA: accept the fused or the two-rounding result.
      const unfused = Math.fround(Math.fround(fa * xs[i]!) + fb);
      const fused = Math.fround(fa * xs[i]! + fb);
      assert(ys[i] === unfused || ys[i] === fused, `y[${i}] = ${ys[i]}, expected ${unfused}`);
    }
    for (let i = n; i < n + 4; i++) assert(words[i] === SENTINEL, `sentinel word ${i} overwritten`);
  } finally {
    finish(ctx);
  }
}
