/** Which devices pre-launch fused calls by default (src/moe/prelaunch-policy.ts). */
import { describe, expect, test } from "bun:test";
import { decidePrelaunch } from "../src/moe/prelaunch-policy.ts";
import { PhysicalDeviceType } from "../src/vk/constants.ts";

const dev = (driverId: number, driverName: string, type: number = PhysicalDeviceType.DISCRETE_GPU) => ({ driverId, driverName, type });

describe("pre-launch policy", () => {
  test("auto: on for the NVIDIA proprietary driver only; off on a CPU device and on unverified drivers", () => {
    expect(decidePrelaunch("auto", dev(4, "NVIDIA"))).toEqual({ on: true, why: "verified on NVIDIA proprietary" });
    expect(decidePrelaunch("auto", dev(13, "llvmpipe", PhysicalDeviceType.CPU)).on).toBe(false);
    expect(decidePrelaunch("auto", dev(4, "NVIDIA", PhysicalDeviceType.CPU)).on).toBe(false);
    for (const [id, name] of [[3, "radv"], [1, "AMD proprietary"], [6, "Intel open-source Mesa driver"], [21, "NVK"], [0, "unknown"]] as const) {
      for (const type of [PhysicalDeviceType.DISCRETE_GPU, PhysicalDeviceType.INTEGRATED_GPU]) {
        const d = decidePrelaunch("auto", dev(id, name, type));
        expect(d.on).toBe(false);
        expect(d.why).toBe(`not verified on ${name} (VKMOE_PRELAUNCH=on to try it)`);
      }
    }
  });
  test("on and off override the device", () => {
    expect(decidePrelaunch("on", dev(13, "llvmpipe", PhysicalDeviceType.CPU))).toEqual({ on: true, why: "VKMOE_PRELAUNCH=on" });
    expect(decidePrelaunch("off", dev(4, "NVIDIA"))).toEqual({ on: false, why: "VKMOE_PRELAUNCH=off" });
  });
});
