/**
 * How a prompt is cut into replays and where its experts and attention run: the Qwen3-MoE graph's
 * prompt chunk (VKMOE_PREFILL_CHUNK), the experts' matrix-core kernels (VKMOE_MOE_COOPMAT:
 * moe_ggml_cm, moe_pool_cm) and the attention's (VKMOE_ATTENTION_COOPMAT: dec_attention_cm).
 * Measured on the H100 (2026-12-07, README "Measured figures"): the matrix-core
 * experts are 0.6x the integer-dot ones at a 64-token chunk's few slots an expert, 1.5x at 256 tokens
 * and 2x at 512; so "auto" runs them for calls of CM_EXPERTS_MIN_TOKENS tokens or more, and takes
 * 512-token chunks where they run (8-layer files' prefill 1.4-1.5x that of 64-token chunks).
 */
import type { VkmoeEnv } from "../config.ts";
import { DECODE_ATTENTION_TOKENS, MAX_ATTENTION_TOKENS } from "../kernels/decoder/attention.ts";
import { matrixCoresPass } from "../kernels/decoder/coopmat-check.ts";
import { CHUNK_MAX_TOKENS } from "./routing.ts";
import type { Device } from "../vk/device.ts";

/** Calls of at least this many tokens run their experts on the matrix cores under VKMOE_MOE_COOPMAT=auto. */
export const CM_EXPERTS_MIN_TOKENS = 256;
/** The prompt chunk where no matrix-core experts run (the integer-dot experts gain little from longer ones). */
export const DEFAULT_CHUNK = 64;
/** The prompt chunk where they do. */
export const MATRIX_CORE_CHUNK = 512;

export interface PrefillPlan {
  /** Tokens a prompt chunk's replay takes in the Qwen3-MoE graph. */
  chunk: number;
  /** Calls regrouped by expert of at least this many tokens run on the matrix cores; undefined: none do. */
  expertsOnMatrixCoresFrom: number | undefined;
}

/** The plan for `device` under env's VKMOE_PREFILL_CHUNK and VKMOE_MOE_COOPMAT. */
export function prefillPlan(device: Device, env: VkmoeEnv): PrefillPlan {
  const mode = env.VKMOE_MOE_COOPMAT;
  const cm = mode !== "off" && device.enabled.cooperativeMatrix && matrixCoresPass(device);
  const chunk = env.VKMOE_PREFILL_CHUNK === "auto" ? (cm ? MATRIX_CORE_CHUNK : DEFAULT_CHUNK) : Number(env.VKMOE_PREFILL_CHUNK);
  const from = !cm ? undefined : mode === "on" ? 1 : CM_EXPERTS_MIN_TOKENS;
  return { chunk, expertsOnMatrixCoresFrom: from };
}

/**
 * Where a prompt chunk's attention runs dec_attention_cm (VKMOE_ATTENTION_COOPMAT): its variant and
 * the fewest tokens a chunk takes there; undefined: nowhere (no matrix cores that pass the
 * self-check, or "off"). "auto": chunks longer than 64 tokens (those that otherwise run 64 queries
 * at a time, one call after another); "on" and "emulated": every chunk of more than 4; nowhere in a
 * graph whose chunks (maxTokens) are all shorter than that.
 */
export function attentionOnMatrixCores(device: Device, env: VkmoeEnv, maxTokens = CHUNK_MAX_TOKENS): { variant: true | "emulated"; fromTokens: number } | undefined {
  const mode = env.VKMOE_ATTENTION_COOPMAT;
  const fromTokens = (mode === "auto" ? MAX_ATTENTION_TOKENS : DECODE_ATTENTION_TOKENS) + 1;
  // a graph whose chunks never reach fromTokens: nowhere
  if (mode === "off" || maxTokens < fromTokens) return undefined;
  if (mode === "emulated") return { variant: "emulated", fromTokens };
  return device.enabled.cooperativeMatrix && matrixCoresPass(device) ? { variant: true, fromTokens } : undefined;
}

/** The matrix-core experts' slots a tile for calls of up to `tokens` tokens (bench:moe-ggml, H100: 32 the fastest at 256 and 512 tokens, 8 at 64). */
export function cmSlotsFor(tokens: number): number {
  return tokens >= 256 ? 32 : tokens >= 128 ? 16 : 8;
}
