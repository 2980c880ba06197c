/** How many bytes of device memory the expert pool may use, and why. */
import { readFileSync } from "node:fs";
import { freemem } from "node:os";
import type { Device } from "../vk/device.ts";
import { queryPhysicalDevice } from "../vk/physical.ts";

export interface Budget {
  bytes: number;
  why: string;
}

export interface BudgetOptions {
  /** VKMOE_BUDGET_MB. */
  overrideMB?: number;
  /** VKMOE_IGNORE_BUDGET_EXT: some drivers (RADV on RX 6000) under-report the budget. */
  ignoreBudgetExtension?: boolean;
  /** Host memory available, in bytes (defaults to MemAvailable from /proc/meminfo). */
  hostAvailable?: number;
}

/** MemAvailable from /proc/meminfo (Linux), else the runtime's free memory. */
export function hostAvailableBytes(): number {
  try {
    const m = /MemAvailable:\s+(\d+) kB/.exec(readFileSync("/proc/meminfo", "utf8"));
    if (m) return Number(m[1]) * 1024;
  } catch {
    // not Linux
  }
  return freemem();
}

const MiB = 2 ** 20;
/** Headroom left for the rest of the process, the driver and other programs. */
const reserveFor = (bytes: number) => Math.max(256 * MiB, Math.floor(bytes * 0.1));

export function computeBudget(device: Device, options: BudgetOptions = {}): Budget {
  if (options.overrideMB !== undefined) return { bytes: options.overrideMB * MiB, why: `VKMOE_BUDGET_MB=${options.overrideMB}` };
  const fresh = queryPhysicalDevice(device.vk, device.info.handle, device.info.index);
  const heapIndex = fresh.types[device.memory.deviceType]!.heap;
  const heap = fresh.heaps[heapIndex]!;
  const size = Number(heap.size);
  const fmt = (b: number) => `${Math.round(b / MiB)} MiB`;
  if (device.enabled.memoryBudget && !options.ignoreBudgetExtension && heap.budget !== undefined) {
    const budget = Number(heap.budget), usage = Number(heap.usage ?? 0n);
    const bytes = Math.max(0, budget - usage - reserveFor(budget));
    return { bytes, why: `VK_EXT_memory_budget: heap ${heapIndex} budget ${fmt(budget)} − usage ${fmt(usage)} − reserve ${fmt(reserveFor(budget))}` };
  }
  if (device.memory.model === "unified") {
    // The heap *is* host RAM: take the smaller of the two, never their sum.
    const host = options.hostAvailable ?? hostAvailableBytes();
    const avail = Math.min(size, host);
    return { bytes: Math.max(0, avail - reserveFor(avail)), why: `unified memory: min(heap ${fmt(size)}, host available ${fmt(host)}) − reserve` };
  }
  return { bytes: Math.max(0, size - reserveFor(size)), why: `heap ${heapIndex} of ${fmt(size)} − reserve (no VK_EXT_memory_budget)` };
}
