/**
 * Whether fused MoE calls are pre-launched on this driver (GpuLayer: the kernel is submitted before
 * its inputs are written, and reads them after a doorbell). That relies on the device seeing host
 * stores made while a dispatch runs, which Vulkan does not promise (host writes are ordered before
 * a submission, not during it): a driver whose GPU caches may keep an older copy of the inputs
 * would give a wrong answer without an error. So "auto" pre-launches only on the drivers where the
 * suite's pre-launch tests pass (NVIDIA proprietary on an H200, Mesa Lavapipe in CI);
 * VKMOE_PRELAUNCH=on asks for it anywhere, off never.
 */
const VERIFIED_DRIVERS: ReadonlyMap<number, string> = new Map([
  [4, "NVIDIA proprietary"],
  [13, "Mesa llvmpipe (Lavapipe)"],
]);

export interface PrelaunchDecision {
  on: boolean;
  why: string;
}

export function decidePrelaunch(setting: "auto" | "on" | "off", driverId: number, driverName: string): PrelaunchDecision {
  if (setting === "off") return { on: false, why: "VKMOE_PRELAUNCH=off" };
  if (setting === "on") return { on: true, why: "VKMOE_PRELAUNCH=on" };
  const verified = VERIFIED_DRIVERS.get(driverId);
  return verified
    ? { on: true, why: `verified on ${verified}` }
    : { on: false, why: `not verified on ${driverName} (VKMOE_PRELAUNCH=on to try it)` };
}
