/**
 * llama.cpp's own GPU time by op on a model file: `llama-bench` with its Vulkan backend's perf
 * logger (GGML_VK_PERF_LOGGER, grouped at the graph's sync points with
 * GGML_VK_PERF_LOGGER_CONCURRENT), after `depth` tokens of context, for one decode token or a
 * prompt of `tokens`. Used by `bun run profile:graph --llama-bench PATH` beside its own table. The
 * logger adds a timestamp at every sync point, so its figures run a little above llama-bench's own.
 */
import { spawnSync } from "node:child_process";
import { oneLine } from "./cli.ts";

/** One line of a "Vulkan Timings" block: the nodes of a group, how many times the graph ran it, µs each. */
export interface LlamaPerfGroup {
  name: string;
  count: number;
  meanUs: number;
  totalUs: number;
}

export interface LlamaPerfResult {
  command: string;
  /** The last graph's groups (the last decode token, or the prompt). */
  groups: LlamaPerfGroup[];
  totalUs: number;
  error?: string;
  /** Said beside figures that still stand. */
  warning?: string;
}

const GROUP = /^(.+): (\d+) x ([\d.e+-]+) us = ([\d.e+-]+) us/;

/** The last "Vulkan Timings" block of a perf-logger capture; undefined when there is none. */
export function parseLlamaPerf(text: string): { groups: LlamaPerfGroup[]; totalUs: number } | undefined {
  const blocks = text.split("Vulkan Timings:");
  if (blocks.length < 2) return undefined;
  const groups: LlamaPerfGroup[] = [];
  let totalUs: number | undefined;
  for (const line of blocks[blocks.length - 1]!.split("\n")) {
    const total = /^Total time: ([\d.e+-]+) us/.exec(line.trim());
    if (total) {
      totalUs = Number(total[1]);
      break;
    }
    const m = GROUP.exec(line.trim());
    if (m) groups.push({ name: m[1]!, count: Number(m[2]), meanUs: Number(m[3]), totalUs: Number(m[4]) });
  }
  return totalUs === undefined ? undefined : { groups, totalUs };
}

export function runLlamaPerf(binary: string, file: string, o: { depth: number; tokens: number; log: (line: string) => void }): LlamaPerfResult {
  // a prompt chunk: one prompt of `tokens`; decode: 4 tokens, the last one's graph is the figure
  const argv = ["-m", file, "-ngl", "99", "-fa", "1", "-p", String(o.tokens > 1 ? o.tokens : 0), "-n", String(o.tokens > 1 ? 0 : 4), "-d", String(o.depth), "-r", "1"];
  const command = `GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_CONCURRENT=1 ${binary} ${argv.join(" ")}`;
  o.log(command);
  const r = spawnSync(binary, argv, { encoding: "utf8", maxBuffer: 256 * 1024 * 1024, env: { ...process.env, GGML_VK_PERF_LOGGER: "1", GGML_VK_PERF_LOGGER_CONCURRENT: "1" } });
  const output = `${r.stdout ?? ""}\n${r.stderr ?? ""}`;
  const parsed = parseLlamaPerf(output);
  const failed = r.error ? oneLine(r.error) : r.status !== 0 ? `exit ${r.status ?? r.signal}` : undefined;
  // a whole block printed before a failure at exit (seen on Lavapipe: a crash in its teardown) still stands
  if (parsed && failed) return { command, ...parsed, warning: `it failed after printing its timings (${failed})` };
  if (failed) {
    const last = String(r.stderr ?? "").trim().split("\n").filter((l) => l.trim() !== "").slice(-2).join(" / ");
    return { command, groups: [], totalUs: 0, error: `${failed}${last ? `: ${last}` : ""}` };
  }
  if (!parsed) {
    // its Vulkan backend leaves CPU devices (Lavapipe) out unless GGML_VK_VISIBLE_DEVICES names them
    const why = /No devices found/.test(output) ? "its Vulkan backend found no device (it skips CPU devices such as Lavapipe unless GGML_VK_VISIBLE_DEVICES names them)" : "a build without the perf logger?";
    return { command, groups: [], totalUs: 0, error: `no "Vulkan Timings" block in its output: ${why}` };
  }
  return { command, ...parsed };
}
