/** The expert pool on the real driver: slab limits, uploads for each memory model, OOM, budget, teardown. */
import { describe, expect, test } from "bun:test";
import { computeBudget } from "../src/pool/budget.ts";
import { ExpertPool } from "../src/pool/expert-pool.ts";
import { expertLayout, packExpert, type ExpertShape } from "../src/pool/expert-layout.ts";
import { slabLimits } from "../src/pool/vulkan-slabs.ts";
import { quantize, randomGaussianF32 } from "../src/quant/index.ts";
import { downloadBytes } from "../src/vk/transfer.ts";
import { finish, openTestContext } from "./support/gpu.ts";

const shape: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 256, intermediate: 96 };
const layout = expertLayout(shape);

function blob(seed: number): Uint8Array {
  const q = (rows: number, cols: number, s: number) => quantize({ dtype: "f32", data: randomGaussianF32(rows * cols, s) }, rows, cols, shape);
  const out = new Uint8Array(layout.bytes);
  packExpert(layout, q(96, 256, seed), q(96, 256, seed + 1), q(256, 96, seed + 2), out);
  return out;
}

describe("slab limits", () => {
  test("descriptor path slabs fit maxStorageBufferRange; device-address slabs fit the allocation limit", () => {
    const ctx = openTestContext();
    try {
      const l = ctx.device.info.limits;
      const desc = slabLimits(ctx.device, false);
      const bda = slabLimits(ctx.device, true);
      expect(desc.maxSlabBytes).toBeLessThanOrEqual(l.maxStorageBufferRange);
      expect(BigInt(bda.maxSlabBytes)).toBeLessThanOrEqual(l.maxMemoryAllocationSize);
      expect(bda.alignment % Number(l.minStorageBufferOffsetAlignment)).toBe(0);
    } finally {
      finish(ctx);
    }
  });
});

for (const staged of ["on", "off"] as const) {
  describe(`uploads, VKMOE_STAGED=${staged}`, () => {
    test("typed-array and callback sources land byte for byte; stats count them", () => {
      const ctx = openTestContext({ staged });
      try {
        if (staged === "on") expect(ctx.device.memory.model).toBe("staged");
        else expect(ctx.device.memory.model).not.toBe("staged");
        using pool = new ExpertPool(ctx.device, { shape, budgetBytes: 8 * layout.bytes, slabBytes: 1 << 20 });
        const sources = [0, 1, 2, 3].map((i) => blob(10 * i + 1));
        pool.ensure(0, 0, sources[0]);
        pool.ensure(0, 1, (dest: Uint8Array) => dest.set(sources[1]!));
        pool.ensure(1, 0, { byteLength: layout.bytes, fill: (dest: Uint8Array) => dest.set(sources[2]!) });
        pool.ensure(1, 1, sources[3]);
        pool.flush();
        const keys: [number, number][] = [[0, 0], [0, 1], [1, 0], [1, 1]];
        keys.forEach(([l, e], i) => {
          const r = pool.cache.get(l, e)!;
          const loc = pool.locate(r.allocation);
          expect(downloadBytes(ctx.device, loc.slab.buffer, BigInt(loc.offset), layout.bytes)).toEqual(sources[i]!);
          expect(loc.offset % 256).toBe(0);
        });
        const s = pool.stats();
        expect(s.misses).toBe(4);
        expect(s.bytesUploaded).toBe(4 * layout.bytes);
        pool.ensure(0, 0, sources[0]);
        expect(pool.stats().hits).toBe(1);
      } finally {
        finish(ctx);
      }
    });
  });
}

describe("out of device memory", () => {
  test("an injected slab failure evicts and retries, and the budget shrinks instead of crashing", () => {
    const ctx = openTestContext();
    try {
      // One expert per slab, so a failed slab allocation can only be met by evicting.
      using pool = new ExpertPool(ctx.device, { shape, budgetBytes: 3 * layout.bytes, slabBytes: layout.bytes, spareSlabs: 0 });
      pool.ensure(0, 0, blob(1));
      pool.ensure(0, 1, blob(2));
      pool.provider.failNext(1);
      const r = pool.ensure(0, 2, blob(3));
      expect(r.resident).toBe(true);
      const s = pool.stats();
      expect(s.oomEvents).toBe(1);
      expect(s.evictions).toBe(1);
      expect(s.budget).toBeLessThan(3 * layout.bytes);
      expect(pool.cache.has(0, 2)).toBe(true);
    } finally {
      finish(ctx);
    }
  });
});

describe("budget", () => {
  test("VKMOE_BUDGET_MB wins; unified memory takes min(heap, host available), never the sum", () => {
    const ctx = openTestContext();
    try {
      expect(computeBudget(ctx.device, { overrideMB: 300 })).toMatchObject({ bytes: 300 * 2 ** 20 });
      if (ctx.device.memory.model !== "unified") {
        // A discrete device: the budget comes from VK_EXT_memory_budget (or the heap) minus a reserve.
        const b = computeBudget(ctx.device, { hostAvailable: 1 });
        expect(b.bytes).toBeGreaterThan(0);
        expect(b.bytes).toBeLessThan(Number(ctx.device.info.heaps[ctx.device.info.types[ctx.device.memory.deviceType]!.heap]!.size));
        console.log(`budget on this ${ctx.device.memory.model} device: ${b.why} (the unified-memory rule is covered on Lavapipe)`);
        return;
      }
      const heap = Number(ctx.device.info.heaps[0]!.size);
      const small = computeBudget(ctx.device, { hostAvailable: 1 << 30 });
      expect(small.bytes).toBe((1 << 30) - Math.max(256 * 2 ** 20, Math.floor((1 << 30) * 0.1)));
      const big = computeBudget(ctx.device, { hostAvailable: 64 * 2 ** 30 });
      expect(big.bytes).toBeLessThanOrEqual(heap);
      expect(big.why).toContain("unified memory");
    } finally {
      finish(ctx);
    }
  });
});
