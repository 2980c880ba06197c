// Which fence wait is fastest in this runtime: blocking vkWaitForFences, spin on vkGetFenceStatus
// then block, or the nonblocking wait (Deno runs it on a worker thread; in Bun it is the blocking
// call behind a Promise). Measured on an empty submission and on a short compute job.
//   bun scripts/bench-wait.ts        deno run --allow-all scripts/bench-wait.ts
import { readConfig } from "../src/config.ts";
import { Buffer, CommandPool, ComputePipeline, DescriptorPool, Fence, Submission, VulkanContext } from "../src/vk/index.ts";
import { shaderFile } from "../src/kernels/shaders.ts";

const runtime = "Bun" in globalThis ? "bun" : "deno";
using ctx = new VulkanContext({}, readConfig());
const device = ctx.device;
using commands = new CommandPool(device);
using fence = new Fence(device);
using src = new Buffer(device, { size: 64n << 20n, memory: "device" });
using dst = new Buffer(device, { size: 1n << 20n, memory: "device" });
using stream = new ComputePipeline(device, { spirv: shaderFile("stream_read"), storageBuffers: 2, pushConstantBytes: 8, specialization: { 0: 256 } });
using descriptors = new DescriptorPool(device, 1, 2);
const set = descriptors.allocate(stream, [{ buffer: src }, { buffer: dst }]);
const empty = commands.allocate().begin().end();
const cpu = device.info.type === 4;
const work = commands.allocate().begin().bind(stream, set).pushConstants(stream, new Uint32Array([0, (cpu ? 1 << 14 : 4 << 20) / 16])).dispatch(cpu ? 4 : 256).end();
const reps = cpu ? 200 : 2000;

async function time(label: string, cb: typeof empty, wait: () => boolean | Promise<boolean>): Promise<[string, number]> {
  using submission = new Submission(device, [cb], { fence });
  for (let i = 0; i < 20; i++) { submission.submit(); await wait(); fence.reset(); }
  const samples: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    submission.submit();
    if (!(await wait())) throw new Error("timeout");
    samples.push(performance.now() - t0);
    fence.reset();
  }
  samples.sort((a, b) => a - b);
  return [label, samples[samples.length >> 1]! * 1000];
}

const rows: [string, number][] = [];
for (const [name, cb] of [["empty submit", empty], ["short job", work]] as const) {
  rows.push(await time(`${name}: blocking vkWaitForFences`, cb, () => fence.wait()));
  rows.push(await time(`${name}: spin 200 µs then block`, cb, () => fence.waitSpin(200_000)));
  rows.push(await time(`${name}: nonblocking (${runtime === "deno" ? "worker thread" : "blocking behind a Promise"})`, cb, () => fence.waitAsync()));
}
console.log(`${new Date().toISOString().slice(0, 10)} ${runtime}, ${device.info.name} ${device.info.driverInfo}: median µs per submit+wait (${reps} reps)`);
for (const [label, us] of rows) console.log(`| ${label.padEnd(58)} | ${us.toFixed(1).padStart(8)} |`);
