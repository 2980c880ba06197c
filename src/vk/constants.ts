/** The Vulkan constants vkmoe needs, by hand from vulkan_core.h. */

export const VK_SUCCESS = 0;
export const VK_NOT_READY = 1;
export const VK_TIMEOUT = 2;
export const VK_INCOMPLETE = 5;
export const VK_ERROR_OUT_OF_HOST_MEMORY = -1;
export const VK_ERROR_OUT_OF_DEVICE_MEMORY = -2;
export const VK_ERROR_INITIALIZATION_FAILED = -3;
export const VK_ERROR_DEVICE_LOST = -4;
export const VK_ERROR_INCOMPATIBLE_DRIVER = -9;

export const RESULT_NAMES: Record<number, string> = {
  0: "VK_SUCCESS",
  1: "VK_NOT_READY",
  2: "VK_TIMEOUT",
  3: "VK_EVENT_SET",
  4: "VK_EVENT_RESET",
  5: "VK_INCOMPLETE",
  [-1]: "VK_ERROR_OUT_OF_HOST_MEMORY",
  [-2]: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
  [-3]: "VK_ERROR_INITIALIZATION_FAILED",
  [-4]: "VK_ERROR_DEVICE_LOST",
  [-5]: "VK_ERROR_MEMORY_MAP_FAILED",
  [-6]: "VK_ERROR_LAYER_NOT_PRESENT",
  [-7]: "VK_ERROR_EXTENSION_NOT_PRESENT",
  [-8]: "VK_ERROR_FEATURE_NOT_PRESENT",
  [-9]: "VK_ERROR_INCOMPATIBLE_DRIVER",
  [-10]: "VK_ERROR_TOO_MANY_OBJECTS",
  [-11]: "VK_ERROR_FORMAT_NOT_SUPPORTED",
  [-12]: "VK_ERROR_FRAGMENTED_POOL",
  [-13]: "VK_ERROR_UNKNOWN",
  [-1000069000]: "VK_ERROR_OUT_OF_POOL_MEMORY",
  [-1000072003]: "VK_ERROR_INVALID_EXTERNAL_HANDLE",
  [-1000161000]: "VK_ERROR_FRAGMENTATION",
  [-1000257000]: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS",
  [-1000012000]: "VK_ERROR_INVALID_SHADER_NV",
};

export const makeApiVersion = (major: number, minor: number, patch: number) =>
  ((major << 22) | (minor << 12) | patch) >>> 0;
export const VK_API_VERSION_1_2 = makeApiVersion(1, 2, 0);
export const VK_API_VERSION_1_3 = makeApiVersion(1, 3, 0);
export const formatApiVersion = (v: number) => `${v >>> 22}.${(v >>> 12) & 0x3ff}.${v & 0xfff}`;

export const PhysicalDeviceType = { OTHER: 0, INTEGRATED_GPU: 1, DISCRETE_GPU: 2, VIRTUAL_GPU: 3, CPU: 4 } as const;
export const DEVICE_TYPE_NAMES = ["other", "integrated", "discrete", "virtual", "cpu"] as const;

export const VK_QUEUE_GRAPHICS_BIT = 0x1;
export const VK_QUEUE_COMPUTE_BIT = 0x2;
export const VK_QUEUE_TRANSFER_BIT = 0x4;

export const VK_MEMORY_HEAP_DEVICE_LOCAL_BIT = 0x1;
export const VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT = 0x1;
export const VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT = 0x2;
export const VK_MEMORY_PROPERTY_HOST_COHERENT_BIT = 0x4;
export const VK_MEMORY_PROPERTY_HOST_CACHED_BIT = 0x8;

export const VK_BUFFER_USAGE_TRANSFER_SRC_BIT = 0x1;
export const VK_BUFFER_USAGE_TRANSFER_DST_BIT = 0x2;
export const VK_BUFFER_USAGE_STORAGE_BUFFER_BIT = 0x20;
export const VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT = 0x100;
export const VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT = 0x20000;
export const VK_SHARING_MODE_EXCLUSIVE = 0;
export const VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT = 0x2;

