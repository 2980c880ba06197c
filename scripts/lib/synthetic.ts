/**
 * Synthetic MoE models for demos and benchmarks: expert shapes of real models, quantized weights
 * generated directly as random words (every q4/q8 bit pattern is a valid weight) with f16 scales
 * in a plausible range, and random top-k routings. Quantizing gaussian data in TypeScript is far
 * too slow for hundreds of MB; this writes ~1 GB/s.
 */
import { InvalidArgumentError } from "../../src/errors.ts";
import type { ExpertWeights } from "../../src/moe/reference.ts";
import type { Routing } from "../../src/moe/routing.ts";
import { expertLayout, type ExpertShape } from "../../src/pool/expert-layout.ts";
import { colsPerWord, groupsPerRowFor, rowWordsFor, scaleWordsFor } from "../../src/quant/layout.ts";
import { gaussian, mulberry32 } from "../../src/quant/random.ts";
import type { QuantMatrix } from "../../src/quant/types.ts";

export interface ModelShape {
  name: string;
  /** hidden size D */
  hidden: number;
  /** expert intermediate size I */
  intermediate: number;
  experts: number;
  topK: number;
  /** A shared expert (same shape as a routed one) on every token. */
  shared: boolean;
  /** Decoder layers of the real model (for reference). */
  modelLayers: number;
}

export const QWEN3_30B_A3B: ModelShape = { name: "Qwen3-30B-A3B", hidden: 2048, intermediate: 768, experts: 128, topK: 8, shared: false, modelLayers: 48 };
/** Qwen3.6-35B-A3B-like: 256 small experts, top-8, plus a shared expert (modelled with the routed experts' shape). */
export const QWEN36_35B_A3B: ModelShape = { name: "Qwen3.6-35B-A3B-like", hidden: 2048, intermediate: 512, experts: 256, topK: 8, shared: true, modelLayers: 40 };

export function expertShapeOf(m: ModelShape): ExpertShape {
  return { format: "q4", groupSize: 32, scaleType: "f16", hidden: m.hidden, intermediate: m.intermediate };
}

/** Device bytes of one expert (gate, up, down with scales, 16-byte aligned parts). */
export function expertBytes(m: ModelShape): number {
  return expertLayout(expertShapeOf(m)).bytes;
}

/** Experts per layer including the shared one. */
export function expertsPerLayer(m: ModelShape): number {
  return m.experts + (m.shared ? 1 : 0);
}

/** xorshift32 over `out` from `seed` (never 0). */
export function fillRandomWords(out: Uint32Array, seed: number): void {
  // Kept an int32 throughout (`| 0`): a uint32 above 2^31 would be a double and the loop 15x slower.
  let s = (seed ^ 0x9e3779b9) | 0 || 1;
  const n = out.length;
  for (let i = 0; i < n; i++) {
    s ^= s << 13;
    s = (s ^ (s >>> 17)) | 0;
    s ^= s << 5;
    out[i] = s;
  }
}

/**
 * f16 scales uniform in bit space over [1/128, 1/32) (bits 0x2000..0x27ff): varied enough that a
 * kernel reading the wrong group's scale gives a visibly wrong answer.
 */
export function fillRandomF16Scales(out: Uint32Array, seed: number): void {
  fillRandomWords(out, seed ^ 0x85ebca6b ^ 0x9e3779b9); // the same stream as before: seed ^ 0x85ebca6b
  for (let i = 0; i < out.length; i++) out[i] = 0x20002000 | (out[i]! & 0x07ff07ff);
}

/** A q4/q8 matrix of random words and random f16 scales. Needs cols a multiple of 32 (no padding to keep at q = 0). */
export function randomQuantMatrix(shape: ExpertShape, rows: number, cols: number, seed: number): QuantMatrix {
  if (shape.scaleType !== "f16") throw new InvalidArgumentError("synthetic weights use f16 scales");
  if (cols % (colsPerWord(shape.format) * 4) !== 0 || cols % shape.groupSize !== 0) throw new InvalidArgumentError(`synthetic weights need cols (${cols}) to fill whole 16-byte rows and groups`);
  const rowWords = rowWordsFor(shape.format, cols);
  const groupsPerRow = groupsPerRowFor(cols, shape.groupSize);
  const weights = new Uint32Array(rows * rowWords);
  fillRandomWords(weights, seed);
  const scales = new Uint32Array(scaleWordsFor("f16", rows * groupsPerRow));
  fillRandomF16Scales(scales, seed + 0x51ed27);
  if ((rows * groupsPerRow) % 2 === 1) scales[scales.length - 1]! &= 0xffff;
  return { format: shape.format, rows, cols, groupSize: shape.groupSize, scaleType: "f16", rowWords, groupsPerRow, weights, scales };
}

/** Expert `seed`: gate and up I x D, down D x I. */
export function randomExpert(shape: ExpertShape, seed: number): ExpertWeights {
  const D = shape.hidden, I = shape.intermediate;
  const s = Math.imul(seed + 1, 0x2c1b3c6d) >>> 0;
  return {
    gate: randomQuantMatrix(shape, I, D, s ^ 0x1111),
    up: randomQuantMatrix(shape, I, D, s ^ 0x2222),
    down: randomQuantMatrix(shape, D, I, s ^ 0x3333),
  };
}

/**
 * Routings as a router would produce them: top-k distinct experts per token with softmax weights
 * normalized over the k chosen (Qwen3's norm_topk_prob), and a sigmoid-gated shared expert.
 */
export class RoutingGenerator {
  private readonly uniform: () => number;
  private readonly normal: () => number;
  private readonly perm: Int32Array;

  constructor(private readonly model: ModelShape, seed: number) {
    this.uniform = mulberry32(seed);
    this.normal = gaussian(this.uniform);
    this.perm = Int32Array.from({ length: model.experts }, (_, i) => i);
  }

  next(S: number): Routing {
    const { topK: k, experts: E } = this.model;
    const ids = new Int32Array(S * k);
    const weights = new Float32Array(S * k);
    const p = this.perm;
    for (let s = 0; s < S; s++) {
      // Partial Fisher-Yates: the first k entries become a uniform random k-subset.
      for (let j = 0; j < k; j++) {
        const r = j + Math.floor(this.uniform() * (E - j));
        const t = p[j]!;
        p[j] = p[r]!;
        p[r] = t;
      }
      const logits = Array.from({ length: k }, () => this.normal());
      const top = Math.max(...logits);
      const exps = logits.map((l) => Math.exp(l - top));
      const sum = exps.reduce((a, b) => a + b, 0);
      for (let j = 0; j < k; j++) {
        ids[s * k + j] = p[j]!;
        weights[s * k + j] = exps[j]! / sum;
      }
    }
    const r: Routing = { S, k, ids, weights };
    if (this.model.shared) r.sharedWeights = Float32Array.from({ length: S }, () => 1 / (1 + Math.exp(-this.normal())));
    return r;
  }
}

/** Gaussian activations x[S, D]. */
export function randomActivations(S: number, D: number, seed: number): Float32Array {
  const next = gaussian(mulberry32(seed));
  const x = new Float32Array(S * D);
  for (let i = 0; i < x.length; i++) x[i] = next();
  return x;
}

/** Distinct experts a routing touches (plus the shared one). */
export function distinctExperts(r: Routing, shared: boolean): number {
  return new Set(r.ids).size + (shared ? 1 : 0);
}
