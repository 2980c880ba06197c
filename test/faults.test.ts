import { describe, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  Buffer, CommandPool, ComputePipeline, DescriptorPool, Fence, NoDeviceError, ShaderFileError, Submission,
  VK_ACCESS_SHADER_READ_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
} from "../src/vk/index.ts";
import { VkMemoryBarrier } from "../src/vk/structs.ts";
import { finish, openTestContext, ValidationFailure } from "./support/gpu.ts";
import { repoRoot, shaderPath } from "./support/paths.ts";
import { runProcess, runtimeExecutable } from "./support/proc.ts";
import { selectDevice } from "../src/vk/select.ts";

function openInChild(env: Record<string, string>) {
  const r = runProcess([runtimeExecutable(), join(repoRoot, "test/fixtures/open-context.ts")], { env });
  expect(r.signal).toBeNull();
  expect(r.code).toBe(0);
  return JSON.parse(r.stdout.trim().split("\n").at(-1)!);
}

describe("faults give typed errors, never crashes", () => {
  test("control: the child opens a device with the normal environment", () => {
    expect(openInChild({}).ok).toBe(true);
  });

  test("no loader: VKMOE_LOADER pointing at a missing file", () => {
    const r = openInChild({ VKMOE_LOADER: "/nonexistent/libvulkan.so.1" });
    expect(r).toMatchObject({ ok: false, name: "NoLoaderError", code: "NO_LOADER" });
    expect(r.tried[0]).toStartWith("/nonexistent/libvulkan.so.1");
    expect(r.message).toContain("/nonexistent/libvulkan.so.1");
  });

  test("a loader but no device: the ICD list points nowhere", () => {
    const r = openInChild({ VK_DRIVER_FILES: "/nonexistent/icd.json", VK_ICD_FILENAMES: "/nonexistent/icd.json" });
    expect(r).toMatchObject({ ok: false, code: "NO_DEVICE" });
  });

  test("VKMOE_DEVICE that matches nothing", () => {
    const r = openInChild({ VKMOE_DEVICE: "no-such-gpu" });
    expect(r).toMatchObject({ ok: false, name: "NoDeviceError" });
    expect(r.message).toContain("VKMOE_DEVICE=no-such-gpu matches none of");
  });

  test("an invalid VKMOE_* variable is a typed config error", () => {
    const r = openInChild({ VKMOE_STAGED: "sometimes" });
    expect(r).toMatchObject({ ok: false, name: "ConfigError" });
    expect(r.message).toContain("VKMOE_STAGED");
  });
});

describe("SPIR-V files are checked before pipeline creation", () => {
  const dir = mkdtempSync(join(tmpdir(), "vkmoe-spv-"));
  const good = readFileSync(shaderPath("saxpy"));
  const cases: [string, Uint8Array | null, RegExp][] = [
    ["missing", null, /cannot read \(ENOENT\)/],
    ["empty", new Uint8Array(0), /shorter than a SPIR-V header/],
    ["cut mid-word", good.subarray(0, good.length - 3), /not a whole number of words/],
    ["cut mid-instruction", good.subarray(0, good.length - 8), /truncated/],
    ["not SPIR-V", new TextEncoder().encode("#version 450\nvoid main(){}\n".padEnd(64, " ")), /bad magic/],
  ];
  for (const [what, bytes, why] of cases) {
    test(`${what} .spv: ShaderFileError naming the file, and no Vulkan object left behind`, () => {
      const path = join(dir, `${what.replace(/ /g, "-")}.spv`);
      if (bytes) writeFileSync(path, bytes);
      const ctx = openTestContext();
      try {
        let err: unknown;
        try {
          new ComputePipeline(ctx.device, { spirv: path, storageBuffers: 2, pushConstantBytes: 12 });
        } catch (e) {
          err = e;
        }
        expect(err).toBeInstanceOf(ShaderFileError);
        expect((err as ShaderFileError).path).toBe(path);
        expect((err as Error).message).toContain(path);
        expect((err as Error).message).toMatch(why);
      } finally {
        finish(ctx); // a leaked set layout would be a validation message here
      }
    });
  }
  test("control: the intact copy loads", () => {
    const path = join(dir, "intact.spv");
    copyFileSync(shaderPath("saxpy"), path);
    const ctx = openTestContext();
    try {
      using _ = new ComputePipeline(ctx.device, { spirv: path, storageBuffers: 2, pushConstantBytes: 12 });
    } finally {
      finish(ctx);
    }
  });
});

