/**
 * The Vulkan structs vkmoe uses, declared by hand in vulkan_core.h's field order. Adding one here
 * is enough for test/layout.test.ts to check its size and every offset against the C header, and
 * its sType against vk.xml.
 */
import { array, chars, struct } from "./layout.ts";

export const VkExtent3D = struct("VkExtent3D", {
  width: "u32",
  height: "u32",
  depth: "u32",
});

export const VkApplicationInfo = struct("VkApplicationInfo", {
  sType: "u32",
  pNext: "ptr",
  pApplicationName: "ptr",
  applicationVersion: "u32",
  pEngineName: "ptr",
  engineVersion: "u32",
  apiVersion: "u32",
}, { sType: 0 });

export const VkInstanceCreateInfo = struct("VkInstanceCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  pApplicationInfo: "ptr",
  enabledLayerCount: "u32",
  ppEnabledLayerNames: "ptr",
  enabledExtensionCount: "u32",
  ppEnabledExtensionNames: "ptr",
}, { sType: 1 });

export const VkLayerProperties = struct("VkLayerProperties", {
  layerName: chars(256),
  specVersion: "u32",
  implementationVersion: "u32",
  description: chars(256),
});

export const VkExtensionProperties = struct("VkExtensionProperties", {
  extensionName: chars(256),
  specVersion: "u32",
});

export const VkDebugUtilsMessengerCreateInfoEXT = struct("VkDebugUtilsMessengerCreateInfoEXT", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  messageSeverity: "u32",
  messageType: "u32",
  pfnUserCallback: "ptr",
  pUserData: "ptr",
}, { sType: 1000128004 });

export const VkDebugUtilsMessengerCallbackDataEXT = struct("VkDebugUtilsMessengerCallbackDataEXT", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  pMessageIdName: "ptr",
  messageIdNumber: "i32",
  pMessage: "ptr",
  queueLabelCount: "u32",
  pQueueLabels: "ptr",
  cmdBufLabelCount: "u32",
  pCmdBufLabels: "ptr",
  objectCount: "u32",
  pObjects: "ptr",
}, { sType: 1000128003 });

export const VkValidationFeaturesEXT = struct("VkValidationFeaturesEXT", {
  sType: "u32",
  pNext: "ptr",
  enabledValidationFeatureCount: "u32",
  pEnabledValidationFeatures: "ptr",
  disabledValidationFeatureCount: "u32",
  pDisabledValidationFeatures: "ptr",
}, { sType: 1000247000 });

