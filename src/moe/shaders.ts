/** The grouped MoE pipelines (see shaders/moe.glsl): interface and creation per device, expert shape and GEMV path. */
import type { Device } from "../vk/device.ts";
import { ComputePipeline } from "../vk/pipeline.ts";
import { MOE_BINDINGS, MOE_FUSED_BINDINGS, MOE_FUSED_PUSH_BYTES, MOE_FUSED_SHARED_BINDINGS, MOE_FUSED_SHARED_PUSH_BYTES, MOE_IDP_BINDINGS, MOE_PUSH_BYTES, QUANTIZE_ACT, shaderFile } from "../kernels/shaders.ts";
import { specialization, type KernelConfig } from "../kernels/tuning.ts";
import type { ExpertShape } from "../pool/expert-layout.ts";
import type { Addressing } from "../pool/expert-pool.ts";

export const SUM_WORKGROUP = 256;
/** quantize_act's workgroup: a multiple of GROUP_SIZE / 4 for every group size (8..32). */
export const QUANTIZE_WORKGROUP = 64;
/** Lanes (= rows, one each) per workgroup of the rows kernels (moe_rows.glsl). */
export const ROWS_WORKGROUP = 64;
/** Slots per register chunk of the rows kernels (their spec constant 7). */
export const ROWS_TOKENS = 8;

/**
 * Slabs one dispatch can see on the descriptor path: the storage-buffer limit of a stage less the
 * other bindings of the widest of the layer's kernels (every set binds the same slab array).
 */
export function maxBoundSlabs(device: Device): number {
  const others = Math.max(MOE_BINDINGS, MOE_IDP_BINDINGS, MOE_FUSED_BINDINGS);
  return Math.max(1, Math.min(64, device.info.limits.maxPerStageDescriptorStorageBuffers - others));
}

/** The MoE layer's GEMV path: float dequantization, or int8 activations with packed integer dot products for gate+up. */
export type MoeGemvPath = "float" | "integer-dot";

/**
 * A layer call runs one of two recorded command buffers:
 *   "grouped" (any S): [quantize_act] -> gate+up -> down -> sum, each expert's weights read once
 *             whatever S is;
 *   "fused" (S <= the layer's fusedTokens): one dispatch, workgroup = (32 rows of I, slot): gate+up
 *             of its rows (on the integer-dot path with x quantized into shared memory by each
 *             workgroup, as quantize_act would), then its share of down added to the token's
 *             sums with float atomics; the last workgroup to finish writes y. Two to three dispatches
 *             fewer, but each slot reads its expert again, so it only pays for few tokens. Needs
 *             VK_EXT_shader_atomic_float (atomicAdd on float32 in storage buffers).
 */
export interface MoePipelines extends Disposable {
  /** Integer-dot path only: x -> int8 per group (xq, xscale, xsum). */
  quantize: ComputePipeline | undefined;
  gateUp: ComputePipeline;
  down: ComputePipeline;
  /**
   * Integer-dot path only: `down` over h quantized by `quantize` (bindings as `gateUp` on that
   * path: xq, work, pairs, ypair, slot weights, xscale, xsum). The graph stage's grouped calls run
   * it; the layer calls of GpuLayer keep the float `down`.
   */
  downIdp: ComputePipeline | undefined;
  sum: ComputePipeline;
  /**
   * gate+up and down for work lists grouped by expert (a prompt chunk's, several slots an item):
   * a row per lane (shaders/moe_rows.glsl), float path whatever `path` is (gate+up reads the float
   * x: no quantize). Bindings and push constants as `gateUp` / `down` on the float path; grid
   * (ceil(O / ROWS_WORKGROUP), items).
   */
  rowsGateUp: ComputePipeline;
  rowsDown: ComputePipeline;
  /** The one-dispatch call of few tokens; undefined without float atomics. */
  fused: ComputePipeline | undefined;
  /**
   * The same kernel submitted ahead of its call: it waits for the host's doorbell (see
   * shaders/moe_fused.glsl, PRELAUNCHED); undefined where `fused` is, or when not asked for.
   */
  fusedPrelaunched: ComputePipeline | undefined;
  /** Rows of I per workgroup of `fused` (a multiple of 32). */
  fusedBlockRows: number;
  /** Rows of D per workgroup of `down` (DOWN_KERNEL). */
  downBlockRows: number;
  maxSlabs: number;
  path: MoeGemvPath;
}