describe("the validation gate", () => {
  test("negative control: a leaked buffer is reported at device destruction and fails the test", () => {
    const ctx = openTestContext();
    new Buffer(ctx.device, { size: 256n, memory: "device" }); // deliberately never disposed
    expect(() => finish(ctx)).toThrow(ValidationFailure);
  });
  // The invalid call still reaches the driver after the layer reports it, so it must be one drivers
  // shrug off: a dispatch without a bound pipeline (the control used before) crashed NVIDIA 580 while
  // recording; an access mask that the barrier's source stage cannot perform is ignored by drivers.
  test("negative control: invalid usage (a barrier whose source stage cannot do its access) is reported", () => {
    const ctx = openTestContext();
    {
      using pool = new CommandPool(ctx.device);
      const cb = pool.allocate().begin();
      const a = ctx.device.arena;
      using _ = a.scope();
      const mb = a.alloc(VkMemoryBarrier.size);
      VkMemoryBarrier.write(a.view, mb, { srcAccessMask: VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask: VK_ACCESS_SHADER_READ_BIT });
      // TRANSFER cannot perform SHADER_WRITE (VUID-vkCmdPipelineBarrier-srcAccessMask-02815)
      ctx.device.vk.vkCmdPipelineBarrier(cb.handle, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, a.address(mb), 0, 0n, 0, 0n);
      cb.end();
    }
    expect(() => finish(ctx)).toThrow(/srcAccessMask/);
  });
});

describe("synchronization validation", () => {
  test("negative control: a dispatch reading what the previous one wrote, without a barrier, is reported", () => {
    const ctx = openTestContext({ syncValidation: true });
    {
      const dev = ctx.device;
      using x = new Buffer(dev, { size: 256n, memory: "upload" });
      using y = new Buffer(dev, { size: 256n, memory: "readback" });
      using p = new ComputePipeline(dev, { spirv: shaderPath("saxpy"), storageBuffers: 2, pushConstantBytes: 12, specialization: { 0: 64 } });
      using z = new Buffer(dev, { size: 256n, memory: "readback" });
      using pool = new DescriptorPool(dev, 2, 4);
      const first = pool.allocate(p, [{ buffer: x }, { buffer: y }]);
      const second = pool.allocate(p, [{ buffer: y }, { buffer: z }]);
      using commands = new CommandPool(dev);
      const pc = new Uint32Array([64, 0, 0]);
      const cb = commands.allocate().begin().bind(p, first).pushConstants(p, pc).dispatch(1).bind(p, second).dispatch(1).barrier("computeToHost").end();
      using fence = new Fence(dev);
      using submission = new Submission(dev, [cb], { fence });
      submission.submit();
      fence.wait();
    }
    expect(() => finish(ctx)).toThrow(/SYNC-HAZARD-READ-AFTER-WRITE/);
  });
});

describe("device selection", () => {
  const fake = (index: number, type: number, name: string, mib: number): any => ({
    index, type, name, uuid: index.toString(16).padStart(32, "0"), apiVersion: (1 << 22) | (3 << 12),
    queueFamilies: [{ index: 0, flags: 0x7, count: 1, timestampValidBits: 64 }], features: { timelineSemaphore: true },
    deviceLocalBytes: BigInt(mib) << 20n,
  });
  const devices = [fake(0, 4, "llvmpipe", 2048), fake(1, 1, "Radeon 780M", 512), fake(2, 2, "RTX 3070", 8192), fake(3, 2, "H200", 143000)];
  test("discrete > integrated > cpu, then more device-local memory", () => {
    expect(selectDevice(devices).name).toBe("H200");
    expect(selectDevice(devices.slice(0, 2)).name).toBe("Radeon 780M");
  });
  test("VKMOE_DEVICE by index, UUID (with dashes) and name substring", () => {
    expect(selectDevice(devices, "0").name).toBe("llvmpipe");
    expect(selectDevice(devices, "00000000-0000-0000-0000-000000000002").name).toBe("RTX 3070");
    expect(selectDevice(devices, "radeon").name).toBe("Radeon 780M");
  });
  test("a device without Vulkan 1.2 or a compute queue is never chosen", () => {
    const old = { ...fake(4, 2, "old", 99999), apiVersion: 1 << 22 };
    const noCompute = { ...fake(5, 2, "gfx-only", 99999), queueFamilies: [{ index: 0, flags: 0x1, count: 1 }] };
    expect(selectDevice([old, noCompute, devices[0]]).name).toBe("llvmpipe");
    expect(() => selectDevice([old])).toThrow(NoDeviceError);
    expect(() => selectDevice([noCompute], "gfx")).toThrow(/VK_QUEUE_COMPUTE_BIT/);
  });
});
