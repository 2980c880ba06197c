/**
 * Token sampling from one step's logits, in llama.cpp's default order (common_params_sampling.samplers:
 * penalties; dry; top_n_sigma; top_k; typ_p; top_p; min_p; xtc; temperature, then dist; dry, top-n-sigma,
 * typical-p and xtc are off by default there and not implemented here):
 *
 *   1. penalties  repeat / presence / frequency over the last `repeatLastN` history tokens (penalties.ts)
 *   2. top-k      the k largest logits (0 = off)
 *   3. top-p      the smallest best-first prefix whose probability reaches p (1 = off)
 *   4. min-p      tokens whose probability is at least minP times the top one's (0 = off)
 *   5. temperature, then one draw from softmax(logits / T) over what is left
 *
 * Temperature comes last, as in llama.cpp: top-p and min-p see the T = 1 probabilities (renormalized over the
 * top-k set). `temperaturePosition: "first"` applies it before them instead, as Hugging Face transformers and
 * vLLM do. Mirostat is not implemented either.
 *
 * Candidates are ordered by logit, the lower token id first among equal logits, so every filter keeps a
 * prefix of one order and ties always resolve to the lowest id. temperature 0 is greedy: argmax of the
 * penalized logits, no random draw. Any other setting takes exactly one uniform per token from a seeded
 * xoshiro128**, so a seed and the same logits give the same tokens.
 *
 * No allocation per call: scratch arrays are sized to the vocabulary on first use and reused. With top-k on,
 * a call is one pass over the logits plus O(k log k); with top-k off it is a few passes (top-p adds a
 * histogram pass, see nucleus.ts) and never a sort of the vocabulary.
 */
import { InvalidArgumentError } from "../errors.ts";
import { NucleusScratch, nucleusCut, type Cut } from "./nucleus.ts";
import { type ResolvedSamplingOptions, type SamplingOptions, validateSamplingOptions } from "./options.ts";
import { applyPenalties, penaltiesActive, windowStart } from "./penalties.ts";
import { randomSeed, SeededRandom } from "./rng.ts";
import { argmax, selectTopK } from "./select.ts";

/** One token and its log-probability. */
export interface TokenLogprob {
  token: number;
  logprob: number;
}

export type LogprobDistribution = "model" | "sampler";

export interface SampleInfoRequest {
  /** How many of the most likely tokens to list (OpenAI `top_logprobs`); default 0. */
  topLogprobs?: number;
  /**
   * Which distribution the logprobs describe. "model" (default, as vLLM and llama.cpp's server report): the
   * raw logits' log-softmax, before penalties, filters and temperature. "sampler": the distribution the token
   * was actually drawn from; only the surviving candidates are listed (greedy: one token, logprob 0).
   */
  distribution?: LogprobDistribution;
}

export interface SampledToken {
  token: number;
  logprob: number;
  probability: number;
  /** Best first, at most `topLogprobs` entries. */
  topLogprobs: TokenLogprob[];
  distribution: LogprobDistribution;
  /** How many tokens the sampler could have drawn after penalties and filters (1 when greedy). */
  candidates: number;
}

/**
 * How the last call's final distribution is laid out, for sampleWithInfo: "list" = listIds/listValues[0..count)
 * best-first (top-k on); "scan" = candidateIds/candidateWeights[0..count) in id order (top-k off).
 */
type LastDraw = "greedy" | "list" | "scan";

export class Sampler {
  /** The validated options, with the seed actually used: `new Sampler(sampler.options)` repeats a run. */
  readonly options: Readonly<ResolvedSamplingOptions & { seed: number }>;
  /** True when tokens are chosen by argmax (temperature 0, or top-k 1). */
  readonly greedy: boolean;
  private readonly random: SeededRandom;
  private readonly penalize: boolean;
  private readonly logMinP: number;
  /** Logit multiplier for the top-p / min-p probabilities: 1 when temperature comes last, 1/T when first. */
  private readonly filterScale: number;
  private readonly inverseTemperature: number;

  private vocab = 0;
  private penalized = new Float32Array(0);
  private counts = new Uint32Array(0);
  private candidateIds = new Int32Array(0);
  private candidateWeights = new Float64Array(0);
  private nucleus: NucleusScratch | undefined;
  private readonly listIds: Int32Array;
  private readonly listValues: Float64Array;
  private readonly listWeights: Float64Array;
  private readonly cut: Cut = { value: -Infinity, id: -1 };

  private last: LastDraw = "greedy";
  private lastSource: Float32Array = this.penalized;
  private lastMax = 0;
  private lastTotal = 1;
  private lastCount = 0;

