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

/**
 * One VkInstance per (loader, validation settings) per process, shared by the contexts open on it
 * and kept after the last one closes, for the next: NVIDIA's 580 driver (H200) answers
 * vkCreateInstance with VK_ERROR_INCOMPATIBLE_DRIVER for good after about 30 create/destroy
 * cycles in one process (measured with a C loop; device create/destroy is fine: 300 cycles), so a
 * host that reopens the backend, or a test suite, must not churn instances. `releaseInstances()`
 * destroys the idle ones. An instance with its own `onMessage` callback is private to its context.
 */
interface SharedInstance {
  instance: Instance;
  users: number;
}
const sharedInstances = new Map<string, SharedInstance>();

function instanceKey(o: InstanceOptions): string {
  return JSON.stringify([o.loaderPath ?? "", o.validation ?? false, o.syncValidation ?? false]);
}

export class VulkanContext implements Disposable {
  readonly instance: Instance;
  readonly devices: PhysicalDeviceInfo[];
  readonly device: Device;
  private readonly shared: SharedInstance | undefined;
  private disposed = false;

  constructor(options: ContextOptions = {}, env: VkmoeEnv = readConfig()) {
    const instanceOptions: InstanceOptions = { validation: options.validation ?? env.VKMOE_VALIDATION, loaderPath: options.loaderPath ?? env.VKMOE_LOADER, ...options };
    if (instanceOptions.onMessage) this.instance = new Instance(instanceOptions);
    else {
      const key = instanceKey(instanceOptions);
      let shared = sharedInstances.get(key);
      if (!shared) sharedInstances.set(key, (shared = { instance: new Instance(instanceOptions), users: 0 }));
      // Messages left from contexts that closed belong to them, not to this one.
      if (shared.users === 0) shared.instance.takeMessages();
      shared.users++;
      this.shared = shared;
      this.instance = shared.instance;
    }
    try {
      this.devices = this.instance.physicalDevices();
      const chosen = selectDevice(this.devices, options.device ?? env.VKMOE_DEVICE);
      this.device = new Device(this.instance, chosen, {
        bufferDeviceAddress: options.bufferDeviceAddress ?? env.VKMOE_BDA,
        integerDotProduct: options.integerDotProduct ?? env.VKMOE_IDP,
        floatAtomics: env.VKMOE_FLOAT_ATOMICS,
        cooperativeMatrix: env.VKMOE_COOPMAT,
        staged: options.staged ?? env.VKMOE_STAGED,
      });
    } catch (e) {
      this.releaseInstance();
      throw e;
    }
  }

  private releaseInstance(): void {
    if (this.shared) this.shared.users--;
    else this.instance[Symbol.dispose]();
  }

  /** Destroys the shared instances no open context uses (the next context creates a new one). */
  static releaseInstances(): void {
    for (const [key, s] of sharedInstances) {
      if (s.users > 0) continue;
      s.instance[Symbol.dispose]();
      sharedInstances.delete(key);
    }
  }

  /** Destroys the device; the instance stays for the next context (see above). */
  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    this.device[Symbol.dispose]();
    this.releaseInstance();
  }
}
