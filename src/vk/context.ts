/** Instance + chosen device + device, opened together from the VKMOE_* configuration and closed together. */
import { readConfig, type VkmoeEnv } from "../config.ts";
import { Device, type DeviceOptions } from "./device.ts";
import { Instance, type InstanceOptions } from "./instance.ts";
import type { PhysicalDeviceInfo } from "./physical.ts";
import { selectDevice } from "./select.ts";

export interface ContextOptions extends InstanceOptions, DeviceOptions {
  /** VKMOE_DEVICE syntax: index, UUID or name substring. */
  device?: string;
}

export class VulkanContext implements Disposable {
  readonly instance: Instance;
  readonly devices: PhysicalDeviceInfo[];
  readonly device: Device;

  constructor(options: ContextOptions = {}, env: VkmoeEnv = readConfig()) {
    this.instance = new Instance({ validation: options.validation ?? env.VKMOE_VALIDATION, loaderPath: options.loaderPath ?? env.VKMOE_LOADER, ...options });
    try {
      this.devices = this.instance.physicalDevices();
      const chosen = selectDevice(this.devices, options.device ?? env.VKMOE_DEVICE);
      this.device = new Device(this.instance, chosen, {
        bufferDeviceAddress: options.bufferDeviceAddress ?? env.VKMOE_BDA,
        integerDotProduct: options.integerDotProduct ?? env.VKMOE_IDP,
        staged: options.staged ?? env.VKMOE_STAGED,
      });
    } catch (e) {
      this.instance[Symbol.dispose]();
      throw e;
    }
  }

  [Symbol.dispose](): void {
    this.device[Symbol.dispose]();
    this.instance[Symbol.dispose]();
  }
}