export const VkPhysicalDeviceLimits = struct("VkPhysicalDeviceLimits", {
  maxImageDimension1D: "u32",
  maxImageDimension2D: "u32",
  maxImageDimension3D: "u32",
  maxImageDimensionCube: "u32",
  maxImageArrayLayers: "u32",
  maxTexelBufferElements: "u32",
  maxUniformBufferRange: "u32",
  maxStorageBufferRange: "u32",
  maxPushConstantsSize: "u32",
  maxMemoryAllocationCount: "u32",
  maxSamplerAllocationCount: "u32",
  bufferImageGranularity: "u64",
  sparseAddressSpaceSize: "u64",
  maxBoundDescriptorSets: "u32",
  maxPerStageDescriptorSamplers: "u32",
  maxPerStageDescriptorUniformBuffers: "u32",
  maxPerStageDescriptorStorageBuffers: "u32",
  maxPerStageDescriptorSampledImages: "u32",
  maxPerStageDescriptorStorageImages: "u32",
  maxPerStageDescriptorInputAttachments: "u32",
  maxPerStageResources: "u32",
  maxDescriptorSetSamplers: "u32",
  maxDescriptorSetUniformBuffers: "u32",
  maxDescriptorSetUniformBuffersDynamic: "u32",
  maxDescriptorSetStorageBuffers: "u32",
  maxDescriptorSetStorageBuffersDynamic: "u32",
  maxDescriptorSetSampledImages: "u32",
  maxDescriptorSetStorageImages: "u32",
  maxDescriptorSetInputAttachments: "u32",
  maxVertexInputAttributes: "u32",
  maxVertexInputBindings: "u32",
  maxVertexInputAttributeOffset: "u32",
  maxVertexInputBindingStride: "u32",
  maxVertexOutputComponents: "u32",
  maxTessellationGenerationLevel: "u32",
  maxTessellationPatchSize: "u32",
  maxTessellationControlPerVertexInputComponents: "u32",
  maxTessellationControlPerVertexOutputComponents: "u32",
  maxTessellationControlPerPatchOutputComponents: "u32",
  maxTessellationControlTotalOutputComponents: "u32",
  maxTessellationEvaluationInputComponents: "u32",
  maxTessellationEvaluationOutputComponents: "u32",
  maxGeometryShaderInvocations: "u32",
  maxGeometryInputComponents: "u32",
  maxGeometryOutputComponents: "u32",
  maxGeometryOutputVertices: "u32",
  maxGeometryTotalOutputComponents: "u32",
  maxFragmentInputComponents: "u32",
  maxFragmentOutputAttachments: "u32",
  maxFragmentDualSrcAttachments: "u32",
  maxFragmentCombinedOutputResources: "u32",
  maxComputeSharedMemorySize: "u32",
  maxComputeWorkGroupCount: array("u32", 3),
  maxComputeWorkGroupInvocations: "u32",
  maxComputeWorkGroupSize: array("u32", 3),
  subPixelPrecisionBits: "u32",
  subTexelPrecisionBits: "u32",
  mipmapPrecisionBits: "u32",
  maxDrawIndexedIndexValue: "u32",
  maxDrawIndirectCount: "u32",
  maxSamplerLodBias: "f32",
  maxSamplerAnisotropy: "f32",
  maxViewports: "u32",
  maxViewportDimensions: array("u32", 2),
  viewportBoundsRange: array("f32", 2),
  viewportSubPixelBits: "u32",
  minMemoryMapAlignment: "size",
  minTexelBufferOffsetAlignment: "u64",
  minUniformBufferOffsetAlignment: "u64",
  minStorageBufferOffsetAlignment: "u64",
  minTexelOffset: "i32",
  maxTexelOffset: "u32",
  minTexelGatherOffset: "i32",
  maxTexelGatherOffset: "u32",
  minInterpolationOffset: "f32",
  maxInterpolationOffset: "f32",
  subPixelInterpolationOffsetBits: "u32",
  maxFramebufferWidth: "u32",
  maxFramebufferHeight: "u32",
  maxFramebufferLayers: "u32",
  framebufferColorSampleCounts: "u32",
  framebufferDepthSampleCounts: "u32",
  framebufferStencilSampleCounts: "u32",
  framebufferNoAttachmentsSampleCounts: "u32",
  maxColorAttachments: "u32",
  sampledImageColorSampleCounts: "u32",
  sampledImageIntegerSampleCounts: "u32",
  sampledImageDepthSampleCounts: "u32",
  sampledImageStencilSampleCounts: "u32",
  storageImageSampleCounts: "u32",
  maxSampleMaskWords: "u32",
  timestampComputeAndGraphics: "u32",
  timestampPeriod: "f32",
  maxClipDistances: "u32",
  maxCullDistances: "u32",
  maxCombinedClipAndCullDistances: "u32",
  discreteQueuePriorities: "u32",
  pointSizeRange: array("f32", 2),
  lineWidthRange: array("f32", 2),
  pointSizeGranularity: "f32",
  lineWidthGranularity: "f32",
  strictLines: "u32",
  standardSampleLocations: "u32",
  optimalBufferCopyOffsetAlignment: "u64",
  optimalBufferCopyRowPitchAlignment: "u64",
  nonCoherentAtomSize: "u64",
});

export const VkPhysicalDeviceSparseProperties = struct("VkPhysicalDeviceSparseProperties", {
  residencyStandard2DBlockShape: "u32",
  residencyStandard2DMultisampleBlockShape: "u32",
  residencyStandard3DBlockShape: "u32",
  residencyAlignedMipSize: "u32",
  residencyNonResidentStrict: "u32",
});

