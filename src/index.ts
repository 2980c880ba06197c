/** vkmoe: mixture-of-experts language models on Vulkan, from Bun and Deno; and the MoE layer they run on. */
export { MoeBackend, MoeInputError, type MoeOptions, type MoeStats, type MoeTicket, type ExpertProvider } from "./moe/backend.ts";
export { RoutingError, type Routing } from "./moe/routing.ts";
export { moeReference, type ExpertWeights } from "./moe/reference.ts";
export type { ExpertShape } from "./pool/expert-layout.ts";
export * from "./quant/index.ts";
export { VkmoeError, InvalidArgumentError } from "./errors.ts";
export { ConfigError, readConfig, type VkmoeEnv } from "./config.ts";
export { NoDeviceError, NoLoaderError, ShaderFileError, VulkanError, OutOfMemoryError, DeviceLostError } from "./vk/errors.ts";
export * from "./engine/index.ts";
export { Sampler, StopStringMatcher, samplingFromModel, type SamplingOptions } from "./sampling/index.ts";
export { TextTokenizer, TokenTextStream, ChatTemplate, type ChatMessage } from "./tokenizer/index.ts";
export { openTensorFile, ModelFileError, type TensorFile, type TensorView } from "./formats/index.ts";
