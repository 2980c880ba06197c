/**
 * Sampling defaults a model ships with, merged under the user's options: user > generation_config.json >
 * GGUF `general.sampling.*` > SAMPLING_DEFAULTS (neutral: T = 1, no filters, no penalties).
 *
 * Hugging Face generation_config.json: `do_sample: false` means greedy (temperature 0); `temperature`, `top_k`,
 * `top_p`, `min_p`, `repetition_penalty` map to their options. Only keys that are present count: transformers'
 * own fallbacks for missing keys (top_k 50, and greedy when `do_sample` is absent) are not applied, as vLLM does
 * not apply them either. transformers penalizes repeats over the whole context; `repetition_penalty` here keeps
 * `repeatLastN` (64 unless set), as llama.cpp's converter does when it copies it into the GGUF.
 *
 * GGUF keys, as llama.cpp defines them (gguf-py Keys.General.SAMPLING_*, llama.cpp PR #17120):
 * `general.sampling.temp`, `.top_k`, `.top_p`, `.min_p`, `.penalty_repeat`, `.penalty_last_n` map to options;
 * `.sequence` (sampler names joined by ';') sets `temperaturePosition` when it puts temperature wholly before
 * or after top-p and min-p. `.xtc_probability`, `.xtc_threshold`, `.mirostat`, `.mirostat_tau`,
 * `.mirostat_eta` and any other part of the sequence have no counterpart here: they are listed in `notApplied`.
 */
import { z } from "zod";
import { InvalidArgumentError } from "../errors.ts";
import {
  dropUndefined,
  parseSamplingOptions,
  type ResolvedSamplingOptions,
  SAMPLING_DEFAULTS,
  type SamplingOptionName,
  type SamplingOptions,
} from "./options.ts";

export type SamplingSource = "user" | "generation_config" | "gguf" | "default";

/** What one model file recommends, as options, and what it recommends that this sampler cannot do. */
export interface ModelSamplingDefaults {
  options: SamplingOptions;
  notApplied: string[];
}

export interface SamplingSources {
  /** The user's options (flags, request fields); they win over everything. */
  user?: SamplingOptions;
  /** The parsed generation_config.json of a Hugging Face model directory. */
  generationConfig?: unknown;
  /** A GGUF file's key/value metadata. */
  ggufMetadata?: Readonly<Record<string, unknown>>;
}

export interface ResolvedSampling {
  options: ResolvedSamplingOptions;
  /** Where each option's value came from, for a banner or a log line. */
  sources: Record<Exclude<SamplingOptionName, "seed">, SamplingSource> & { seed?: SamplingSource };
  notApplied: string[];
}

const generationConfigSchema = z.looseObject({
  do_sample: z.boolean().nullish(),
  temperature: z.number().nullish(),
  top_k: z.number().nullish(),
  top_p: z.number().nullish(),
  min_p: z.number().nullish(),
  repetition_penalty: z.number().nullish(),
});

/** Options from a Hugging Face generation_config.json object. */
export function samplingFromGenerationConfig(config: unknown): ModelSamplingDefaults {
  const parsed = generationConfigSchema.safeParse(config);
  if (!parsed.success) throw new InvalidArgumentError(`invalid generation_config.json:\n${z.prettifyError(parsed.error)}`);
  const c = parsed.data;
  const options = dropUndefined({
    temperature: c.do_sample === false ? 0 : (c.temperature ?? undefined),
    topK: c.top_k == null ? undefined : Math.max(0, c.top_k), // <= 0 is off (transformers 0, vLLM -1)
    topP: c.top_p ?? undefined,
    minP: c.min_p ?? undefined,
    repeatPenalty: c.repetition_penalty ?? undefined,
  });
  const key = (name: SamplingOptionName) => `generation_config.json ${GENERATION_CONFIG_KEYS[name] ?? name}`;
  return { options: parseSamplingOptions(options, key), notApplied: [] };
}

const GENERATION_CONFIG_KEYS: Partial<Record<SamplingOptionName, string>> = {
  temperature: "temperature",
  topK: "top_k",
  topP: "top_p",
  minP: "min_p",
  repeatPenalty: "repetition_penalty",
};

const GGUF_PREFIX = "general.sampling.";
const GGUF_OPTION_KEYS: Readonly<Record<string, SamplingOptionName>> = {
  temp: "temperature",
  top_k: "topK",
  top_p: "topP",
  min_p: "minP",
  penalty_repeat: "repeatPenalty",
  penalty_last_n: "repeatLastN",
};
/** Keys whose value means "off" at 0: listed as not applied only when they would do something. */
const GGUF_UNSUPPORTED_KEYS = ["xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta"];

/** Options from GGUF metadata (`general.sampling.*`); keys absent from the file are absent here. */
export function samplingFromGgufMetadata(metadata: Readonly<Record<string, unknown>>): ModelSamplingDefaults {
  const options: Record<string, unknown> = {};
  const notApplied: string[] = [];
  for (const [suffix, option] of Object.entries(GGUF_OPTION_KEYS)) {
    const key = GGUF_PREFIX + suffix;
    if (!(key in metadata)) continue;
    const value = metadataNumber(metadata[key], key);
    // llama.cpp reads top_k <= 0 as off
    options[option] = option === "topK" && value < 0 ? 0 : value;
  }
  const mirostatOn = metadataNumberOr(metadata[GGUF_PREFIX + "mirostat"], 0) !== 0;
  const xtcOn = metadataNumberOr(metadata[GGUF_PREFIX + "xtc_probability"], 0) > 0;
  for (const suffix of GGUF_UNSUPPORTED_KEYS) {
    const key = GGUF_PREFIX + suffix;
    if (key in metadata && (suffix.startsWith("mirostat") ? mirostatOn : xtcOn)) notApplied.push(`${key} = ${String(metadata[key])}`);
  }
  const sequenceKey = GGUF_PREFIX + "sequence";
  if (sequenceKey in metadata) {
    const sequence = metadata[sequenceKey];
    if (typeof sequence !== "string") throw new InvalidArgumentError(`GGUF ${sequenceKey} must be a string, got ${String(sequence)}`);
    const order = temperaturePositionFromSequence(sequence);
    if (order.position !== undefined) options.temperaturePosition = order.position;
    if (order.notApplied !== undefined) notApplied.push(`${sequenceKey} = "${sequence}": ${order.notApplied}`);
  }
  const keyOf = Object.fromEntries(Object.entries(GGUF_OPTION_KEYS).map(([suffix, option]) => [option, GGUF_PREFIX + suffix]));
  return { options: parseSamplingOptions(options, (name) => `GGUF ${keyOf[name] ?? name}`), notApplied };
}

