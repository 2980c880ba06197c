/** Tokenizer, streaming detokenizer and chat template, from an HF directory or GGUF metadata. */
export { TextTokenizer, type EncodeOptions, type DecodeOptions } from "./tokenizer.ts";
export { TokenTextStream, type TokenTextStreamOptions } from "./stream.ts";
export { ChatTemplate, type ChatMessage, type ChatRenderOptions, type ChatSpecialTokens } from "./chat-template.ts";
export { UnsupportedTokenizerError, TokenizerLoadError, ChatTemplateError, type ChatTemplatePhase } from "./errors.ts";
export { SUPPORTED_GGUF_MODELS, SUPPORTED_GGUF_PRE, GgufTokenType, tokenizerSpecFromGguf } from "./gguf-vocabulary.ts";
export { tokenizerSpecFromHfDirectory } from "./hf-directory.ts";
export type { TokenizerSpec } from "./spec.ts";
