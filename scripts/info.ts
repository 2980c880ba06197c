// `bun run info` (or `bun run info:deno`): the device banner to paste into bug reports.
import { readConfig } from "../src/config.ts";
import { describeKernelPlan, planKernels } from "../src/kernels/setup.ts";
import { banner } from "../src/vk/banner.ts";
import { VulkanContext } from "../src/vk/index.ts";

try {
  const env = readConfig();
  using ctx = new VulkanContext({}, env);
  console.log(banner(ctx));
  console.log(describeKernelPlan(planKernels(ctx.device, env)).join("\n"));
} catch (e) {
  console.error(`vkmoe: ${(e as Error).message}`);
  (globalThis as any).process.exitCode = 1;
}
