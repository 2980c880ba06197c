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
  { label: "NVIDIA (subgroup 32)", match: (d) => d.vendorId === 0x10de, config: { workgroupSize: 128, rowsPerWorkgroup: 4, colThreads: 32, rowLanes: 4 } },
  { label: "AMD (subgroup 64/32)", match: (d) => d.vendorId === 0x1002, config: { workgroupSize: 64, rowsPerWorkgroup: 2, colThreads: 32, rowLanes: 2 } },
  { label: "Intel", match: (d) => d.vendorId === 0x8086, config: { workgroupSize: 64, rowsPerWorkgroup: 2, colThreads: 16, rowLanes: 2 } },
  { label: "CPU / Lavapipe (subgroup 8)", match: (d) => d.type === 4, config: { workgroupSize: 64, rowsPerWorkgroup: 4, colThreads: 16, rowLanes: 4 } },
  { label: "default", match: () => true, config: { workgroupSize: 64, rowsPerWorkgroup: 2, colThreads: 32, rowLanes: 2 } },
];

export function chooseKernelConfig(d: PhysicalDeviceInfo, forceSharedReduction = false): KernelConfig {
  const row = TUNING_TABLE.find((r) => r.match(d))!;
  const useSubgroup = d.subgroup.arithmetic && !forceSharedReduction;
  const reduction = useSubgroup ? `subgroupAdd (subgroup ${d.subgroup.size})` : forceSharedReduction ? "shared memory (forced)" : "shared memory (no subgroup arithmetic)";
  return { ...row.config, useSubgroup, why: `${row.label}: ${row.config.workgroupSize} threads, ${row.config.rowsPerWorkgroup} rows/workgroup, ${reduction}` };
}

/** Specialization constants 0..6 of the GEMV shaders. */
export function specialization(c: KernelConfig, scaleF16: boolean, groupSize: number): Record<number, number> {
  return {
    0: c.workgroupSize, 1: c.rowsPerWorkgroup, 2: c.useSubgroup ? 1 : 0, 3: scaleF16 ? 1 : 0, 4: groupSize,
    5: c.colThreads, 6: c.rowLanes,
  };
}