/**
 * Workgroup shape of the fused kernel: 256 threads, 32 rows of I per workgroup (8 row groups of 32
 * column threads, 4 rows each), so each workgroup owns one 32-column block of every down row.
 */
export interface FusedKernelShape { workgroupSize: number; rowsPerWorkgroup: number; colThreads: number; rowLanes: number }
export const FUSED_KERNEL: Readonly<FusedKernelShape> = { workgroupSize: 256, rowsPerWorkgroup: 32, colThreads: 32, rowLanes: 8 };

/**
 * Workgroup shape of the grouped down kernel, whatever the device's kernel config: down is stored
 * by column blocks (pool/expert-layout.ts), so each lane owns one row (32 consecutive rows per
 * 32 lanes: contiguous loads), and the 8 subgroup-sized slices of the workgroup split the columns.
 */
export const DOWN_KERNEL: Readonly<FusedKernelShape> = { workgroupSize: 256, rowsPerWorkgroup: 32, colThreads: 1, rowLanes: 32 };

/** Shared memory of moe_fused_*_idp (gemv_idp.glsl's FUSED arrays, the row reduction, hs, a flag) for D columns. */
export function fusedIdpSharedBytes(D: number, fk: FusedKernelShape): number {
  const words = Math.ceil(D / 16) * 4, groups = Math.ceil(D / 32);
  const rowsPerThread = fk.rowsPerWorkgroup / fk.rowLanes;
  return 4 * words * 2 + 4 * groups * 3 + 4 * fk.workgroupSize * rowsPerThread * 2 + 4 * fk.rowsPerWorkgroup + 4;
}

/** The fused kernel's shader (without the addressing suffix) and specialization. */
function fusedShader(device: Device, config: KernelConfig, shape: ExpertShape, path: MoeGemvPath, fk: FusedKernelShape, sharedSlot = false): { name: string; spec: Record<number, number> } {
  const spec = { ...specialization({ ...config, ...fk }, shape.scaleType === "f16", shape.groupSize), 9: shape.hidden };
  // The integer-dot fused kernel keeps its token's int8 x in shared memory; past the device's
  // limit (very wide D) the float one runs instead. The shared slot's gate sum takes a float a thread more.
  const extra = sharedSlot ? 4 * fk.workgroupSize : 0;
  const idp = path === "integer-dot" && fusedIdpSharedBytes(shape.hidden, fk) + extra <= device.info.limits.maxComputeSharedMemorySize;
  return { name: `moe_fused_${sharedSlot ? "shared_" : ""}${shape.format}${idp ? "_idp" : ""}`, spec };
}

/**
 * The fused kernel with a layer's shared expert as one more slot a token (moe_fused_shared_*, see
 * shaders/moe.glsl SHARED_SLOT): the graph's decode calls of a Qwen3.5 MoE layer whose shared
 * expert has the routed experts' shape. Where the layer's fused kernel exists (float atomics), with
 * BDA addressing (the shared blob is located by its address).
 */
export function createFusedSharedPipeline(device: Device, config: KernelConfig, shape: ExpertShape, path: MoeGemvPath): ComputePipeline {
  const { name, spec } = fusedShader(device, config, shape, path, FUSED_KERNEL, true);
  return new ComputePipeline(device, { spirv: shaderFile(`${name}_bda`), storageBuffers: MOE_FUSED_SHARED_BINDINGS, pushConstantBytes: MOE_FUSED_SHARED_PUSH_BYTES, specialization: spec });
}

/**
 * `prelaunchPolls`: 0 for no pre-launched pipeline, else how many times its kernel polls the
 * doorbell before it ends by itself without running (GATE_POLLS).
 */