export const VkPhysicalDeviceProperties = struct("VkPhysicalDeviceProperties", {
  apiVersion: "u32",
  driverVersion: "u32",
  vendorID: "u32",
  deviceID: "u32",
  deviceType: "u32",
  deviceName: chars(256),
  pipelineCacheUUID: array("u8", 16),
  limits: VkPhysicalDeviceLimits,
  sparseProperties: VkPhysicalDeviceSparseProperties,
});

export const VkPhysicalDeviceProperties2 = struct("VkPhysicalDeviceProperties2", {
  sType: "u32",
  pNext: "ptr",
  properties: VkPhysicalDeviceProperties,
}, { sType: 1000059001 });

export const VkConformanceVersion = struct("VkConformanceVersion", {
  major: "u8",
  minor: "u8",
  subminor: "u8",
  patch: "u8",
});

export const VkPhysicalDeviceDriverProperties = struct("VkPhysicalDeviceDriverProperties", {
  sType: "u32",
  pNext: "ptr",
  driverID: "u32",
  driverName: chars(256),
  driverInfo: chars(256),
  conformanceVersion: VkConformanceVersion,
}, { sType: 1000196000 });

export const VkPhysicalDeviceIDProperties = struct("VkPhysicalDeviceIDProperties", {
  sType: "u32",
  pNext: "ptr",
  deviceUUID: array("u8", 16),
  driverUUID: array("u8", 16),
  deviceLUID: array("u8", 8),
  deviceNodeMask: "u32",
  deviceLUIDValid: "u32",
}, { sType: 1000071004 });

export const VkPhysicalDeviceSubgroupProperties = struct("VkPhysicalDeviceSubgroupProperties", {
  sType: "u32",
  pNext: "ptr",
  subgroupSize: "u32",
  supportedStages: "u32",
  supportedOperations: "u32",
  quadOperationsInAllStages: "u32",
}, { sType: 1000094000 });

export const VkPhysicalDeviceSubgroupSizeControlProperties = struct("VkPhysicalDeviceSubgroupSizeControlProperties", {
  sType: "u32",
  pNext: "ptr",
  minSubgroupSize: "u32",
  maxSubgroupSize: "u32",
  maxComputeWorkgroupSubgroups: "u32",
  requiredSubgroupSizeStages: "u32",
}, { sType: 1000225000 });

export const VkPhysicalDeviceMaintenance3Properties = struct("VkPhysicalDeviceMaintenance3Properties", {
  sType: "u32",
  pNext: "ptr",
  maxPerSetDescriptors: "u32",
  maxMemoryAllocationSize: "u64",
}, { sType: 1000168000 });

export const VkPhysicalDeviceMaintenance4Properties = struct("VkPhysicalDeviceMaintenance4Properties", {
  sType: "u32",
  pNext: "ptr",
  maxBufferSize: "u64",
}, { sType: 1000413001 });

export const VkPhysicalDeviceShaderIntegerDotProductProperties = struct("VkPhysicalDeviceShaderIntegerDotProductProperties", {
  sType: "u32",
  pNext: "ptr",
  integerDotProduct8BitUnsignedAccelerated: "u32",
  integerDotProduct8BitSignedAccelerated: "u32",
  integerDotProduct8BitMixedSignednessAccelerated: "u32",
  integerDotProduct4x8BitPackedUnsignedAccelerated: "u32",
  integerDotProduct4x8BitPackedSignedAccelerated: "u32",
  integerDotProduct4x8BitPackedMixedSignednessAccelerated: "u32",
  integerDotProduct16BitUnsignedAccelerated: "u32",
  integerDotProduct16BitSignedAccelerated: "u32",
  integerDotProduct16BitMixedSignednessAccelerated: "u32",
  integerDotProduct32BitUnsignedAccelerated: "u32",
  integerDotProduct32BitSignedAccelerated: "u32",
  integerDotProduct32BitMixedSignednessAccelerated: "u32",
  integerDotProduct64BitUnsignedAccelerated: "u32",
  integerDotProduct64BitSignedAccelerated: "u32",
  integerDotProduct64BitMixedSignednessAccelerated: "u32",
  integerDotProductAccumulatingSaturating8BitUnsignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating8BitSignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating8BitMixedSignednessAccelerated: "u32",
  integerDotProductAccumulatingSaturating4x8BitPackedUnsignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating4x8BitPackedSignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating4x8BitPackedMixedSignednessAccelerated: "u32",
  integerDotProductAccumulatingSaturating16BitUnsignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating16BitSignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating16BitMixedSignednessAccelerated: "u32",
  integerDotProductAccumulatingSaturating32BitUnsignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating32BitSignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating32BitMixedSignednessAccelerated: "u32",
  integerDotProductAccumulatingSaturating64BitUnsignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating64BitSignedAccelerated: "u32",
  integerDotProductAccumulatingSaturating64BitMixedSignednessAccelerated: "u32",
}, { sType: 1000280001 });

