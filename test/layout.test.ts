import { describe, expect, test } from "bun:test";
import { StructLayout, LayoutError, array } from "../src/vk/layout.ts";
import { VkApplicationInfo, VkBufferCopy, VkPhysicalDeviceLimits, VkWriteDescriptorSet } from "../src/vk/structs.ts";
import { allLayouts, compareLayouts, compareSTypes, compileProbe } from "./cases/layout.ts";

describe("struct layouts against vulkan_core.h", () => {
  const layouts = allLayouts();
  const facts = compileProbe(layouts);

  test("every declared struct: size, alignment, every field's offset and size", () => {
    expect(layouts.length).toBeGreaterThan(60);
    expect(compareLayouts(layouts, facts)).toEqual([]);
  });

  test("every default sType matches vk.xml", () => {
    expect(compareSTypes(layouts)).toEqual([]);
  });

  test("negative control: a 64-bit handle declared as 32 bits is caught", () => {
    // The classic FFI bug: VkWriteDescriptorSet.dstSet (a non-dispatchable handle) as u32.
    const spec = Object.fromEntries(VkWriteDescriptorSet.fields.map((f) => [f.name, f.name === "dstSet" ? "u32" : f.type]));
    const broken = new StructLayout("VkWriteDescriptorSet", spec as any);
    const problems = compareLayouts([broken], facts);
    expect(problems).toContain("VkWriteDescriptorSet.dstSet size: ours 4, C 8");
    expect(problems).toContain("VkWriteDescriptorSet.dstBinding offset: ours 20, C 24");
  });

  test("negative control: an array declared one element short is caught", () => {
    const spec = Object.fromEntries(VkPhysicalDeviceLimits.fields.map((f) => [f.name, f.name === "maxComputeWorkGroupCount" ? array("u32", 2) : f.type]));
    const problems = compareLayouts([new StructLayout("VkPhysicalDeviceLimits", spec)], facts);
    expect(problems).toContain("VkPhysicalDeviceLimits.maxComputeWorkGroupInvocations offset: ours 228, C 232");
  });
});

describe("layout writers reject bad values before C sees them", () => {
  const dv = new DataView(new ArrayBuffer(1024));
  test("unknown field", () => {
    expect(() => VkBufferCopy.write(dv, 0, { sizee: 1n })).toThrow(LayoutError);
  });
  test("number where a 64-bit bigint is required", () => {
    expect(() => VkBufferCopy.write(dv, 0, { size: 16 })).toThrow(/expected a bigint/);
  });
  test("u32 out of range, negative, fractional", () => {
    expect(() => VkApplicationInfo.write(dv, 0, { apiVersion: 2 ** 32 })).toThrow(/out of range/);
    expect(() => VkApplicationInfo.write(dv, 0, { apiVersion: -1 })).toThrow(/out of range/);
    expect(() => VkApplicationInfo.write(dv, 0, { apiVersion: 1.5 })).toThrow(/integer/);
  });
  test("array longer than declared", () => {
    expect(() => VkPhysicalDeviceLimits.write(dv, 0, { maxComputeWorkGroupCount: [1, 2, 3, 4] })).toThrow(/exceed/);
  });
  test("struct written past the end of its buffer", () => {
    expect(() => VkWriteDescriptorSet.write(new DataView(new ArrayBuffer(32)), 0, {})).toThrow(/does not fit/);
  });
  test("nothing is written when a later field is bad", () => {
    const view = new DataView(new ArrayBuffer(64));
    expect(() => VkBufferCopy.write(view, 0, { srcOffset: 7n, size: "x" })).toThrow(LayoutError);
    expect(view.getBigUint64(0, true)).toBe(0n);
  });
  test("round trip of values, u64 above 2^53 exact", () => {
    const big = (1n << 63n) + 12345n;
    VkBufferCopy.write(dv, 8, { srcOffset: big, dstOffset: 1n, size: 2n });
    expect(VkBufferCopy.read(dv, 8)).toEqual({ srcOffset: big, dstOffset: 1n, size: 2n });
  });
});
