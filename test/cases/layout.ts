/**
 * Proves every struct declared through src/vk/layout.ts against the C compiler: a probe compiled
 * against /usr/include/vulkan/vulkan_core.h prints sizeof/alignof and each field's offsetof/sizeof.
 * Also checks each struct's default sType against vk.xml.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { registry, type StructLayout } from "../../src/vk/layout.ts";
import "../../src/vk/structs.ts";
import { runProcess } from "../support/proc.ts";

export const VULKAN_HEADER = "/usr/include/vulkan/vulkan_core.h";
export const VK_XML = "/usr/share/vulkan/registry/vk.xml";

export type CFacts = Map<string, number>;

/**
 * Structs of extensions newer than Debian 12's header and vk.xml (1.3.239): their C definitions and
 * sType values as the Khronos registry gives them (Vulkan-Headers 1.3.255+, VK_KHR_cooperative_matrix;
 * enums written as uint32_t, their size), used only where the installed header lacks the extension.
 */
const NEWER_THAN_HEADER: { extension: string; c: string; sTypes: Record<string, number> }[] = [{
  extension: "VK_KHR_cooperative_matrix",
  c: `typedef struct VkCooperativeMatrixPropertiesKHR { VkStructureType sType; void* pNext; uint32_t MSize; uint32_t NSize; uint32_t KSize;
  uint32_t AType; uint32_t BType; uint32_t CType; uint32_t ResultType; VkBool32 saturatingAccumulation; uint32_t scope; } VkCooperativeMatrixPropertiesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR { VkStructureType sType; void* pNext; VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess; } VkPhysicalDeviceCooperativeMatrixFeaturesKHR;`,
  sTypes: { VkPhysicalDeviceCooperativeMatrixFeaturesKHR: 1000506000, VkCooperativeMatrixPropertiesKHR: 1000506001 },
}];

export function probeSource(layouts: Iterable<StructLayout>): string {
  const lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <vulkan/vulkan_core.h>"];
  for (const n of NEWER_THAN_HEADER) lines.push(`#ifndef ${n.extension}`, n.c, "#endif");
  lines.push("int main(void) {");
  for (const s of layouts) {
    lines.push(`  printf("%s size %zu\\n", "${s.name}", sizeof(${s.name}));`);
    lines.push(`  printf("%s align %zu\\n", "${s.name}", _Alignof(${s.name}));`);
    for (const f of s.fields) {
      lines.push(`  printf("%s.%s offset %zu\\n", "${s.name}", "${f.name}", offsetof(${s.name}, ${f.name}));`);
      lines.push(`  printf("%s.%s size %zu\\n", "${s.name}", "${f.name}", sizeof(((${s.name}*)0)->${f.name}));`);
    }
  }
  lines.push("  return 0;", "}");
  return lines.join("\n");
}

/** Compiles and runs the probe with the system C compiler; returns "Name[.field] what" -> value. */
export function compileProbe(layouts: Iterable<StructLayout>): CFacts {
  if (!existsSync(VULKAN_HEADER)) throw new Error(`${VULKAN_HEADER} missing: install libvulkan-dev`);
  const dir = mkdtempSync(join(tmpdir(), "vkmoe-layout-"));
  try {
    const src = join(dir, "probe.c");
    const exe = join(dir, "probe");
    writeFileSync(src, probeSource(layouts));
    const cc = runProcess(["cc", "-std=c11", "-o", exe, src]);
    if (cc.code !== 0) throw new Error(`cc failed:\n${cc.stderr}`);
    const run = runProcess([exe]);
    if (run.code !== 0) throw new Error(`probe failed: ${run.stderr}`);
    const facts: CFacts = new Map();
    for (const line of run.stdout.trim().split("\n")) {
      const [key, what, value] = line.split(" ");
      facts.set(`${key} ${what}`, Number(value));
    }
    return facts;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Every disagreement between our layouts and C, as readable lines (empty = all agree). */
export function compareLayouts(layouts: Iterable<StructLayout>, facts: CFacts): string[] {
  const problems: string[] = [];
  const expect = (key: string, ours: number) => {
    const c = facts.get(key);
    if (c === undefined) problems.push(`${key}: not in the C probe`);
    else if (c !== ours) problems.push(`${key}: ours ${ours}, C ${c}`);
  };
  for (const s of layouts) {
    expect(`${s.name} size`, s.size);
    expect(`${s.name} align`, s.align);
    for (const f of s.fields) {
      expect(`${s.name}.${f.name} offset`, f.offset);
      expect(`${s.name}.${f.name} size`, f.size);
    }
  }
  return problems;
}

/** Structs whose default sType differs from vk.xml's `values=` for their sType member. */
export function compareSTypes(layouts: Iterable<StructLayout>): string[] {
  const xml = readFileSync(VK_XML, "utf8");
  const header = readFileSync(VULKAN_HEADER, "utf8");
  const problems: string[] = [];
  for (const s of layouts) {
    const hasSType = s.fields.some((f) => f.name === "sType");
    const block = new RegExp(`<type category="struct" name="${s.name}"[^>]*>([\\s\\S]*?)</type>\\s*(?=<type|<comment|</types>)`).exec(xml)?.[1] ?? "";
    const named = /values="(VK_STRUCTURE_TYPE_\w+)"/.exec(block)?.[1];
    if (!hasSType) continue;
    if (!named) {
      const newer = NEWER_THAN_HEADER.find((n) => s.name in n.sTypes)?.sTypes[s.name];
      if (newer === undefined) problems.push(`${s.name}: no sType value in vk.xml`);
      else if (newer !== s.defaults.sType) problems.push(`${s.name}: sType ours ${String(s.defaults.sType)}, the registry's ${newer}`);
      continue;
    }
    const value = new RegExp(`\\b${named} = (-?\\d+)`).exec(header)?.[1];
    if (value === undefined) problems.push(`${s.name}: ${named} not in the header`);
    else if (Number(value) !== s.defaults.sType) problems.push(`${s.name}: sType ours ${String(s.defaults.sType)}, ${named} = ${value}`);
  }
  return problems;
}

export const allLayouts = () => [...registry.values()];
