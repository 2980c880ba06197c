/**
 * libvulkan, opened through the FFI seam. Core commands (1.0-1.2) are bound as loader exports: in
 * Deno a call through a runtime function pointer costs ~1.2 us, an export ~9 ns, so everything on
 * the dispatch path must be here. Extension commands come from vkGet*ProcAddr (setup only).
 */
import { ffi, LibraryNotFoundError, type FnSignature, type NativeFn } from "../ffi/index.ts";
import { readEnv } from "../env.ts";
import { NoLoaderError } from "./errors.ts";

const fn = (args: FnSignature["args"], returns: FnSignature["returns"] = "i32"): FnSignature => ({ args, returns });
const P = "ptr", U32 = "u32", U64 = "u64", V = "void";

export const coreSymbols = {
  vkEnumerateInstanceVersion: fn([P]),
  vkEnumerateInstanceLayerProperties: fn([P, P]),
  vkEnumerateInstanceExtensionProperties: fn([P, P, P]),
  vkCreateInstance: fn([P, P, P]),
  vkDestroyInstance: fn([P, P], V),
  vkGetInstanceProcAddr: fn([P, P], P),
  vkGetDeviceProcAddr: fn([P, P], P),
  vkEnumeratePhysicalDevices: fn([P, P, P]),
  vkGetPhysicalDeviceProperties2: fn([P, P], V),
  vkGetPhysicalDeviceFeatures2: fn([P, P], V),
  vkGetPhysicalDeviceMemoryProperties2: fn([P, P], V),
  vkGetPhysicalDeviceQueueFamilyProperties: fn([P, P, P], V),
  vkEnumerateDeviceExtensionProperties: fn([P, P, P, P]),
  vkCreateDevice: fn([P, P, P, P]),
  vkDestroyDevice: fn([P, P], V),
  vkGetDeviceQueue: fn([P, U32, U32, P], V),
  vkDeviceWaitIdle: fn([P]),
  vkCreateBuffer: fn([P, P, P, P]),
  vkDestroyBuffer: fn([P, U64, P], V),
  vkGetBufferMemoryRequirements: fn([P, U64, P], V),
  vkAllocateMemory: fn([P, P, P, P]),
  vkFreeMemory: fn([P, U64, P], V),
  vkBindBufferMemory: fn([P, U64, U64, U64]),
  vkMapMemory: fn([P, U64, U64, U64, U32, P]),
  vkUnmapMemory: fn([P, U64], V),
  vkFlushMappedMemoryRanges: fn([P, U32, P]),
  vkInvalidateMappedMemoryRanges: fn([P, U32, P]),
  vkGetBufferDeviceAddress: fn([P, P], U64),
  vkCreateShaderModule: fn([P, P, P, P]),
  vkDestroyShaderModule: fn([P, U64, P], V),
  vkCreatePipelineLayout: fn([P, P, P, P]),
  vkDestroyPipelineLayout: fn([P, U64, P], V),
  vkCreateComputePipelines: fn([P, U64, U32, P, P, P]),
  vkDestroyPipeline: fn([P, U64, P], V),
  vkCreateDescriptorSetLayout: fn([P, P, P, P]),
  vkDestroyDescriptorSetLayout: fn([P, U64, P], V),
  vkCreateDescriptorPool: fn([P, P, P, P]),
  vkDestroyDescriptorPool: fn([P, U64, P], V),
  vkAllocateDescriptorSets: fn([P, P, P]),
  vkUpdateDescriptorSets: fn([P, U32, P, U32, P], V),
  vkCreateCommandPool: fn([P, P, P, P]),
  vkDestroyCommandPool: fn([P, U64, P], V),
  vkAllocateCommandBuffers: fn([P, P, P]),
  vkFreeCommandBuffers: fn([P, U64, U32, P], V),
  vkBeginCommandBuffer: fn([P, P]),
  vkEndCommandBuffer: fn([P]),
  vkCmdBindPipeline: fn([P, U32, U64], V),
  vkCmdBindDescriptorSets: fn([P, U32, U64, U32, U32, P, U32, P], V),
  vkCmdPushConstants: fn([P, U64, U32, U32, U32, P], V),
  vkCmdDispatch: fn([P, U32, U32, U32], V),
  vkCmdDispatchIndirect: fn([P, U64, U64], V),
  vkCmdPipelineBarrier: fn([P, U32, U32, U32, U32, P, U32, P, U32, P], V),
  vkCmdCopyBuffer: fn([P, U64, U64, U32, P], V),
  vkCmdFillBuffer: fn([P, U64, U64, U64, U32], V),
  vkCmdResetQueryPool: fn([P, U64, U32, U32], V),
  vkCmdWriteTimestamp: fn([P, U32, U64, U32], V),
  vkCreateQueryPool: fn([P, P, P, P]),
  vkDestroyQueryPool: fn([P, U64, P], V),
  vkGetQueryPoolResults: fn([P, U64, U32, U32, U64, P, U64, U32]),
  vkQueueSubmit: fn([P, U32, P, U64]),
  vkQueueWaitIdle: fn([P]),
  vkCreateFence: fn([P, P, P, P]),
  vkDestroyFence: fn([P, U64, P], V),
  vkResetFences: fn([P, U32, P]),
  vkGetFenceStatus: fn([P, U64]),
  vkWaitForFences: fn([P, U32, P, U32, U64]),
  /** The same wait off the JS thread in Deno (event loop stays free); a plain call in Bun. */
  vkWaitForFencesAsync: { args: [P, U32, P, U32, U64], returns: "i32", nonblocking: true, symbol: "vkWaitForFences" },
  vkCreateSemaphore: fn([P, P, P, P]),
  vkDestroySemaphore: fn([P, U64, P], V),
  vkWaitSemaphores: fn([P, P, U64]),
  vkSignalSemaphore: fn([P, P]),
  vkGetSemaphoreCounterValue: fn([P, U64, P]),
} as const satisfies Record<string, FnSignature>;

