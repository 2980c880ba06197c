import { VkmoeError } from "../errors.ts";
import { RESULT_NAMES, VK_ERROR_DEVICE_LOST, VK_ERROR_OUT_OF_DEVICE_MEMORY, VK_ERROR_OUT_OF_HOST_MEMORY } from "./constants.ts";

export const resultName = (r: number) => RESULT_NAMES[r] ?? `VkResult(${r})`;

/** A Vulkan call returned an error. Carries the function and the result's name. */
export class VulkanError extends VkmoeError {
  readonly fn: string;
  readonly result: number;
  readonly resultName: string;
  constructor(fn: string, result: number, code = "VULKAN") {
    super(code, `${fn} failed: ${resultName(result)}`);
    this.fn = fn;
    this.result = result;
    this.resultName = resultName(result);
  }
}
/** VK_ERROR_OUT_OF_DEVICE_MEMORY or VK_ERROR_OUT_OF_HOST_MEMORY: callers may evict and retry. */
export class OutOfMemoryError extends VulkanError {
  constructor(fn: string, result: number) {
    super(fn, result, "OUT_OF_MEMORY");
  }
  get device(): boolean {
    return this.result === VK_ERROR_OUT_OF_DEVICE_MEMORY;
  }
}
/** VK_ERROR_DEVICE_LOST: the device is gone for good; fall back to the CPU. */
export class DeviceLostError extends VulkanError {
  constructor(fn: string) {
    super(fn, VK_ERROR_DEVICE_LOST, "DEVICE_LOST");
  }
}

export function vulkanError(fn: string, result: number): VulkanError {
  if (result === VK_ERROR_OUT_OF_DEVICE_MEMORY || result === VK_ERROR_OUT_OF_HOST_MEMORY) return new OutOfMemoryError(fn, result);
  if (result === VK_ERROR_DEVICE_LOST) return new DeviceLostError(fn);
  return new VulkanError(fn, result);
}

/** Throws the typed error for any negative VkResult; returns non-negative ones (VK_TIMEOUT, VK_NOT_READY...). */
export function check(fn: string, result: number): number {
  if (result < 0) throw vulkanError(fn, result);
  return result;
}

/** The Vulkan loader library could not be opened. */
export class NoLoaderError extends VkmoeError {
  readonly tried: readonly string[];
  constructor(tried: readonly string[]) {
    super("NO_LOADER", `no Vulkan loader: tried\n  ${tried.join("\n  ")}\n(set VKMOE_LOADER to the path of libvulkan)`);
    this.tried = tried;
  }
}
/** A loader, but no physical device that can run vkmoe (or VKMOE_DEVICE matched none). */
export class NoDeviceError extends VkmoeError {
  constructor(message: string) {
    super("NO_DEVICE", `no usable Vulkan device: ${message}`);
  }
}
/** A SPIR-V file missing, unreadable or malformed. Raised before pipeline creation sees it. */
export class ShaderFileError extends VkmoeError {
  readonly path: string;
  constructor(path: string, why: string) {
    super("SHADER_FILE", `shader ${path}: ${why}`);
    this.path = path;
  }
}