export const VkMemoryType = struct("VkMemoryType", {
  propertyFlags: "u32",
  heapIndex: "u32",
});

export const VkMemoryHeap = struct("VkMemoryHeap", {
  size: "u64",
  flags: "u32",
});

export const VkPhysicalDeviceMemoryProperties = struct("VkPhysicalDeviceMemoryProperties", {
  memoryTypeCount: "u32",
  memoryTypes: array(VkMemoryType, 32),
  memoryHeapCount: "u32",
  memoryHeaps: array(VkMemoryHeap, 16),
});

export const VkPhysicalDeviceMemoryProperties2 = struct("VkPhysicalDeviceMemoryProperties2", {
  sType: "u32",
  pNext: "ptr",
  memoryProperties: VkPhysicalDeviceMemoryProperties,
}, { sType: 1000059006 });

export const VkPhysicalDeviceMemoryBudgetPropertiesEXT = struct("VkPhysicalDeviceMemoryBudgetPropertiesEXT", {
  sType: "u32",
  pNext: "ptr",
  heapBudget: array("u64", 16),
  heapUsage: array("u64", 16),
}, { sType: 1000237000 });

export const VkQueueFamilyProperties = struct("VkQueueFamilyProperties", {
  queueFlags: "u32",
  queueCount: "u32",
  timestampValidBits: "u32",
  minImageTransferGranularity: VkExtent3D,
});

export const VkPhysicalDeviceFeatures = struct("VkPhysicalDeviceFeatures", {
  robustBufferAccess: "u32",
  fullDrawIndexUint32: "u32",
  imageCubeArray: "u32",
  independentBlend: "u32",
  geometryShader: "u32",
  tessellationShader: "u32",
  sampleRateShading: "u32",
  dualSrcBlend: "u32",
  logicOp: "u32",
  multiDrawIndirect: "u32",
  drawIndirectFirstInstance: "u32",
  depthClamp: "u32",
  depthBiasClamp: "u32",
  fillModeNonSolid: "u32",
  depthBounds: "u32",
  wideLines: "u32",
  largePoints: "u32",
  alphaToOne: "u32",
  multiViewport: "u32",
  samplerAnisotropy: "u32",
  textureCompressionETC2: "u32",
  textureCompressionASTC_LDR: "u32",
  textureCompressionBC: "u32",
  occlusionQueryPrecise: "u32",
  pipelineStatisticsQuery: "u32",
  vertexPipelineStoresAndAtomics: "u32",
  fragmentStoresAndAtomics: "u32",
  shaderTessellationAndGeometryPointSize: "u32",
  shaderImageGatherExtended: "u32",
  shaderStorageImageExtendedFormats: "u32",
  shaderStorageImageMultisample: "u32",
  shaderStorageImageReadWithoutFormat: "u32",
  shaderStorageImageWriteWithoutFormat: "u32",
  shaderUniformBufferArrayDynamicIndexing: "u32",
  shaderSampledImageArrayDynamicIndexing: "u32",
  shaderStorageBufferArrayDynamicIndexing: "u32",
  shaderStorageImageArrayDynamicIndexing: "u32",
  shaderClipDistance: "u32",
  shaderCullDistance: "u32",
  shaderFloat64: "u32",
  shaderInt64: "u32",
  shaderInt16: "u32",
  shaderResourceResidency: "u32",
  shaderResourceMinLod: "u32",
  sparseBinding: "u32",
  sparseResidencyBuffer: "u32",
  sparseResidencyImage2D: "u32",
  sparseResidencyImage3D: "u32",
  sparseResidency2Samples: "u32",
  sparseResidency4Samples: "u32",
  sparseResidency8Samples: "u32",
  sparseResidency16Samples: "u32",
  sparseResidencyAliased: "u32",
  variableMultisampleRate: "u32",
  inheritedQueries: "u32",
});

