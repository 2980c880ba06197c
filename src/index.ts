/** vkmoe: routed-expert GEMVs of MoE models on Vulkan, from Bun and Deno. */
export { MoeBackend, MoeInputError, type MoeOptions, type MoeStats, type MoeTicket, type ExpertProvider } from "./moe/backend.ts";
export { RoutingError, type Routing } from "./moe/routing.ts";
export { moeReference, type ExpertWeights } from "./moe/reference.ts";
export type { ExpertShape } from "./pool/expert-layout.ts";
export * from "./quant/index.ts";
export { VkmoeError, InvalidArgumentError } from "./errors.ts";
export { ConfigError, readConfig, type VkmoeEnv } from "./config.ts";
export { NoDeviceError, NoLoaderError, ShaderFileError, VulkanError, OutOfMemoryError, DeviceLostError } from "./vk/errors.ts";
