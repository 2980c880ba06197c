import { ffi, NativeArena, type NativeCallback, type NativeFn } from "../ffi/index.ts";
import {
  VK_API_VERSION_1_2, VK_ERROR_INCOMPATIBLE_DRIVER, VK_API_VERSION_1_3,
  VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT, VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT,
  VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT, VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
  VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT, VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT,
} from "./constants.ts";
import { check, NoDeviceError, VulkanError } from "./errors.ts";
import { openLoader, extensionSignatures, type CoreCommands, type Loader } from "./loader.ts";
import { enumerate } from "./enumerate.ts";
import {
  VkApplicationInfo, VkDebugUtilsMessengerCallbackDataEXT, VkDebugUtilsMessengerCreateInfoEXT,
  VkExtensionProperties, VkInstanceCreateInfo, VkLayerProperties, VkValidationFeaturesEXT,
} from "./structs.ts";
import { queryPhysicalDevice, type CooperativeMatrixQuery, type PhysicalDeviceInfo } from "./physical.ts";

export const VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation";

export interface ValidationMessage {
  severity: "warning" | "error";
  idName: string;
  message: string;
}

export interface InstanceOptions {
  /** Enable VK_LAYER_KHRONOS_validation with a debug messenger. Throws if the layer is not installed. */
  validation?: boolean;
  /** Also enable synchronization validation (slower). */
  syncValidation?: boolean;
  /** Path of the Vulkan loader (VKMOE_LOADER); default: the platform's names. */
  loaderPath?: string;
  /** Called for every validation warning or error; by default they are collected in `messages`. */
  onMessage?: (m: ValidationMessage) => void;
}

/** A VkInstance plus the loader it came from. Destroy with `using` or dispose(). */
export class Instance implements Disposable {
  readonly loader: Loader;
  readonly vk: CoreCommands;
  readonly handle: bigint;
  readonly apiVersion: number;
  readonly validation: boolean;
  /** Validation messages seen so far (when no onMessage was given). */
  readonly messages: ValidationMessage[] = [];
  private readonly arena = new NativeArena(64 << 10);
  private messenger = 0n;
  private callback: NativeCallback | undefined;
  private destroyMessenger: NativeFn | undefined;
  private disposed = false;

  constructor(options: InstanceOptions = {}) {
    this.loader = openLoader(options.loaderPath);
    this.vk = this.loader.vk;
    const vk = this.vk;
    this.validation = options.validation ?? false;
    this.apiVersion = this.loader.version >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_2;
    const a = this.arena;
    using _ = a.scope();

    const layers = this.validation ? [VALIDATION_LAYER] : [];
    const available = instanceExtensions(vk, a);
    const extensions: string[] = [];
    if (this.validation) {
      const haveLayers = enumerate(a, VkLayerProperties, (n, p) => vk.vkEnumerateInstanceLayerProperties(n, p), "vkEnumerateInstanceLayerProperties")
        .map((l) => l.layerName as string);
      if (!haveLayers.includes(VALIDATION_LAYER)) {
        throw new VulkanError(`vkCreateInstance (${VALIDATION_LAYER} requested but not installed)`, -6);
      }
      extensions.push("VK_EXT_debug_utils");
      // Provided by the validation layer; needed for the VkValidationFeaturesEXT in pNext.
      if (options.syncValidation) extensions.push("VK_EXT_validation_features");
    }
    const portability = available.includes("VK_KHR_portability_enumeration");
    if (portability) extensions.push("VK_KHR_portability_enumeration");

    const sink = options.onMessage ?? ((m: ValidationMessage) => void this.messages.push(m));
    let pNext = 0n;
    let messengerInfoAddress = 0n;
    if (this.validation) {
      this.callback = ffi.callback({ args: ["u32", "u32", "ptr", "ptr"], returns: "u32" }, (severity, _types, pData) => {
        const data = VkDebugUtilsMessengerCallbackDataEXT.read(new DataView(ffi.view(BigInt(pData), VkDebugUtilsMessengerCallbackDataEXT.size)), 0);
        sink({
          severity: Number(severity) >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? "error" : "warning",
          idName: ffi.cString(data.pMessageIdName as bigint),
          message: ffi.cString(data.pMessage as bigint),
        });
        return 0;
      });
      const messengerInfo = a.alloc(VkDebugUtilsMessengerCreateInfoEXT.size);
      VkDebugUtilsMessengerCreateInfoEXT.write(a.view, messengerInfo, {
        messageSeverity: VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        messageType: VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        pfnUserCallback: this.callback.address,
      });
      messengerInfoAddress = pNext = a.address(messengerInfo);
      if (options.syncValidation) {
        const enables = a.alloc(4, 4);
        a.view.setUint32(enables, VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT, true);
        const features = a.alloc(VkValidationFeaturesEXT.size);
        VkValidationFeaturesEXT.write(a.view, features, { pNext, enabledValidationFeatureCount: 1, pEnabledValidationFeatures: a.address(enables) });
        pNext = a.address(features);
      }
    }

    const app = a.alloc(VkApplicationInfo.size);
    VkApplicationInfo.write(a.view, app, {
      pApplicationName: a.cString("vkmoe"),
      pEngineName: a.cString("vkmoe"),
      apiVersion: this.apiVersion,
    });
    const info = a.alloc(VkInstanceCreateInfo.size);
    VkInstanceCreateInfo.write(a.view, info, {
      pNext,
      flags: portability ? 0x1 : 0,
      pApplicationInfo: a.address(app),
      enabledLayerCount: layers.length,
      ppEnabledLayerNames: stringArray(a, layers),
      enabledExtensionCount: extensions.length,
      ppEnabledExtensionNames: stringArray(a, extensions),
    });
    const out = a.alloc(8);
    try {
      const result = vk.vkCreateInstance(a.address(info), 0n, a.address(out));
      if (result === VK_ERROR_INCOMPATIBLE_DRIVER) {
        throw new NoDeviceError(`vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER (the loader at ${this.loader.path} found no driver; check the ICD files / VK_DRIVER_FILES)`);
      }
      check("vkCreateInstance", result);
    } catch (e) {
      this.callback?.close();
      this.arena[Symbol.dispose]();
      throw e;
    }
    this.handle = a.view.getBigUint64(out, true);

    if (this.validation) {
      const create = this.proc("vkCreateDebugUtilsMessengerEXT", extensionSignatures.vkCreateDebugUtilsMessengerEXT);
      this.destroyMessenger = this.proc("vkDestroyDebugUtilsMessengerEXT", extensionSignatures.vkDestroyDebugUtilsMessengerEXT);
      const handleOut = a.alloc(8);
      check("vkCreateDebugUtilsMessengerEXT", create(this.handle, messengerInfoAddress, 0n, a.address(handleOut)));
      this.messenger = a.view.getBigUint64(handleOut, true);
    }
  }