  constructor(options: SamplingOptions = {}) {
    const resolved = validateSamplingOptions(options);
    const seed = resolved.seed ?? randomSeed();
    this.options = Object.freeze({ ...resolved, seed });
    this.random = new SeededRandom(seed);
    const { temperature, topK, minP, temperaturePosition } = resolved;
    // 1/T overflows for T below ~5.6e-309; such a temperature is greedy in every way that can be computed.
    this.greedy = temperature === 0 || !Number.isFinite(1 / temperature) || topK === 1;
    this.inverseTemperature = this.greedy ? 0 : 1 / temperature;
    this.filterScale = temperaturePosition === "first" ? this.inverseTemperature : 1;
    this.logMinP = minP > 0 ? Math.log(minP) : -Infinity;
    this.penalize = penaltiesActive(resolved);
    const listSize = topK > 0 ? topK : 0;
    this.listIds = new Int32Array(listSize);
    this.listValues = new Float64Array(listSize);
    this.listWeights = new Float64Array(listSize);
  }

  get seed(): number {
    return this.options.seed;
  }

  /** Greedy with no penalty: the next id is the argmax of the raw logits (the engine may take it from the device). */
  get argmaxOnly(): boolean {
    return this.greedy && !this.penalize;
  }

  /** Rewinds the random stream to the start of this sampler's seed. */
  reset(): void {
    this.random.reset();
  }

  /**
   * The next token id for these logits. `history` is the context so far (prompt and generated tokens);
   * only its last `repeatLastN` tokens matter, and only when a penalty is on.
   */
  sample(logits: Float32Array, history: ArrayLike<number> = []): number {
    if (logits.length === 0) throw new InvalidArgumentError("logits is empty");
    if (logits.length !== this.vocab) this.resize(logits.length);
    const source = this.penalize && windowStart(history.length, this.options.repeatLastN) < history.length
      ? applyPenalties(logits, history, this.options, this.penalized, this.counts)
      : logits;
    this.lastSource = source;
    if (this.greedy) {
      const token = argmax(source);
      if (token < 0) throw noCandidate();
      this.last = "greedy";
      this.lastCount = 1;
      return token;
    }
    const uniform = this.random.nextFloat(); // always one draw per token, whatever path, so streams stay aligned
    const { topK } = this.options;
    return topK > 0 && topK < source.length ? this.drawFromTopK(source, uniform) : this.drawFromVocabulary(source, uniform);
  }

  /** sample(), plus the chosen token's logprob and the top candidates (OpenAI `logprobs` / `top_logprobs`). */
  sampleWithInfo(logits: Float32Array, history: ArrayLike<number> = [], request: SampleInfoRequest = {}): SampledToken {
    const topLogprobs = request.topLogprobs ?? 0;
    const distribution = request.distribution ?? "model";
    if (!Number.isInteger(topLogprobs) || topLogprobs < 0) {
      throw new InvalidArgumentError(`topLogprobs must be an integer >= 0, got ${topLogprobs}`);
    }
    if (distribution !== "model" && distribution !== "sampler") {
      throw new InvalidArgumentError(`distribution must be "model" or "sampler", got ${String(distribution)}`);
    }
    const token = this.sample(logits, history);
    const info = distribution === "model" ? modelLogprobs(logits, token, topLogprobs) : this.samplerLogprobs(token, topLogprobs);
    return { token, ...info, probability: Math.exp(info.logprob), distribution, candidates: this.lastCount };
  }

  private resize(vocab: number): void {
    this.vocab = vocab;
    if (this.penalize) {
      this.penalized = new Float32Array(vocab);
      this.counts = new Uint32Array(vocab);
    }
    const topK = this.options.topK;
    if (!this.greedy && !(topK > 0 && topK < vocab)) {
      this.candidateIds = new Int32Array(vocab);
      this.candidateWeights = new Float64Array(vocab);
      if (this.options.topP < 1) this.nucleus = new NucleusScratch(vocab);
    }
  }

  /** Top-k on: everything after the selection works on k best-first candidates. */
  private drawFromTopK(source: Float32Array, uniform: number): number {
    const { listIds: ids, listValues: values, listWeights: weights } = this;
    const n = selectTopK(source, this.options.topK, ids, values);
    if (n === 0) throw noCandidate();
    const max = values[0];
    if (max === Infinity) throw infiniteLogit();
    const scale = this.filterScale;
    let count = n;
    const { topP } = this.options;
    if (topP < 1) {
      let total = 0;
      for (let j = 0; j < n; j++) total += Math.exp((values[j] - max) * scale);
      let running = 0;
      for (let j = 0; j < n; j++) {
        running += Math.exp((values[j] - max) * scale) / total;
        if (running >= topP) {
          count = j + 1;
          break;
        }
      }
    }
    let kept = 1; // the top candidate always passes min-p
    while (kept < count && (values[kept] - max) * scale >= this.logMinP) kept++;
    count = kept;
    let total = 0;
    for (let j = 0; j < count; j++) total += weights[j] = Math.exp((values[j] - max) * this.inverseTemperature);
    this.last = "list";
    this.lastMax = max;
    this.lastTotal = total;
    this.lastCount = count;
    return ids[pick(weights, count, uniform * total)];
  }

