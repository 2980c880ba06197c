/**
 * Workgroup shape per device: a table by vendor and subgroup size to start with. The chosen row is
 * printed in the banner so a report says which kernel shape ran.
 */
import type { PhysicalDeviceInfo } from "../vk/physical.ts";

export interface KernelConfig {
  workgroupSize: number;
  rowsPerWorkgroup: number;
  /** Threads that read consecutive uvec4 of one row (0 = the whole workgroup). */
  colThreads: number;
  /** Row groups interleaved in a block of colThreads*rowLanes threads. */
  rowLanes: number;
  /** subgroupAdd reduction where subgroup arithmetic exists, else shared memory. */
  useSubgroup: boolean;
  why: string;
}

export interface TuningRow {
  match: (d: PhysicalDeviceInfo) => boolean;
  config: Omit<KernelConfig, "useSubgroup" | "why">;
  label: string;
}

export const TUNING_TABLE: readonly TuningRow[] = [
  // Measured on an H200 (shaders/README.md): one subgroup per workgroup, 8 rows per thread.
  { label: "NVIDIA (subgroup 32)", match: (d) => d.vendorId === 0x10de, config: { workgroupSize: 32, rowsPerWorkgroup: 8, colThreads: 0, rowLanes: 1 } },
  // Not measured here: bandwidth-bound iGPUs, one wave64 per workgroup.
  { label: "AMD (subgroup 64/32)", match: (d) => d.vendorId === 0x1002, config: { workgroupSize: 64, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1 } },
  { label: "Intel", match: (d) => d.vendorId === 0x8086, config: { workgroupSize: 64, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1 } },
  { label: "CPU / Lavapipe (subgroup 8)", match: (d) => d.type === 4, config: { workgroupSize: 64, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1 } },
  { label: "default", match: () => true, config: { workgroupSize: 64, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1 } },
];

export function chooseKernelConfig(d: PhysicalDeviceInfo, forceSharedReduction = false): KernelConfig {
  const row = TUNING_TABLE.find((r) => r.match(d))!;
  const useSubgroup = d.subgroup.arithmetic && !forceSharedReduction;
  const reduction = useSubgroup ? `subgroupAdd (subgroup ${d.subgroup.size})` : forceSharedReduction ? "shared memory (forced)" : "shared memory (no subgroup arithmetic)";
  return { ...row.config, useSubgroup, why: `${row.label}: ${row.config.workgroupSize} threads, ${row.config.rowsPerWorkgroup} rows/workgroup, ${reduction}` };
}

/**
 * The grouped MoE kernels see small matrices (768-2048 rows per expert): more, smaller workgroups
 * keep the GPU busy. Measured on the H200 with `bun scripts/profile-moe.ts --sweep` (S=1 layer
 * call, Qwen3-30B-A3B shape, each kernel 20x back to back, 2026-11-30): 32 threads x 4 rows
 * gate+up 13.5 µs float / 7.8 µs integer-dot, down 11.1 µs; x 2 rows 15.1 / 9.3 / 16.5 µs;
 * x 8 rows 53 / 9.2 / 10.3 µs (the float path degrades badly at 8 rows per thread); split rows
 * (colThreads < 32) and 64-128 threads were slower at S=1.
 */
export function chooseMoeKernelConfig(d: PhysicalDeviceInfo, forceSharedReduction = false): KernelConfig {
  const c = chooseKernelConfig(d, forceSharedReduction);
  if (d.vendorId !== 0x10de) return c;
  return { ...c, workgroupSize: 32, rowsPerWorkgroup: 4, colThreads: 0, rowLanes: 1, why: c.why.replace(/32 threads, 8 rows\/workgroup/, "32 threads, 4 rows/workgroup (MoE)") };
}

/** Specialization constants 0..6 of the GEMV shaders. */
export function specialization(c: KernelConfig, scaleF16: boolean, groupSize: number): Record<number, number> {
  return {
    0: c.workgroupSize, 1: c.rowsPerWorkgroup, 2: c.useSubgroup ? 1 : 0, 3: scaleF16 ? 1 : 0, 4: groupSize,
    5: c.colThreads, 6: c.rowLanes,
  };
}