export const VkPhysicalDeviceFeatures2 = struct("VkPhysicalDeviceFeatures2", {
  sType: "u32",
  pNext: "ptr",
  features: VkPhysicalDeviceFeatures,
}, { sType: 1000059000 });

export const VkPhysicalDeviceVulkan11Features = struct("VkPhysicalDeviceVulkan11Features", {
  sType: "u32",
  pNext: "ptr",
  storageBuffer16BitAccess: "u32",
  uniformAndStorageBuffer16BitAccess: "u32",
  storagePushConstant16: "u32",
  storageInputOutput16: "u32",
  multiview: "u32",
  multiviewGeometryShader: "u32",
  multiviewTessellationShader: "u32",
  variablePointersStorageBuffer: "u32",
  variablePointers: "u32",
  protectedMemory: "u32",
  samplerYcbcrConversion: "u32",
  shaderDrawParameters: "u32",
}, { sType: 49 });

export const VkPhysicalDeviceVulkan12Features = struct("VkPhysicalDeviceVulkan12Features", {
  sType: "u32",
  pNext: "ptr",
  samplerMirrorClampToEdge: "u32",
  drawIndirectCount: "u32",
  storageBuffer8BitAccess: "u32",
  uniformAndStorageBuffer8BitAccess: "u32",
  storagePushConstant8: "u32",
  shaderBufferInt64Atomics: "u32",
  shaderSharedInt64Atomics: "u32",
  shaderFloat16: "u32",
  shaderInt8: "u32",
  descriptorIndexing: "u32",
  shaderInputAttachmentArrayDynamicIndexing: "u32",
  shaderUniformTexelBufferArrayDynamicIndexing: "u32",
  shaderStorageTexelBufferArrayDynamicIndexing: "u32",
  shaderUniformBufferArrayNonUniformIndexing: "u32",
  shaderSampledImageArrayNonUniformIndexing: "u32",
  shaderStorageBufferArrayNonUniformIndexing: "u32",
  shaderStorageImageArrayNonUniformIndexing: "u32",
  shaderInputAttachmentArrayNonUniformIndexing: "u32",
  shaderUniformTexelBufferArrayNonUniformIndexing: "u32",
  shaderStorageTexelBufferArrayNonUniformIndexing: "u32",
  descriptorBindingUniformBufferUpdateAfterBind: "u32",
  descriptorBindingSampledImageUpdateAfterBind: "u32",
  descriptorBindingStorageImageUpdateAfterBind: "u32",
  descriptorBindingStorageBufferUpdateAfterBind: "u32",
  descriptorBindingUniformTexelBufferUpdateAfterBind: "u32",
  descriptorBindingStorageTexelBufferUpdateAfterBind: "u32",
  descriptorBindingUpdateUnusedWhilePending: "u32",
  descriptorBindingPartiallyBound: "u32",
  descriptorBindingVariableDescriptorCount: "u32",
  runtimeDescriptorArray: "u32",
  samplerFilterMinmax: "u32",
  scalarBlockLayout: "u32",
  imagelessFramebuffer: "u32",
  uniformBufferStandardLayout: "u32",
  shaderSubgroupExtendedTypes: "u32",
  separateDepthStencilLayouts: "u32",
  hostQueryReset: "u32",
  timelineSemaphore: "u32",
  bufferDeviceAddress: "u32",
  bufferDeviceAddressCaptureReplay: "u32",
  bufferDeviceAddressMultiDevice: "u32",
  vulkanMemoryModel: "u32",
  vulkanMemoryModelDeviceScope: "u32",
  vulkanMemoryModelAvailabilityVisibilityChains: "u32",
  shaderOutputViewportIndex: "u32",
  shaderOutputLayer: "u32",
  subgroupBroadcastDynamicId: "u32",
}, { sType: 51 });

