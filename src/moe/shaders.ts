/** The grouped MoE pipelines (see shaders/moe.glsl): interface and creation per device and expert shape. */
import type { Device } from "../vk/device.ts";
import { ComputePipeline } from "../vk/pipeline.ts";
import { shaderFile } from "../kernels/shaders.ts";
import { specialization, type KernelConfig } from "../kernels/tuning.ts";
import type { ExpertShape } from "../pool/expert-layout.ts";
import type { Addressing } from "../pool/expert-pool.ts";

/** x/h, work, pairs, out, slotWeight (+ the slab array on the descriptor path). */
export const MOE_BINDINGS = 5;
export const MOE_PUSH_BYTES = 36;
export const SUM_WORKGROUP = 256;

/** Slabs one dispatch can see on the descriptor path: the stage's storage-buffer limit less the 5 other bindings. */
export function maxBoundSlabs(device: Device): number {
  return Math.max(1, Math.min(64, device.info.limits.maxPerStageDescriptorStorageBuffers - MOE_BINDINGS));
}

export interface MoePipelines extends Disposable {
  gateUp: ComputePipeline;
  down: ComputePipeline;
  sum: ComputePipeline;
  maxSlabs: number;
}

export function createMoePipelines(device: Device, config: KernelConfig, shape: ExpertShape, addressing: Addressing): MoePipelines {
  const spec = specialization(config, shape.scaleType === "f16", shape.groupSize);
  const maxSlabs = addressing === "descriptor" ? maxBoundSlabs(device) : 0;
  const make = (kind: "gateup" | "down") => {
    const name = `moe_${kind}_${shape.format}_${addressing === "bda" ? "bda" : "desc"}`;
    if (addressing === "bda") return new ComputePipeline(device, { spirv: shaderFile(name), storageBuffers: MOE_BINDINGS, pushConstantBytes: MOE_PUSH_BYTES, specialization: spec });
    return new ComputePipeline(device, {
      spirv: shaderFile(name), storageBuffers: MOE_BINDINGS + 1, pushConstantBytes: MOE_PUSH_BYTES,
      descriptorCounts: [1, 1, 1, 1, 1, maxSlabs], specialization: { ...spec, 8: maxSlabs },
    });
  };
  // A later pipeline can fail (missing or bad .spv): destroy the ones made before it.
  const made: ComputePipeline[] = [];
  try {
    const gateUp = make("gateup");
    made.push(gateUp);
    const down = make("down");
    made.push(down);
    const sum = new ComputePipeline(device, { spirv: shaderFile("moe_sum"), storageBuffers: 4, pushConstantBytes: 4, specialization: { 0: SUM_WORKGROUP } });
    return {
      gateUp, down, sum, maxSlabs,
      [Symbol.dispose]() {
        sum[Symbol.dispose]();
        down[Symbol.dispose]();
        gateUp[Symbol.dispose]();
      },
    };
  } catch (e) {
    for (const p of made.reverse()) p[Symbol.dispose]();
    throw e;
  }
}
