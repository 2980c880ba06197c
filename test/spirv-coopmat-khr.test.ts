/**
 * The NV -> KHR cooperative-matrix SPIR-V rewrite (scripts/lib/spirv-coopmat-khr.ts) that makes the
 * matrix-core GEMMs' NAME_cmk.spv. This spirv-val (2023.1) does not know the KHR extension, so the
 * rewritten modules are checked here instruction by instruction against the rules of
 * SPV_KHR_cooperative_matrix: no NV instruction or capability left, each matrix type's use the role its
 * MulAdds give it (A: the 16 x 16 f16 weights, B: the 16 x 8 f16 tokens, accumulator: the f32 16 x 8),
 * each load's and store's layout the NV column-major flag it replaced (in order), every id below the bound.
 * Negative controls: a shader that uses one matrix type as both A and B, a module without cooperative
 * matrices and bytes that are not SPIR-V are each refused with a SpirvRewriteError.
 */
import { describe, expect, test } from "bun:test";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { nvToKhrCoopmat, SpirvRewriteError } from "../scripts/lib/spirv-coopmat-khr.ts";
import { shaderFile } from "../src/kernels/shaders.ts";

interface Ins { op: number; w: number[] }
function parse(words: Uint32Array): { bound: number; body: Ins[] } {
  const body: Ins[] = [];
  for (let i = 5; i < words.length; i += words[i]! >>> 16) body.push({ op: words[i]! & 0xffff, w: Array.from(words.subarray(i + 1, i + (words[i]! >>> 16))) });
  return { bound: words[3]!, body };
}
const words = (path: string) => {
  const b = readFileSync(path);
  return new Uint32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
};
const text = (w: number[]) => {
  const bytes = new Uint8Array(Uint32Array.from(w).buffer);
  return String.fromCharCode(...bytes.subarray(0, bytes.indexOf(0)));
};

function checkKhr(name: string, multiplyAdds: number) {
  const nv = words(shaderFile(name));
  const khr = nvToKhrCoopmat(nv);
  expect(Array.from(words(shaderFile(`${name}k`)))).toEqual(Array.from(khr)); // the committed NAME_cmk.spv is this rewrite
  const { bound, body } = parse(khr);
  expect(body.filter((i) => i.op >= 5358 && i.op <= 5362)).toEqual([]);
  expect(body.filter((i) => i.op === 17).map((i) => i.w[0])).toContain(6022);
  expect(body.filter((i) => i.op === 17).map((i) => i.w[0])).not.toContain(5357);
  expect(body.filter((i) => i.op === 10).map((i) => text(i.w))).toContain("SPV_KHR_cooperative_matrix");
  const consts = new Map(body.filter((i) => i.op === 43).map((i) => [i.w[1]!, i.w[2]!]));
  const floatWidth = new Map(body.filter((i) => i.op === 22).map((i) => [i.w[0]!, i.w[1]!]));
  const types = new Map(body.filter((i) => i.op === 4456).map((i) => [i.w[0]!, {
    bits: floatWidth.get(i.w[1]!), rows: consts.get(i.w[3]!), cols: consts.get(i.w[4]!), use: consts.get(i.w[5]!),
  }]));
  expect([...types.values()].map((t) => `${t.bits}:${t.rows}x${t.cols}:${t.use}`).sort()).toEqual(["16:16x16:0", "16:16x8:1", "32:16x8:2"]);
  const typeOf = new Map<number, number>();
  for (const i of body) if (i.w.length >= 2 && types.has(i.w[0]!)) typeOf.set(i.w[1]!, i.w[0]!);
  const loads = body.filter((i) => i.op === 4457), stores = body.filter((i) => i.op === 4458), mads = body.filter((i) => i.op === 4459);
  expect(loads.length).toBeGreaterThan(0);
  expect(stores.length).toBeGreaterThan(0);
  expect(mads.length).toBe(multiplyAdds);
  // each load's and store's layout (0 row-major, 1 column-major) the column-major flag of the NV
  // instruction it replaced, in order (OpCooperativeMatrixLoadNV's flag is word 4, StoreNV's word 3)
  const nvBody = parse(nv).body;
  const nvTrue = new Set(nvBody.filter((i) => i.op === 41).map((i) => i.w[1]!));
  const nvFlags = (op: number, word: number) => nvBody.filter((i) => i.op === op).map((i) => (nvTrue.has(i.w[word]!) ? 1 : 0));
  expect(loads.map((l) => consts.get(l.w[3]!))).toEqual(nvFlags(5359, 4));
  expect(stores.map((s) => consts.get(s.w[2]!))).toEqual(nvFlags(5360, 3));
  for (const m of mads) {
    expect([types.get(typeOf.get(m.w[2]!)!)!.use, types.get(typeOf.get(m.w[3]!)!)!.use, types.get(typeOf.get(m.w[4]!)!)!.use, types.get(m.w[0]!)!.use]).toEqual([0, 1, 2, 2]);
  }
  // ids: every result id below the bound, each defined once
  const ids = body.filter((i) => i.op === 43 || i.op === 4456).map((i) => i.op === 43 ? i.w[1]! : i.w[0]!);
  expect(new Set(ids).size).toBe(ids.length);
  for (const id of ids) expect(id).toBeLessThan(bound);
  return { nvWords: nv.length, khrWords: khr.length };
}