export const VkPhysicalDeviceShaderIntegerDotProductFeatures = struct("VkPhysicalDeviceShaderIntegerDotProductFeatures", {
  sType: "u32",
  pNext: "ptr",
  shaderIntegerDotProduct: "u32",
}, { sType: 1000280000 });

export const VkPhysicalDeviceSubgroupSizeControlFeatures = struct("VkPhysicalDeviceSubgroupSizeControlFeatures", {
  sType: "u32",
  pNext: "ptr",
  subgroupSizeControl: "u32",
  computeFullSubgroups: "u32",
}, { sType: 1000225002 });

export const VkPhysicalDeviceMemoryPriorityFeaturesEXT = struct("VkPhysicalDeviceMemoryPriorityFeaturesEXT", {
  sType: "u32",
  pNext: "ptr",
  memoryPriority: "u32",
}, { sType: 1000238000 });

export const VkPhysicalDeviceShaderAtomicFloatFeaturesEXT = struct("VkPhysicalDeviceShaderAtomicFloatFeaturesEXT", {
  sType: "u32",
  pNext: "ptr",
  shaderBufferFloat32Atomics: "u32",
  shaderBufferFloat32AtomicAdd: "u32",
  shaderBufferFloat64Atomics: "u32",
  shaderBufferFloat64AtomicAdd: "u32",
  shaderSharedFloat32Atomics: "u32",
  shaderSharedFloat32AtomicAdd: "u32",
  shaderSharedFloat64Atomics: "u32",
  shaderSharedFloat64AtomicAdd: "u32",
  shaderImageFloat32Atomics: "u32",
  shaderImageFloat32AtomicAdd: "u32",
  sparseImageFloat32Atomics: "u32",
  sparseImageFloat32AtomicAdd: "u32",
}, { sType: 1000260000 });

/** VK_NV_cooperative_matrix: the matrix-core GEMM (glslang 12 emits only the NV extension's SPIR-V). */
export const VkPhysicalDeviceCooperativeMatrixFeaturesNV = struct("VkPhysicalDeviceCooperativeMatrixFeaturesNV", {
  sType: "u32",
  pNext: "ptr",
  cooperativeMatrix: "u32",
  cooperativeMatrixRobustBufferAccess: "u32",
}, { sType: 1000249000 });

export const VkCooperativeMatrixPropertiesNV = struct("VkCooperativeMatrixPropertiesNV", {
  sType: "u32",
  pNext: "ptr",
  MSize: "u32",
  NSize: "u32",
  KSize: "u32",
  AType: "u32",
  BType: "u32",
  CType: "u32",
  DType: "u32",
  scope: "u32",
}, { sType: 1000249001 });

/** VK_KHR_cooperative_matrix (AMD's drivers, and NVIDIA's beside the NV one): the same GEMM, its SPIR-V rewritten from the NV build. */
export const VkPhysicalDeviceCooperativeMatrixFeaturesKHR = struct("VkPhysicalDeviceCooperativeMatrixFeaturesKHR", {
  sType: "u32",
  pNext: "ptr",
  cooperativeMatrix: "u32",
  cooperativeMatrixRobustBufferAccess: "u32",
}, { sType: 1000506000 });

export const VkCooperativeMatrixPropertiesKHR = struct("VkCooperativeMatrixPropertiesKHR", {
  sType: "u32",
  pNext: "ptr",
  MSize: "u32",
  NSize: "u32",
  KSize: "u32",
  AType: "u32",
  BType: "u32",
  CType: "u32",
  ResultType: "u32",
  saturatingAccumulation: "u32",
  scope: "u32",
}, { sType: 1000506001 });

export const VkDeviceQueueCreateInfo = struct("VkDeviceQueueCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  queueFamilyIndex: "u32",
  queueCount: "u32",
  pQueuePriorities: "ptr",
}, { sType: 2 });

export const VkDeviceCreateInfo = struct("VkDeviceCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  queueCreateInfoCount: "u32",
  pQueueCreateInfos: "ptr",
  enabledLayerCount: "u32",
  ppEnabledLayerNames: "ptr",
  enabledExtensionCount: "u32",
  ppEnabledExtensionNames: "ptr",
  pEnabledFeatures: "ptr",
}, { sType: 3 });

