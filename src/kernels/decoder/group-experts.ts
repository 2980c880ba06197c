/**
 * The routed slots of a call regrouped by expert on the GPU (shaders/dec_group_experts.comp),
 * after dec_route: one work item per distinct chosen expert with its slots in `pairs`, so the
 * grouped MoE kernels read each expert's weights once per call (a prompt chunk of 64 tokens
 * chooses most experts several times). One workgroup, one dispatch; the items are laid out by a
 * prefix sum over the experts, in parallel.
 */
import { InvalidArgumentError } from "../../errors.ts";
import { CHUNK_MAX_TOKENS, MAX_EXPERTS, MAX_TOP_K } from "../../moe/routing.ts";
import type { CommandBuffer } from "../../vk/commands.ts";
import type { Device } from "../../vk/device.ts";
import type { Buffer } from "../../vk/memory.ts";
import type { ShaderInterface } from "../shaders.ts";
import { checkRange, DecoderKernel, pushWords, type DecoderKernelOptions } from "./common.ts";

/** Tokens a call takes at most (a graph's longest prompt chunk). */
export const GROUP_MAX_TOKENS = CHUNK_MAX_TOKENS;

/** chosen r, table `uvec2[]` r, work `uvec4[]` w, pairs w, slotWeight rw; push S, E, K, chosenOffset, tableOffset, seq, maxSlots: 28 B. */
export const DEC_GROUP_EXPERTS: ShaderInterface = { name: "dec_group_experts", storageBuffers: 5, pushConstantBytes: 28 };

/** Items a grouped list of S * k slots over E experts holds at most, with items of at most `maxSlots` slots (0: one item per expert). */
export function groupedItemsMax(S: number, E: number, k: number, maxSlots = 0): number {
  const slots = S * k;
  return maxSlots > 0 ? Math.min(slots, E + Math.floor(slots / maxSlots)) : Math.min(slots, E);
}

export interface GroupExpertsArgs {
  /** S*k expert ids at chosenOffset (dec_route's `chosen`; ids >= E: no expert). */
  chosen: Buffer;
  /** Expert handles, 2 words each: expert e's at uvec2 element tableOffset + e. */
  table: Buffer;
  /** Rewritten: header (S, k, items, seq), then one item (handle, pairStart, pairCount) per distinct expert (or per run of maxSlots of its slots), in id order. */
  work: Buffer;
  /** Rewritten: each item's slots (u = t*k + j) from its pairStart. */
  pairs: Buffer;
  /** Slots without an expert are set to 0 (the rest are left as dec_route wrote them). */
  slotWeight: Buffer;
  S: number;
  E: number;
  k: number;
  seq?: number;
  chosenOffset?: number;
  tableOffset?: number;
  /** An expert of more slots is split into items of at most this many (default 0: one item per expert); the list then holds up to groupedItemsMax items. */
  maxSlots?: number;
}

export interface GroupExpertsKernelOptions extends DecoderKernelOptions {
  /** Threads of the one workgroup, a power of two in 8..256 (default 256); each lays out ceil(512 / this) expert ids. */
  workgroupSize?: number;
}

export class GroupExpertsKernel extends DecoderKernel {
  constructor(device: Device, options: GroupExpertsKernelOptions = {}) {
    const wg = options.workgroupSize ?? 256;
    if (!Number.isInteger(wg) || wg < 8 || wg > 256 || (wg & (wg - 1)) !== 0) throw new InvalidArgumentError(`workgroupSize must be a power of two in 8..256, got ${wg}`);
    super(device, DEC_GROUP_EXPERTS, { 0: wg }, options);
  }

  /** Records one dispatch. The caller orders dec_route's writes before it and the MoE kernels' reads after. */
  record(cb: CommandBuffer, a: GroupExpertsArgs): CommandBuffer {
    const { S, E, k } = a;
    if (!Number.isInteger(S) || S < 1 || S > GROUP_MAX_TOKENS) throw new InvalidArgumentError(`S must be an integer in 1..${GROUP_MAX_TOKENS}, got ${S}`);
    if (!Number.isInteger(E) || E < 1 || E > MAX_EXPERTS) throw new InvalidArgumentError(`E must be an integer in 1..${MAX_EXPERTS}, got ${E}`);
    if (!Number.isInteger(k) || k < 1 || k > Math.min(MAX_TOP_K, E)) throw new InvalidArgumentError(`k must be an integer in 1..${Math.min(MAX_TOP_K, E)}, got ${k}`);
    const chosenOffset = a.chosenOffset ?? 0, tableOffset = a.tableOffset ?? 0, seq = a.seq ?? 0, maxSlots = a.maxSlots ?? 0;
    if (!Number.isInteger(maxSlots) || maxSlots < 0) throw new InvalidArgumentError(`maxSlots must be a non-negative integer, got ${maxSlots}`);
    const slots = S * k, items = groupedItemsMax(S, E, k, maxSlots);
    checkRange("group chosen", a.chosen, chosenOffset, slots);
    checkRange("group table", a.table, 2 * tableOffset, 2 * E);
    checkRange("group work", a.work, 0, 4 * (1 + items));
    checkRange("group pairs", a.pairs, 0, slots);
    checkRange("group slotWeight", a.slotWeight, 0, slots);
    const set = this.setFor([a.chosen, a.table, a.work, a.pairs, a.slotWeight]);
    return cb.bind(this.pipeline, set).pushConstants(this.pipeline, pushWords([S, E, k, chosenOffset, tableOffset, seq, maxSlots])).dispatch(1);
  }
}