  /** An instance-level function pointer (setup-time only). */
  proc(name: string, signature: (typeof extensionSignatures)[keyof typeof extensionSignatures]): NativeFn {
    using _ = this.arena.scope();
    const address = this.vk.vkGetInstanceProcAddr(this.handle, this.arena.cString(name)) as bigint;
    if (!address) throw new VulkanError(`vkGetInstanceProcAddr(${name})`, -7);
    return ffi.fnPointer(address, signature);
  }

  /** Every physical device with the facts vkmoe uses; throws NoDeviceError if there is none. */
  physicalDevices(): PhysicalDeviceInfo[] {
    const a = this.arena;
    using _ = a.scope();
    const count = a.alloc(4, 4);
    check("vkEnumeratePhysicalDevices", this.vk.vkEnumeratePhysicalDevices(this.handle, a.address(count), 0n));
    const n = a.view.getUint32(count, true);
    if (n === 0) throw new NoDeviceError("the loader found no physical device (check the ICD files / VK_DRIVER_FILES)");
    const handles = a.alloc(8 * n);
    check("vkEnumeratePhysicalDevices", this.vk.vkEnumeratePhysicalDevices(this.handle, a.address(count), a.address(handles)));
    const got = a.view.getUint32(count, true);
    const instanceProc = (name: CooperativeMatrixQuery) => {
      try {
        return this.proc(name, extensionSignatures[name]);
      } catch {
        return undefined;  // the loader has no such command: the device is taken without the extension
      }
    };
    return Array.from({ length: got }, (_, i) => queryPhysicalDevice(this.vk, a.view.getBigUint64(handles + 8 * i, true), i, instanceProc));
  }

  /** Moves and returns the collected validation messages. */
  takeMessages(): ValidationMessage[] {
    return this.messages.splice(0);
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    if (this.messenger) this.destroyMessenger!(this.handle, this.messenger, 0n);
    this.vk.vkDestroyInstance(this.handle, 0n);
    this.callback?.close();
    this.arena[Symbol.dispose]();
  }
}

function instanceExtensions(vk: CoreCommands, a: NativeArena): string[] {
  return enumerate(a, VkExtensionProperties, (n, p) => vk.vkEnumerateInstanceExtensionProperties(0n, n, p), "vkEnumerateInstanceExtensionProperties")
    .map((e) => e.extensionName as string);
}

/** An array of C string pointers in the arena (0n for an empty list). */
export function stringArray(a: NativeArena, items: readonly string[]): bigint {
  if (items.length === 0) return 0n;
  const ptrs = items.map((s) => a.cString(s));
  const at = a.alloc(8 * items.length);
  ptrs.forEach((p, i) => a.view.setBigUint64(at + 8 * i, p, true));
  return a.address(at);
}