export const VK_SHADER_STAGE_COMPUTE_BIT = 0x20;
export const VK_PIPELINE_BIND_POINT_COMPUTE = 1;
export const VK_DESCRIPTOR_TYPE_STORAGE_BUFFER = 7;
export const VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT = 0x1;

export const VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT = 0x2;
export const VK_COMMAND_BUFFER_LEVEL_PRIMARY = 0;
export const VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT = 0x1;
export const VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT = 0x4;

export const VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT = 0x1;
export const VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT = 0x2;
export const VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT = 0x800;
export const VK_PIPELINE_STAGE_TRANSFER_BIT = 0x1000;
export const VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT = 0x2000;
export const VK_PIPELINE_STAGE_HOST_BIT = 0x4000;
export const VK_ACCESS_SHADER_READ_BIT = 0x20;
export const VK_ACCESS_SHADER_WRITE_BIT = 0x40;
export const VK_ACCESS_TRANSFER_READ_BIT = 0x800;
export const VK_ACCESS_TRANSFER_WRITE_BIT = 0x1000;
export const VK_ACCESS_HOST_READ_BIT = 0x2000;
export const VK_ACCESS_HOST_WRITE_BIT = 0x4000;

export const VK_FENCE_CREATE_SIGNALED_BIT = 0x1;
export const VK_SEMAPHORE_TYPE_TIMELINE = 1;
export const VK_QUERY_TYPE_TIMESTAMP = 2;
export const VK_QUERY_RESULT_64_BIT = 0x1;
export const VK_QUERY_RESULT_WAIT_BIT = 0x2;

export const VK_DEBUG_UTILS_MESSAGE_SEVERITY_VERBOSE_BIT_EXT = 0x1;
export const VK_DEBUG_UTILS_MESSAGE_SEVERITY_INFO_BIT_EXT = 0x10;
export const VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT = 0x100;
export const VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT = 0x1000;
export const VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT = 0x1;
export const VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT = 0x2;
export const VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT = 0x4;
export const VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT = 4;

export const VK_SUBGROUP_FEATURE_BASIC_BIT = 0x1;
export const VK_SUBGROUP_FEATURE_ARITHMETIC_BIT = 0x4;
export const VK_SUBGROUP_FEATURE_SHUFFLE_BIT = 0x10;

export const VK_WHOLE_SIZE = (1n << 64n) - 1n;
export const VK_QUEUE_FAMILY_IGNORED = 0xffffffff;
export const VK_UUID_SIZE = 16;

export const DRIVER_ID_NAMES: Record<number, string> = {
  1: "AMD proprietary", 2: "AMD open-source (AMDVLK)", 3: "RADV", 4: "NVIDIA proprietary",
  5: "Intel proprietary Windows", 6: "Intel open-source (ANV)", 7: "Imagination proprietary",
  8: "Qualcomm proprietary", 9: "ARM proprietary", 10: "Google SwiftShader", 11: "GGP proprietary",
  12: "Broadcom proprietary", 13: "Mesa llvmpipe (Lavapipe)", 14: "MoltenVK", 15: "Mesa Turnip",
  16: "Mesa v3dv", 17: "Mesa Panfrost", 18: "Samsung proprietary", 19: "Mesa Venus", 20: "Mesa Dozen",
  21: "Mesa NVK", 22: "Imagination open-source", 23: "Mesa Honeykrisp",
};

export const VENDOR_NAMES: Record<number, string> = {
  0x1002: "AMD", 0x10de: "NVIDIA", 0x8086: "Intel", 0x13b5: "ARM", 0x5143: "Qualcomm",
  0x1010: "Imagination", 0x106b: "Apple", 0x10005: "Mesa",
};
