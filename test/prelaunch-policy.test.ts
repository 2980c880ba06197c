/** Which drivers pre-launch fused calls by default (src/moe/prelaunch-policy.ts). */
import { describe, expect, test } from "bun:test";
import { decidePrelaunch } from "../src/moe/prelaunch-policy.ts";

describe("pre-launch policy", () => {
  test("auto: on for the verified drivers only (NVIDIA proprietary, Lavapipe)", () => {
    expect(decidePrelaunch("auto", 4, "NVIDIA")).toEqual({ on: true, why: "verified on NVIDIA proprietary" });
    expect(decidePrelaunch("auto", 13, "llvmpipe").on).toBe(true);
    for (const [id, name] of [[3, "radv"], [1, "AMD proprietary"], [6, "Intel open-source Mesa driver"], [21, "NVK"], [0, "unknown"]] as const) {
      const d = decidePrelaunch("auto", id, name);
      expect(d.on).toBe(false);
      expect(d.why).toBe(`not verified on ${name} (VKMOE_PRELAUNCH=on to try it)`);
    }
  });
  test("on and off override the driver", () => {
    expect(decidePrelaunch("on", 3, "radv")).toEqual({ on: true, why: "VKMOE_PRELAUNCH=on" });
    expect(decidePrelaunch("off", 4, "NVIDIA")).toEqual({ on: false, why: "VKMOE_PRELAUNCH=off" });
  });
});
