/**
 * Whether fused MoE calls are pre-launched on this device (GpuLayer: the kernel is submitted before
 * its inputs are written, and reads them after a doorbell).
 *
 * That relies on the device seeing host stores made while a dispatch runs, which Vulkan does not
 * promise (host writes are ordered before a submission, not during it): a driver whose GPU caches
 * kept an older copy of the inputs would give a wrong answer without an error. So "auto" turns it
 * on only where the suite's pre-launch tests pass and it was measured faster: the NVIDIA
 * proprietary driver (H200). On a CPU device (Lavapipe, where the tests pass too) the waiting
 * workgroups take the CPU threads the running call needs: an S=1 call took 24.3 ms pre-launched
 * against 15.0 ms submitted (bench-moe --quick, 2 cores). VKMOE_PRELAUNCH=on asks for it
 * anywhere, off never.
 */
import { PhysicalDeviceType } from "../vk/constants.ts";

const NVIDIA_PROPRIETARY = 4;

export interface PrelaunchDecision {
  on: boolean;
  why: string;
}

export function decidePrelaunch(setting: "auto" | "on" | "off", device: { driverId: number; driverName: string; type: number }): PrelaunchDecision {
  if (setting === "off") return { on: false, why: "VKMOE_PRELAUNCH=off" };
  if (setting === "on") return { on: true, why: "VKMOE_PRELAUNCH=on" };
  if (device.type === PhysicalDeviceType.CPU) return { on: false, why: "a CPU device: waiting workgroups would take the running call's threads" };
  if (device.driverId === NVIDIA_PROPRIETARY) return { on: true, why: "verified on NVIDIA proprietary" };
  return { on: false, why: `not verified on ${device.driverName} (VKMOE_PRELAUNCH=on to try it)` };
}
