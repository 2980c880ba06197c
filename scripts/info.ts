// `bun run info` (or `deno task info`): the device banner to paste into bug reports.
import { readConfig } from "../src/config.ts";
import { banner } from "../src/vk/banner.ts";
import { VulkanContext } from "../src/vk/index.ts";

try {
  const env = readConfig();
  using ctx = new VulkanContext({}, env);
  console.log(banner(ctx));
} catch (e) {
  console.error(`vkmoe: ${(e as Error).message}`);
  (globalThis as any).process.exitCode = 1;
}
