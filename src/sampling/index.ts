/** Token sampling: the Sampler, model-recommended defaults, and streaming stop strings. */
export { Sampler, type LogprobDistribution, type SampledToken, type SampleInfoRequest, type TokenLogprob } from "./sampler.ts";
export {
  parseSamplingOptions,
  validateSamplingOptions,
  SAMPLING_DEFAULTS,
  SAMPLING_OPTION_RANGES,
  type ResolvedSamplingOptions,
  type SamplingOptionName,
  type SamplingOptions,
} from "./options.ts";
export {
  resolveSampling,
  samplingFromModel,
  samplingFromGenerationConfig,
  samplingFromGgufMetadata,
  temperaturePositionFromSequence,
  type ModelSamplingDefaults,
  type ResolvedSampling,
  type SamplingSource,
  type SamplingSources,
} from "./defaults.ts";
export { StopStringMatcher, type StopResult } from "./stop.ts";
export { applyPenalties, type PenaltySettings } from "./penalties.ts";
export { SeededRandom, randomSeed } from "./rng.ts";