export const VkBufferCreateInfo = struct("VkBufferCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  size: "u64",
  usage: "u32",
  sharingMode: "u32",
  queueFamilyIndexCount: "u32",
  pQueueFamilyIndices: "ptr",
}, { sType: 12 });

export const VkMemoryRequirements = struct("VkMemoryRequirements", {
  size: "u64",
  alignment: "u64",
  memoryTypeBits: "u32",
});

export const VkMemoryAllocateInfo = struct("VkMemoryAllocateInfo", {
  sType: "u32",
  pNext: "ptr",
  allocationSize: "u64",
  memoryTypeIndex: "u32",
}, { sType: 5 });

export const VkMemoryAllocateFlagsInfo = struct("VkMemoryAllocateFlagsInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  deviceMask: "u32",
}, { sType: 1000060000 });

export const VkMemoryPriorityAllocateInfoEXT = struct("VkMemoryPriorityAllocateInfoEXT", {
  sType: "u32",
  pNext: "ptr",
  priority: "f32",
}, { sType: 1000238001 });

export const VkBufferDeviceAddressInfo = struct("VkBufferDeviceAddressInfo", {
  sType: "u32",
  pNext: "ptr",
  buffer: "u64",
}, { sType: 1000244001 });

export const VkMappedMemoryRange = struct("VkMappedMemoryRange", {
  sType: "u32",
  pNext: "ptr",
  memory: "u64",
  offset: "u64",
  size: "u64",
}, { sType: 6 });

export const VkShaderModuleCreateInfo = struct("VkShaderModuleCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  codeSize: "size",
  pCode: "ptr",
}, { sType: 16 });

export const VkSpecializationMapEntry = struct("VkSpecializationMapEntry", {
  constantID: "u32",
  offset: "u32",
  size: "size",
});

export const VkSpecializationInfo = struct("VkSpecializationInfo", {
  mapEntryCount: "u32",
  pMapEntries: "ptr",
  dataSize: "size",
  pData: "ptr",
});

export const VkPipelineShaderStageCreateInfo = struct("VkPipelineShaderStageCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  stage: "u32",
  module: "u64",
  pName: "ptr",
  pSpecializationInfo: "ptr",
}, { sType: 18 });

export const VkComputePipelineCreateInfo = struct("VkComputePipelineCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  stage: VkPipelineShaderStageCreateInfo,
  layout: "u64",
  basePipelineHandle: "u64",
  basePipelineIndex: "i32",
}, { sType: 29 });

export const VkPushConstantRange = struct("VkPushConstantRange", {
  stageFlags: "u32",
  offset: "u32",
  size: "u32",
});

export const VkPipelineLayoutCreateInfo = struct("VkPipelineLayoutCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  setLayoutCount: "u32",
  pSetLayouts: "ptr",
  pushConstantRangeCount: "u32",
  pPushConstantRanges: "ptr",
}, { sType: 30 });

export const VkPipelineShaderStageRequiredSubgroupSizeCreateInfo = struct("VkPipelineShaderStageRequiredSubgroupSizeCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  requiredSubgroupSize: "u32",
}, { sType: 1000225001 });

export const VkDescriptorSetLayoutBinding = struct("VkDescriptorSetLayoutBinding", {
  binding: "u32",
  descriptorType: "u32",
  descriptorCount: "u32",
  stageFlags: "u32",
  pImmutableSamplers: "ptr",
});

export const VkDescriptorSetLayoutCreateInfo = struct("VkDescriptorSetLayoutCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  bindingCount: "u32",
  pBindings: "ptr",
}, { sType: 32 });

export const VkDescriptorPoolSize = struct("VkDescriptorPoolSize", {
  type: "u32",
  descriptorCount: "u32",
});

export const VkDescriptorPoolCreateInfo = struct("VkDescriptorPoolCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  maxSets: "u32",
  poolSizeCount: "u32",
  pPoolSizes: "ptr",
}, { sType: 33 });