export function createMoePipelines(device: Device, config: KernelConfig, shape: ExpertShape, addressing: Addressing, path: MoeGemvPath = "float", prelaunchPolls = 0, fusedKernel: Partial<FusedKernelShape> = {}): MoePipelines {
  const spec = specialization(config, shape.scaleType === "f16", shape.groupSize);
  const idp = path === "integer-dot";
  const maxSlabs = addressing === "descriptor" ? maxBoundSlabs(device) : 0;
  const make = (name: string, bindings: number, specs = spec, pushBytes = MOE_PUSH_BYTES) => {
    if (addressing === "bda") return new ComputePipeline(device, { spirv: shaderFile(`${name}_bda`), storageBuffers: bindings, pushConstantBytes: pushBytes, specialization: specs });
    return new ComputePipeline(device, {
      spirv: shaderFile(`${name}_desc`), storageBuffers: bindings + 1, pushConstantBytes: pushBytes,
      descriptorCounts: [...Array.from({ length: bindings }, () => 1), maxSlabs], specialization: { ...specs, 8: maxSlabs },
    });
  };
  const fk = { ...FUSED_KERNEL, ...fusedKernel };
  if (fk.rowsPerWorkgroup % 32 !== 0) throw new Error(`fused kernel: rowsPerWorkgroup must be a multiple of 32, got ${fk.rowsPerWorkgroup}`);
  // A later pipeline can fail (missing or bad .spv): destroy the ones made before it.
  const made: ComputePipeline[] = [];
  const keep = (p: ComputePipeline) => (made.push(p), p);
  try {
    const quantize = idp
      ? keep(new ComputePipeline(device, { spirv: shaderFile(QUANTIZE_ACT.name), storageBuffers: QUANTIZE_ACT.storageBuffers, pushConstantBytes: QUANTIZE_ACT.pushConstantBytes, specialization: { 0: QUANTIZE_WORKGROUP, 4: shape.groupSize } }))
      : undefined;
    const gateUp = keep(idp ? make(`moe_gateup_${shape.format}_idp`, MOE_IDP_BINDINGS) : make(`moe_gateup_${shape.format}`, MOE_BINDINGS));
    const downSpec = specialization({ ...config, ...DOWN_KERNEL }, shape.scaleType === "f16", shape.groupSize);
    const down = keep(make(`moe_down_${shape.format}`, MOE_BINDINGS, downSpec));
    const downIdp = idp ? keep(make(`moe_down_${shape.format}_idp`, MOE_IDP_BINDINGS, downSpec)) : undefined;
    const rowsSpec = { 0: ROWS_WORKGROUP, 3: shape.scaleType === "f16" ? 1 : 0, 4: shape.groupSize, 7: ROWS_TOKENS };
    const rowsGateUp = keep(make(`moe_rows_gateup_${shape.format}`, MOE_BINDINGS, rowsSpec));
    const rowsDown = keep(make(`moe_rows_down_${shape.format}`, MOE_BINDINGS, rowsSpec));
    const sum = keep(new ComputePipeline(device, { spirv: shaderFile("moe_sum"), storageBuffers: 5, pushConstantBytes: 4, specialization: { 0: SUM_WORKGROUP } }));
    const { name: fusedName, spec: fusedSpec } = fusedShader(device, config, shape, path, fk);
    const fused = device.enabled.bufferFloat32AtomicAdd ? keep(make(fusedName, MOE_FUSED_BINDINGS, fusedSpec, MOE_FUSED_PUSH_BYTES)) : undefined;
    const fusedPrelaunched = fused && prelaunchPolls > 0
      ? keep(make(fusedName, MOE_FUSED_BINDINGS, { ...fusedSpec, 10: 1, 11: prelaunchPolls }, MOE_FUSED_PUSH_BYTES))
      : undefined;
    return {
      quantize, gateUp, down, downIdp, rowsGateUp, rowsDown, sum, fused, fusedPrelaunched, fusedBlockRows: fk.rowsPerWorkgroup, downBlockRows: DOWN_KERNEL.rowsPerWorkgroup, maxSlabs, path,
      [Symbol.dispose]() {
        for (const p of made.reverse()) p[Symbol.dispose]();
      },
    };
  } catch (e) {
    for (const p of made.reverse()) p[Symbol.dispose]();
    throw e;
  }
}