export type CoreCommands = { readonly [K in keyof typeof coreSymbols]: NativeFn };

export const extensionSignatures = {
  vkCreateDebugUtilsMessengerEXT: fn([P, P, P, P]),
  vkDestroyDebugUtilsMessengerEXT: fn([P, U64, P], V),
  vkGetPhysicalDeviceCooperativeMatrixPropertiesNV: fn([P, P, P]),
  vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR: fn([P, P, P]),
} as const satisfies Record<string, FnSignature>;

/** Where we look for the loader, unless VKMOE_LOADER names one path (then only that path). */
export function loaderCandidates(override = readEnv("VKMOE_LOADER")): string[] {
  if (override) return [override];
  const os = (globalThis as any).process?.platform ?? (globalThis as any).Deno?.build?.os;
  if (os === "win32" || os === "windows") return ["vulkan-1.dll"];
  if (os === "darwin") return ["libvulkan.1.dylib", "libvulkan.dylib", "libMoltenVK.dylib", "/usr/local/lib/libvulkan.1.dylib"];
  return ["libvulkan.so.1", "libvulkan.so"];
}

export interface Loader extends Disposable {
  readonly path: string;
  readonly vk: CoreCommands;
  /** The loader's own instance-level version (vkEnumerateInstanceVersion). */
  readonly version: number;
}

let shared: { loader: Loader; key: string } | undefined;

/** Opens (or shares) the loader. Throws NoLoaderError naming every path tried. */
export function openLoader(path?: string): Loader {
  const candidates = loaderCandidates(path);
  const key = candidates.join("|");
  if (shared?.key === key) return shared.loader;
  let lib;
  try {
    lib = ffi.open(candidates, coreSymbols);
  } catch (e) {
    if (e instanceof LibraryNotFoundError) throw new NoLoaderError(e.tried);
    throw e;
  }
  const vk = lib.symbols as CoreCommands;
  const block = ffi.allocNative(4);
  vk.vkEnumerateInstanceVersion(block.address);
  const version = new Uint32Array(block.buffer)[0]!;
  ffi.freeNative(block);
  // Shared and never dlclose'd: drivers keep atexit handlers and thread-local state.
  const loader: Loader = { path: lib.path, vk, version, [Symbol.dispose]: () => {} };
  shared = { loader, key };
  return loader;
}

export interface CallCounter {
  /** Calls per Vulkan command since the counter was installed or last reset. */
  readonly counts: Map<string, number>;
  total(): number;
  reset(): void;
}

/**
 * Wraps every core command of `vk` in place with a counter (benchmarks: "FFI calls per layer
 * call"). Every wrapper reads the table at call time, so objects made earlier count too.
 */
const installed = new WeakMap<object, CallCounter>();

export function countCalls(vk: CoreCommands): CallCounter {
  // One counter per table: a second install returns the first while its wrappers are in place
  // (wrapping twice would count into a map nobody reads).
  const table = vk as unknown as Record<string, (...a: unknown[]) => unknown>;
  const existing = installed.get(vk);
  if (existing && Object.keys(coreSymbols).every((n) => (table[n] as any).__counted)) return existing;
  const counts = new Map<string, number>();
  for (const name of Object.keys(coreSymbols)) {
    const inner = table[name]!;
    if ((inner as any).__counted) continue;
    const wrapped = (...a: unknown[]) => {
      counts.set(name, (counts.get(name) ?? 0) + 1);
      return inner(...a);
    };
    (wrapped as any).__counted = true;
    table[name] = wrapped;
  }
  const counter: CallCounter = {
    counts,
    total: () => [...counts.values()].reduce((s, n) => s + n, 0),
    reset: () => counts.clear(),
  };
  installed.set(vk, counter);
  return counter;
}