export const VkDescriptorSetAllocateInfo = struct("VkDescriptorSetAllocateInfo", {
  sType: "u32",
  pNext: "ptr",
  descriptorPool: "u64",
  descriptorSetCount: "u32",
  pSetLayouts: "ptr",
}, { sType: 34 });

export const VkDescriptorBufferInfo = struct("VkDescriptorBufferInfo", {
  buffer: "u64",
  offset: "u64",
  range: "u64",
});

export const VkWriteDescriptorSet = struct("VkWriteDescriptorSet", {
  sType: "u32",
  pNext: "ptr",
  dstSet: "u64",
  dstBinding: "u32",
  dstArrayElement: "u32",
  descriptorCount: "u32",
  descriptorType: "u32",
  pImageInfo: "ptr",
  pBufferInfo: "ptr",
  pTexelBufferView: "ptr",
}, { sType: 35 });

export const VkCommandPoolCreateInfo = struct("VkCommandPoolCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  queueFamilyIndex: "u32",
}, { sType: 39 });

export const VkCommandBufferAllocateInfo = struct("VkCommandBufferAllocateInfo", {
  sType: "u32",
  pNext: "ptr",
  commandPool: "u64",
  level: "u32",
  commandBufferCount: "u32",
}, { sType: 40 });

export const VkCommandBufferBeginInfo = struct("VkCommandBufferBeginInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  pInheritanceInfo: "ptr",
}, { sType: 42 });

export const VkBufferCopy = struct("VkBufferCopy", {
  srcOffset: "u64",
  dstOffset: "u64",
  size: "u64",
});

export const VkMemoryBarrier = struct("VkMemoryBarrier", {
  sType: "u32",
  pNext: "ptr",
  srcAccessMask: "u32",
  dstAccessMask: "u32",
}, { sType: 46 });

export const VkBufferMemoryBarrier = struct("VkBufferMemoryBarrier", {
  sType: "u32",
  pNext: "ptr",
  srcAccessMask: "u32",
  dstAccessMask: "u32",
  srcQueueFamilyIndex: "u32",
  dstQueueFamilyIndex: "u32",
  buffer: "u64",
  offset: "u64",
  size: "u64",
}, { sType: 44 });

export const VkSubmitInfo = struct("VkSubmitInfo", {
  sType: "u32",
  pNext: "ptr",
  waitSemaphoreCount: "u32",
  pWaitSemaphores: "ptr",
  pWaitDstStageMask: "ptr",
  commandBufferCount: "u32",
  pCommandBuffers: "ptr",
  signalSemaphoreCount: "u32",
  pSignalSemaphores: "ptr",
}, { sType: 4 });

export const VkTimelineSemaphoreSubmitInfo = struct("VkTimelineSemaphoreSubmitInfo", {
  sType: "u32",
  pNext: "ptr",
  waitSemaphoreValueCount: "u32",
  pWaitSemaphoreValues: "ptr",
  signalSemaphoreValueCount: "u32",
  pSignalSemaphoreValues: "ptr",
}, { sType: 1000207003 });

export const VkFenceCreateInfo = struct("VkFenceCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
}, { sType: 8 });

export const VkSemaphoreTypeCreateInfo = struct("VkSemaphoreTypeCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  semaphoreType: "u32",
  initialValue: "u64",
}, { sType: 1000207002 });

export const VkSemaphoreCreateInfo = struct("VkSemaphoreCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
}, { sType: 9 });

export const VkSemaphoreWaitInfo = struct("VkSemaphoreWaitInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  semaphoreCount: "u32",
  pSemaphores: "ptr",
  pValues: "ptr",
}, { sType: 1000207004 });

export const VkSemaphoreSignalInfo = struct("VkSemaphoreSignalInfo", {
  sType: "u32",
  pNext: "ptr",
  semaphore: "u64",
  value: "u64",
}, { sType: 1000207005 });

export const VkQueryPoolCreateInfo = struct("VkQueryPoolCreateInfo", {
  sType: "u32",
  pNext: "ptr",
  flags: "u32",
  queryType: "u32",
  queryCount: "u32",
  pipelineStatistics: "u32",
}, { sType: 11 });

