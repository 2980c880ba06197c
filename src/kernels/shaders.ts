/** The compiled shaders and their host-side interface (bindings, push-constant sizes). See shaders/README.md. */
import { fileURLToPath } from "node:url";
import type { PipelineSpec } from "../vk/pipeline.ts";

export const shaderFile = (name: string) => fileURLToPath(new URL(`../../shaders/${name}.spv`, import.meta.url));

export interface ShaderInterface {
  name: string;
  storageBuffers: number;
  pushConstantBytes: number;
}

const iface = (name: string, storageBuffers: number, pushWords: number): ShaderInterface => ({ name, storageBuffers, pushConstantBytes: 4 * pushWords });

/** Float-path GEMV: weights, scales, x, y; push O, I, S, rowWords, groupsPerRow, weightOffset (uvec4), scaleOffset, xOffset, yOffset. */
export const GEMV = { q4: iface("gemv_q4", 4, 9), q8: iface("gemv_q8", 4, 9) } as const;
/** Fused gate+up: gate w/s, up w/s, x, h; push O, I, S, rowWords, groupsPerRow, gateW, gateS, upW, upS, xOffset, hOffset, limit. */
export const GATEUP = { q4: iface("gateup_q4", 6, 12), q8: iface("gateup_q8", 6, 12) } as const;
/** Activation quantization: x, xq, xscale, xsum; push I, S, groupsPerRow, xOffset, xqRowWords. */
export const QUANTIZE_ACT = iface("quantize_act", 4, 5);
/** Integer-dot GEMV: weights, wscales, xq, xscale, xsum, y; push O, I, S, rowWords, groupsPerRow, weightOffset, scaleOffset, xqRowWords, yOffset. */
export const GEMV_IDP = { q4: iface("gemv_q4_idp", 6, 9), q8: iface("gemv_q8_idp", 6, 9) } as const;

export function pipelineSpec(s: ShaderInterface, specialization: Record<number, number> = {}): PipelineSpec {
  return { spirv: shaderFile(s.name), storageBuffers: s.storageBuffers, pushConstantBytes: s.pushConstantBytes, specialization };
}

/** Every integer dot-product pipeline; the child-process probe creates each before the path is enabled. */
export const IDP_PIPELINES: PipelineSpec[] = [QUANTIZE_ACT, GEMV_IDP.q4, GEMV_IDP.q8].flatMap((s) =>
  [32, 128].map((g) => pipelineSpec(s, { 4: g })));
