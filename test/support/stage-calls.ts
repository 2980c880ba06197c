/** One graph stage call at a time, as the graphs record it, for the tests of QuantGraphStage's kernels (moe-rows-gpu, moe-pool-cm). */
import { submitAndWait } from "../../src/kernels/decoder/index.ts";
import type { QuantGraphStage } from "../../src/moe/graph-stage.ts";
import type { Device } from "../../src/vk/device.ts";
import { Buffer } from "../../src/vk/memory.ts";
import { uploadBytes } from "../../src/vk/transfer.ts";
import { expectTail, f32, hostBuffer } from "./host-buffers.ts";

/** x and the router's choices (host-visible) and y (with sentinels past it) for calls of up to maxS tokens of D columns, K slots a token. */
export class StageCalls implements Disposable {
  private readonly x: Buffer;
  private readonly chosen: Buffer;
  private readonly y: Buffer;

  constructor(private readonly device: Device, private readonly maxS: number, private readonly D: number, private readonly K: number) {
    this.x = new Buffer(device, { size: BigInt(4 * maxS * D), memory: "upload" });
    this.chosen = new Buffer(device, { size: BigInt(4 * maxS * K), memory: "upload" });
    this.y = hostBuffer(device, maxS * D);
  }

  /** Writes a call's inputs (x, the chosen ids) for `stages` to share. */
  write(S: number, xs: Float32Array, chosen: Uint32Array): void {
    new Float32Array(this.x.host(), 0, S * this.D).set(xs);
    new Uint32Array(this.chosen.host(), 0, S * this.K).set(chosen);
  }

  /**
   * One call of `stage` over the written inputs: the slot weights dec_route would leave uploaded
   * (the work list comes from dec_group_experts), y filled with NaN first, the sentinels past it
   * checked after. Returns a copy of its S rows.
   */
  run(stage: QuantGraphStage, S: number, weights: Float32Array, label: string): Float32Array {
    uploadBytes(this.device, stage.slotWeight, 0n, new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength));
    new Float32Array(this.y.host(), 0, this.maxS * this.D).fill(Number.NaN);
    submitAndWait(this.device, (cb) => stage.record(cb, this.x, this.y, S, { chosen: this.chosen, chosenOffset: 0, layer: 0 }));
    expectTail(this.y, this.maxS * this.D, label);
    return Float32Array.from(f32(this.y, S * this.D));
  }

  [Symbol.dispose](): void {
    this.y[Symbol.dispose]();
    this.chosen[Symbol.dispose]();
    this.x[Symbol.dispose]();
  }
}
