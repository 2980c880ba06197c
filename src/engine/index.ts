/** The engine: load a model, open sessions, generate text. What the scripts and the host import. */
export { Model, QUANT_CHOICES, type LoadOptions, type ModelSource, type QuantChoice } from "../model/model.ts";
export { Session, type SessionOptions } from "../model/session.ts";
export { SessionBatch, type BatchPath, type BatchStep } from "../model/session-batch.ts";
export { generate, type GenerateOptions, type GenerateResult } from "./generate.ts";
export { reusablePrefix, Sequence, type FinishReason, type GeneratedToken, type SequenceDelta, type SequenceOptions, type SequenceSession, type StoppedBy } from "./sequence.ts";
export { chatMessages, promptIds, type PromptOptions } from "./prompt.ts";
export { peakRssBytes } from "./memory.ts";
export { ContextLengthError, ModelConfigError, ModelWeightsError } from "../model/errors.ts";