describe("NV -> KHR cooperative-matrix rewrite", () => {
  // gemm_coopmat_tile.glsl: 2 x 4 accumulators; cm_slice_tile.glsl: 2 row blocks x 8 column blocks
  // (those past the tile's BN dropped by the driver), twice where the steps run two at a time (CM_LOAD_AHEAD 2: the GGML loaders)
  // dec_attention_cm.glsl: 4 score and 16 value accumulators (those past its shape dropped likewise)
  const shaders: [string, number][] = [["dec_gemm_quant_cm", 8], ["dec_gemm_ggml_cm", 8], ["moe_ggml_cm", 32], ["moe_pool_bda_cm", 16], ["moe_pool_desc_cm", 16], ["dec_gemm_quant_wide_cm", 16], ["dec_gemm_ggml_wide_cm", 32], ["dec_attention_cm", 20]];
  for (const [name, multiplyAdds] of shaders) {
    test(`${name}k.spv: KHR instructions, uses, layouts and ids`, () => {
      const { nvWords, khrWords } = checkKhr(name, multiplyAdds);
      console.log(`  ${name}: ${nvWords} words -> ${khrWords}`);
    });
  }

  test("refused: one matrix type as both A and B, no cooperative matrix, not SPIR-V", () => {
    const dir = mkdtempSync(join(tmpdir(), "vkmoe-cmk-"));
    try {
      writeFileSync(join(dir, "two_roles.comp"), `#version 450
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer B { float16_t h[]; };
layout(std430, binding = 1) buffer C { float f[]; };
void main() {
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a, b;
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> c = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
  coopMatLoadNV(a, h, 0, 16, false);
  coopMatLoadNV(b, h, 256, 16, true);
  c = coopMatMulAddNV(a, b, c);
  coopMatStoreNV(c, f, 0, 16, false);
}
`);
      const out = join(dir, "two_roles.spv");
      const r = spawnSync(process.env.GLSLANG_VALIDATOR || "glslangValidator", ["-V", "--target-env", "vulkan1.2", "--quiet", "-o", out, join(dir, "two_roles.comp")], { encoding: "utf8" });
      expect(r.status).toBe(0);
      expect(() => nvToKhrCoopmat(words(out))).toThrow(SpirvRewriteError);
      expect(() => nvToKhrCoopmat(words(out))).toThrow(/two roles/);
      expect(() => nvToKhrCoopmat(words(shaderFile("dec_gemm_quant")))).toThrow(/no OpTypeCooperativeMatrixNV/);
      expect(() => nvToKhrCoopmat(new Uint32Array([1, 2, 3, 4, 5, 6]))).toThrow(/not a SPIR-V module/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
