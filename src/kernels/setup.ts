/** Which kernel shape and which GEMV path run on a device, and why: decided once per process. */
import type { VkmoeEnv } from "../config.ts";
import type { Device } from "../vk/device.ts";
import { decideIntegerDot, type IdpDecision } from "./idp-policy.ts";
import { probeIntegerDot } from "./idp-probe.ts";
import { chooseKernelConfig, type KernelConfig } from "./tuning.ts";

export interface KernelPlan {
  config: KernelConfig;
  integerDot: IdpDecision;
}

export function planKernels(device: Device, env: Pick<VkmoeEnv, "VKMOE_IDP" | "VKMOE_CACHE_DIR" | "VKMOE_DEVICE">): KernelPlan {
  const info = device.info;
  const driver = { vendorId: info.vendorId, driverId: info.driverId, driverVersion: info.driverVersion, uuid: info.uuid };
  const integerDot = decideIntegerDot({
    mode: env.VKMOE_IDP,
    featureEnabled: device.enabled.integerDotProduct,
    accelerated: info.integerDotProduct.accelerated4x8Packed,
    driver,
    probe: () => probeIntegerDot(driver, { cacheDir: env.VKMOE_CACHE_DIR }),
  });
  return { config: chooseKernelConfig(info), integerDot };
}

export function describeKernelPlan(plan: KernelPlan): string[] {
  return [
    `kernels: ${plan.config.why}`,
    `GEMV path: ${plan.integerDot.on ? "integer dot product" : "float"} (integer dot product ${plan.integerDot.on ? "on" : "off"}: ${plan.integerDot.reason})`,
  ];
}