  /** Top-k off: the candidates are a prefix of the vocabulary's order, found without sorting it. */
  private drawFromVocabulary(source: Float32Array, uniform: number): number {
    let max = -Infinity;
    for (let i = 0; i < source.length; i++) if (source[i] > max) max = source[i];
    if (max === -Infinity) throw noCandidate();
    if (max === Infinity) throw infiniteLogit();
    const scale = this.filterScale;
    const cut = this.cut;
    cut.value = -Infinity; // no top-p cut: every logit > -Infinity is in
    cut.id = -1;
    if (this.options.topP < 1) nucleusCut(source, max, scale, this.options.topP, this.nucleus!, cut);
    const { value: cutValue, id: cutId } = cut;
    const logMinP = this.logMinP;
    const invT = this.inverseTemperature;
    const { candidateIds: ids, candidateWeights: weights } = this;
    let total = 0;
    let count = 0;
    for (let i = 0; i < source.length; i++) {
      const v = source[i];
      if ((v > cutValue || (v === cutValue && i <= cutId)) && (v - max) * scale >= logMinP) {
        const weight = Math.exp((v - max) * invT);
        ids[count] = i;
        weights[count++] = weight;
        total += weight;
      }
    }
    this.last = "scan";
    this.lastMax = max;
    this.lastTotal = total;
    this.lastCount = count;
    return ids[pick(weights, count, uniform * total)];
  }

  /** Logprobs under the distribution the last token was drawn from. */
  private samplerLogprobs(token: number, topLogprobs: number): { logprob: number; topLogprobs: TokenLogprob[] } {
    if (this.last === "greedy") {
      return { logprob: 0, topLogprobs: topLogprobs > 0 ? [{ token, logprob: 0 }] : [] };
    }
    // Exact from the logit, not log(weight): a candidate whose weight underflowed still gets its true logprob.
    const logTotal = Math.log(this.lastTotal);
    const logprobOf = (logit: number) => (logit - this.lastMax) * this.inverseTemperature - logTotal;
    const n = Math.min(topLogprobs, this.lastCount);
    const top: TokenLogprob[] = [];
    if (this.last === "list") {
      for (let j = 0; j < n; j++) top.push({ token: this.listIds[j], logprob: logprobOf(this.listValues[j]) });
    } else if (n > 0) {
      // Every filter keeps a prefix of the logit order, so the top candidates are the top logits.
      const ids = new Int32Array(n);
      const values = new Float64Array(n);
      selectTopK(this.lastSource, n, ids, values);
      for (let j = 0; j < n; j++) top.push({ token: ids[j], logprob: logprobOf(values[j]) });
    }
    return { logprob: logprobOf(this.lastSource[token]), topLogprobs: top };
  }
}

/**
 * The index whose running weight first exceeds `target` (u * total). A zero weight is never picked: the
 * running sum does not move there. If rounding leaves the sum at or below target, the last positive weight.
 */
function pick(weights: Float64Array, n: number, target: number): number {
  let running = 0;
  let lastPositive = -1;
  for (let i = 0; i < n; i++) {
    const w = weights[i];
    if (w === 0) continue;
    running += w;
    lastPositive = i;
    if (running > target) return i;
  }
  return lastPositive;
}

/** log-softmax of the raw logits at T = 1: the model's own distribution. */
function modelLogprobs(logits: Float32Array, token: number, topLogprobs: number): { logprob: number; topLogprobs: TokenLogprob[] } {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  if (max > -Infinity && max < Infinity) for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (v > -Infinity) sum += Math.exp(v - max);
  }
  const logNormalizer = max + Math.log(sum);
  const n = Math.min(topLogprobs, logits.length);
  const ids = new Int32Array(n);
  const values = new Float64Array(n);
  const found = selectTopK(logits, n, ids, values);
  const top: TokenLogprob[] = [];
  for (let j = 0; j < found; j++) top.push({ token: ids[j], logprob: values[j] - logNormalizer });
  return { logprob: logits[token] - logNormalizer, topLogprobs: top };
}

function noCandidate(): InvalidArgumentError {
  return new InvalidArgumentError("logits has no value above -Infinity: nothing can be sampled");
}

function infiniteLogit(): InvalidArgumentError {
  return new InvalidArgumentError("logits contains +Infinity: softmax is undefined (greedy, temperature 0, still works)");
}