/** llama.cpp sampler names (common_sampler_type_from_name), as the few this sampler orders. */
const SEQUENCE_NAMES: Readonly<Record<string, string>> = {
  penalties: "penalties",
  top_k: "top_k",
  top_p: "top_p",
  nucleus: "top_p",
  min_p: "min_p",
  temperature: "temperature",
  temp: "temperature",
};

/**
 * Where a sampler sequence puts temperature relative to top-p and min-p. The rest of this sampler's order is
 * fixed (penalties, top-k, top-p, min-p), so any other difference is reported, not applied.
 */
export function temperaturePositionFromSequence(sequence: string): { position?: "first" | "last"; notApplied?: string } {
  const names = sequence.split(";").map((name) => name.trim()).filter((name) => name.length > 0);
  const known = names.map((name) => SEQUENCE_NAMES[name]).filter((name) => name !== undefined);
  const problems: string[] = [];
  const unknown = names.filter((name) => SEQUENCE_NAMES[name] === undefined);
  if (unknown.length > 0) problems.push(`samplers ${unknown.join(", ")} are not implemented`);
  const filters = known.filter((name) => name !== "temperature" && name !== "penalties");
  if (filters.join(";") !== ["top_k", "top_p", "min_p"].filter((name) => filters.includes(name)).join(";")) {
    problems.push("the filters run in the order top_k, top_p, min_p here");
  }
  const penalties = known.indexOf("penalties");
  if (penalties > 0) problems.push("penalties always come first here");
  let position: "first" | "last" | undefined;
  const temperature = known.indexOf("temperature");
  const probabilityFilters = ["top_p", "min_p"].map((name) => known.indexOf(name)).filter((at) => at >= 0);
  if (temperature >= 0 && probabilityFilters.length > 0) {
    if (probabilityFilters.every((at) => at > temperature)) position = "first";
    else if (probabilityFilters.every((at) => at < temperature)) position = "last";
    else problems.push("temperature between top_p and min_p has no counterpart here");
  }
  return { position, notApplied: problems.length > 0 ? problems.join("; ") : undefined };
}

/** user > generation_config.json > GGUF metadata > SAMPLING_DEFAULTS, each option on its own. */
export function resolveSampling(sources: SamplingSources): ResolvedSampling {
  const layers: Array<[SamplingSource, SamplingOptions]> = [];
  const notApplied: string[] = [];
  if (sources.ggufMetadata !== undefined) {
    const fromGguf = samplingFromGgufMetadata(sources.ggufMetadata);
    layers.push(["gguf", fromGguf.options]);
    notApplied.push(...fromGguf.notApplied);
  }
  if (sources.generationConfig !== undefined) {
    const fromConfig = samplingFromGenerationConfig(sources.generationConfig);
    layers.push(["generation_config", fromConfig.options]);
    notApplied.push(...fromConfig.notApplied);
  }
  if (sources.user !== undefined) layers.push(["user", parseSamplingOptions(sources.user)]);

  const options: Record<string, unknown> = { ...SAMPLING_DEFAULTS };
  const origin: Record<string, SamplingSource> = Object.fromEntries(Object.keys(SAMPLING_DEFAULTS).map((name) => [name, "default"]));
  for (const [source, layer] of layers) {
    for (const [name, value] of Object.entries(dropUndefined(layer))) {
      options[name] = value;
      origin[name] = source;
    }
  }
  return {
    options: options as ResolvedSamplingOptions,
    sources: origin as ResolvedSampling["sources"],
    notApplied,
  };
}

/**
 * The options for a model whose files carry `modelDefaults` (Model.generationDefaults: a generation_config.json
 * object, or a GGUF file's `general.sampling.*` keys), under the user's options. Unset options are filled from
 * SAMPLING_DEFAULTS; `seed` stays unset unless the user gave one (the Sampler then picks and exposes one).
 */
export function samplingFromModel(modelDefaults: Readonly<Record<string, unknown>>, user: SamplingOptions = {}): ResolvedSamplingOptions {
  const isGguf = Object.keys(modelDefaults).some((key) => key.startsWith(GGUF_PREFIX));
  return resolveSampling(isGguf ? { ggufMetadata: modelDefaults, user } : { generationConfig: modelDefaults, user }).options;
}

/** GGUF numbers arrive as number or (64-bit types) bigint. */
function metadataNumber(value: unknown, key: string): number {
  if (typeof value === "number") return value;
  if (typeof value === "bigint") return Number(value);
  throw new InvalidArgumentError(`GGUF ${key} must be a number, got ${typeof value === "string" ? JSON.stringify(value) : String(value)}`);
}

function metadataNumberOr(value: unknown, fallback: number): number {
  return typeof value === "number" ? value : typeof value === "bigint" ? Number(value) : fallback;
}
