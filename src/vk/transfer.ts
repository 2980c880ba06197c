/** One-off copies between host bytes and a buffer: direct when mapped, through a staging buffer otherwise. */
import { VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT } from "./constants.ts";
import { CommandPool } from "./commands.ts";
import type { Device } from "./device.ts";
import { Buffer } from "./memory.ts";
import { Fence, Submission } from "./sync.ts";

function copyOnce(device: Device, record: (cb: ReturnType<CommandPool["allocate"]>) => void): void {
  using pool = new CommandPool(device);
  const cb = pool.allocate().begin(VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT);
  record(cb);
  cb.end();
  using fence = new Fence(device);
  using submission = new Submission(device, [cb], { fence });
  submission.submit();
  fence.wait();
}

/** Writes `data` at `offset` of `dst`. Setup-time helper (it waits), not for hot paths. */
export function uploadBytes(device: Device, dst: Buffer, offset: bigint, data: Uint8Array): void {
  if (dst.mapped) {
    new Uint8Array(dst.mapped, Number(offset), data.byteLength).set(data);
    return;
  }
  using staging = new Buffer(device, { size: BigInt(Math.max(4, data.byteLength)), memory: "upload" });
  new Uint8Array(staging.host()).set(data);
  copyOnce(device, (cb) => cb.copyBuffer(staging, dst, BigInt(data.byteLength), 0n, offset).barrier("transferToCompute"));
}

/** Reads `length` bytes at `offset` of `src`. */
export function downloadBytes(device: Device, src: Buffer, offset: bigint, length: number): Uint8Array {
  if (src.mapped) return new Uint8Array(src.mapped, Number(offset), length).slice();
  using staging = new Buffer(device, { size: BigInt(Math.max(4, length)), memory: "readback" });
  copyOnce(device, (cb) => cb.barrier("computeToTransfer").copyBuffer(src, staging, BigInt(length), offset, 0n).barrier("transferToHost"));
  return new Uint8Array(staging.host(), 0, length).slice();
}
