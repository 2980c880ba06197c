/** Sampling options: one zod schema, the defaults, and errors that name the option and its allowed range. */
import { z } from "zod";
import { InvalidArgumentError } from "../errors.ts";

/**
 * Each option with its allowed values. No `.default()` here: defaults live in SAMPLING_DEFAULTS so that a
 * partial set (a model's recommendation, a user's flags) can be validated without defaults leaking in.
 */
const optionFields = {
  temperature: z.number().min(0),
  topK: z.number().int().min(0),
  topP: z.number().min(0).max(1),
  minP: z.number().min(0).max(1),
  repeatPenalty: z.number().positive(),
  repeatLastN: z.number().int().min(-1),
  presencePenalty: z.number(),
  frequencyPenalty: z.number(),
  seed: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  temperaturePosition: z.enum(["last", "first"]),
};

export type SamplingOptionName = keyof typeof optionFields;

/** What each option accepts, in the words an error message uses. */
export const SAMPLING_OPTION_RANGES: Readonly<Record<SamplingOptionName, string>> = {
  temperature: "a finite number >= 0 (0 = greedy)",
  topK: "an integer >= 0 (0 = off)",
  topP: "a number in [0, 1] (1 = off)",
  minP: "a number in [0, 1] (0 = off)",
  repeatPenalty: "a finite number > 0 (1 = off)",
  repeatLastN: "an integer >= -1 (-1 = the whole history, 0 = no penalties)",
  presencePenalty: "a finite number (0 = off)",
  frequencyPenalty: "a finite number (0 = off)",
  seed: `an integer in [0, ${Number.MAX_SAFE_INTEGER}]`,
  temperaturePosition: `"last" (llama.cpp: filters see T = 1) or "first" (Hugging Face, vLLM: filters see T)`,
};

const partialSchema = z.strictObject(
  Object.fromEntries(Object.entries(optionFields).map(([name, field]) => [name, field.optional()])) as {
    [K in SamplingOptionName]: z.ZodOptional<(typeof optionFields)[K]>;
  },
);

/** Options as callers write them: every key optional, unknown keys rejected. */
export type SamplingOptions = z.input<typeof partialSchema>;

/** Every option decided; `seed` stays optional (the Sampler picks one at random and exposes it). */
export type ResolvedSamplingOptions = Required<Omit<SamplingOptions, "seed">> & { seed?: number };

/**
 * Neutral defaults, as the OpenAI API and vLLM use when nothing is asked: plain softmax sampling at T = 1,
 * no filters, no penalties. A model's recommendation (defaults.ts) goes on top of these.
 */
export const SAMPLING_DEFAULTS: Readonly<Required<Omit<SamplingOptions, "seed">>> = {
  temperature: 1,
  topK: 0,
  topP: 1,
  minP: 0,
  repeatPenalty: 1,
  repeatLastN: 64, // llama.cpp's default window
  presencePenalty: 0,
  frequencyPenalty: 0,
  temperaturePosition: "last",
};

/**
 * Validates a partial option set. Throws InvalidArgumentError naming each bad option and its allowed range;
 * `nameOf` says how to name an option in that message, so a model file's value can be named by its own key
 * ("generation_config.json top_k").
 */
export function parseSamplingOptions(options: unknown, nameOf: (name: SamplingOptionName) => string = (name) => name): SamplingOptions {
  const parsed = partialSchema.safeParse(options);
  if (parsed.success) return parsed.data;
  const record = typeof options === "object" && options !== null ? (options as Record<string, unknown>) : undefined;
  if (record === undefined) throw new InvalidArgumentError(`sampling options must be an object, got ${describe(options)}`);
  const problems = parsed.error.issues.map((issue) => {
    if (issue.code === "unrecognized_keys") {
      return `unknown sampling option${issue.keys.length > 1 ? "s" : ""} ${issue.keys.join(", ")} (known: ${Object.keys(optionFields).join(", ")})`;
    }
    const name = String(issue.path[0]) as SamplingOptionName;
    return `${nameOf(name)} must be ${SAMPLING_OPTION_RANGES[name]}, got ${describe(record[name])}`;
  });
  throw new InvalidArgumentError([...new Set(problems)].join("; "));
}

/** Validates and fills in the defaults. */
export function validateSamplingOptions(options: unknown = {}): ResolvedSamplingOptions {
  return { ...SAMPLING_DEFAULTS, ...dropUndefined(parseSamplingOptions(options)) };
}

export function dropUndefined<T extends object>(options: T): Partial<T> {
  return Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined)) as Partial<T>;
}

function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "bigint") return `${value}n`;
  return String(value);
}
