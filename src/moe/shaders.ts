/** The grouped MoE pipelines (see shaders/moe.glsl): interface and creation per device, expert shape and GEMV path. */
import type { Device } from "../vk/device.ts";
import { ComputePipeline } from "../vk/pipeline.ts";
import { MOE_BINDINGS, MOE_DOWN_SUM_BINDINGS, MOE_IDP_BINDINGS, MOE_PUSH_BYTES, QUANTIZE_ACT, shaderFile } from "../kernels/shaders.ts";
import { specialization, type KernelConfig } from "../kernels/tuning.ts";
import type { ExpertShape } from "../pool/expert-layout.ts";
import type { Addressing } from "../pool/expert-pool.ts";

export const SUM_WORKGROUP = 256;
/** quantize_act's workgroup: a multiple of GROUP_SIZE / 4 for every group size (8..32). */
export const QUANTIZE_WORKGROUP = 64;

/**
 * Slabs one dispatch can see on the descriptor path: the storage-buffer limit of a stage less the
 * other bindings of the widest of the layer's kernels (every set binds the same slab array).
 */
export function maxBoundSlabs(device: Device): number {
  const others = Math.max(MOE_BINDINGS, MOE_IDP_BINDINGS, MOE_DOWN_SUM_BINDINGS);
  return Math.max(1, Math.min(64, device.info.limits.maxPerStageDescriptorStorageBuffers - others));
}

/** The MoE layer's GEMV path: float dequantization, or int8 activations with packed integer dot products for gate+up. */
export type MoeGemvPath = "float" | "integer-dot";

/**
 * A layer call runs one of two recorded command buffers:
 *   "grouped" (any S): [quantize_act] -> gate+up -> down -> sum, each expert's weights read once
 *             whatever S is;
 *   "fused" (S <= the layer's fusedTokens): gate+up -> down_sum (each token's slots summed in one
 *             workgroup); on the integer-dot path the host quantizes x. One or two dispatches
 *             fewer, but a token's down weights are read per token, so it only pays for few tokens.
 */
export interface MoePipelines extends Disposable {
  /** Integer-dot path only: x -> int8 per group (xq, xscale, xsum). */
  quantize: ComputePipeline | undefined;
  gateUp: ComputePipeline;
  down: ComputePipeline;
  sum: ComputePipeline;
  downSum: ComputePipeline;
  maxSlabs: number;
  path: MoeGemvPath;
}

export function createMoePipelines(device: Device, config: KernelConfig, shape: ExpertShape, addressing: Addressing, path: MoeGemvPath = "float"): MoePipelines {
  const spec = specialization(config, shape.scaleType === "f16", shape.groupSize);
  const idp = path === "integer-dot";
  const maxSlabs = addressing === "descriptor" ? maxBoundSlabs(device) : 0;
  const make = (name: string, bindings: number) => {
    if (addressing === "bda") return new ComputePipeline(device, { spirv: shaderFile(`${name}_bda`), storageBuffers: bindings, pushConstantBytes: MOE_PUSH_BYTES, specialization: spec });
    return new ComputePipeline(device, {
      spirv: shaderFile(`${name}_desc`), storageBuffers: bindings + 1, pushConstantBytes: MOE_PUSH_BYTES,
      descriptorCounts: [...Array.from({ length: bindings }, () => 1), maxSlabs], specialization: { ...spec, 8: maxSlabs },
    });
  };
  // A later pipeline can fail (missing or bad .spv): destroy the ones made before it.
  const made: ComputePipeline[] = [];
  const keep = (p: ComputePipeline) => (made.push(p), p);
  try {
    const quantize = idp
      ? keep(new ComputePipeline(device, { spirv: shaderFile(QUANTIZE_ACT.name), storageBuffers: QUANTIZE_ACT.storageBuffers, pushConstantBytes: QUANTIZE_ACT.pushConstantBytes, specialization: { 0: QUANTIZE_WORKGROUP, 4: shape.groupSize } }))
      : undefined;
    const gateUp = keep(idp ? make(`moe_gateup_${shape.format}_idp`, MOE_IDP_BINDINGS) : make(`moe_gateup_${shape.format}`, MOE_BINDINGS));
    const down = keep(make(`moe_down_${shape.format}`, MOE_BINDINGS));
    const sum = keep(new ComputePipeline(device, { spirv: shaderFile("moe_sum"), storageBuffers: 5, pushConstantBytes: 4, specialization: { 0: SUM_WORKGROUP } }));
    const downSum = keep(make(`moe_down_sum_${shape.format}`, MOE_DOWN_SUM_BINDINGS));
    return {
      quantize, gateUp, down, sum, downSum, maxSlabs, path,
      [Symbol.dispose]() {
        for (const p of made.reverse()) p[Symbol.dispose]();
      },
    };
  } catch (e) {
    for (const p of made.reverse()) p[Symbol.dispose]();
    throw e;
  }
}
