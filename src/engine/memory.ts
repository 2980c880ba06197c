/** The process's peak resident memory, for load reports: VmHWM from /proc on Linux, else the runtime's current RSS. */
import { readFileSync } from "node:fs";

export function peakRssBytes(): number | undefined {
  try {
    const m = /VmHWM:\s+(\d+)\s+kB/.exec(readFileSync("/proc/self/status", "utf8"));
    if (m) return Number(m[1]) * 1024;
  } catch {
    // Not Linux: fall through.
  }
  const deno = (globalThis as any).Deno;
  try {
    return deno ? deno.memoryUsage().rss : (globalThis as any).process?.memoryUsage?.().rss;
  } catch {
    return undefined;
  }
}
