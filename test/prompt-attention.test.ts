/**
 * dec_attention_cm (a long prompt chunk's attention in one dispatch, on the matrix cores) against
 * attendCpu (f64) over the same f16-rounded keys and values: its emulation (the same tiles, masks
 * and softmax with plain sums) wherever the device has shaderFloat16 and the Vulkan memory model,
 * and the real kernel where cooperative matrices are enabled. Cases: head_dim 32/64/128/256 x GQA
 * 1/2/4/8; S from 5 to 200 (blocks of 8..64 tokens partly filled, n + S rarely a multiple of the
 * key tile); n pushed, and n from a positions buffer (one recording replayed at several words, one
 * past the cache capped); a layer offset, q/out offsets, Qwen3.5's output gate. Sentinels past out
 * and before its offset.
 *
 * The self-check (src/kernels/decoder/prompt-attention-check.ts) passes on the emulation and fails
 * with a bound no f16 product meets; DecoderAttention takes the kernel for chunks from fromTokens.
 *
 * Bound: NMSE <= 1e-5 per case (q and P rounded to f16 for the products, as llama.cpp's flash
 * attention does; the f32 kernels' 1e-10 does not apply). Negative control in the suite: each output
 * against the reference one position off (token t seeing n + t - 1 or n + t + 1 positions) fails it.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { DecoderAttention, MAX_ATTENTION_TOKENS } from "../src/kernels/decoder/attention.ts";
import { PromptAttentionKernel } from "../src/kernels/decoder/prompt-attention.ts";
import { promptAttentionSelfCheck } from "../src/kernels/decoder/prompt-attention-check.ts";
import { attendCpu } from "../src/model/ops.ts";
import { nmse, randomGaussianF32 } from "../src/quant/index.ts";
import { CommandPool } from "../src/vk/commands.ts";
import { Buffer } from "../src/vk/memory.ts";
import { Fence, Submission } from "../src/vk/sync.ts";
import { uploadBytes } from "../src/vk/transfer.ts";
import { bytesOf, halves } from "./support/attention-data.ts";
import { COLD_COMPILE_MS, finish, openTestContext } from "./support/gpu.ts";
import { SENTINEL, expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
const kernels = new Map<string, PromptAttentionKernel>();
afterAll(() => {
  for (const k of kernels.values()) k[Symbol.dispose]();
  finish(ctx);
});

const BOUND = 1e-5;
let seed = 9100;
let worst = 0, leastOffByOne = Infinity;
const shapes = new Set<string>();

interface Case {
  headDim: number;
  kvHeads: number;
  group: number;
  n: number;
  S: number;
  /** n from a positions buffer, one replay per word. */
  words?: number[];
  /** Cache positions (default n + S - 1 + 3). */
  ctx?: number;
  layers?: number;
  qOffset?: number;
  outOffset?: number;
  gate?: boolean;
  /** The kernel's rows a workgroup (default: the most that fit). */
  rows?: number;
}

const variants: (true | "emulated")[] = [];
if (device.enabled.shaderFloat16 && device.enabled.vulkanMemoryModel) variants.push("emulated");
else console.log(`  prompt attention: the emulated kernel skipped: ${device.info.name} lacks shaderFloat16 or vulkanMemoryModel`);
if (device.enabled.cooperativeMatrix) variants.push(true);
else console.log(`  prompt attention: the matrix-core kernel skipped: cooperative matrices not enabled on ${device.info.name}`);

function kernelFor(c: Case, variant: true | "emulated"): PromptAttentionKernel {
  const key = `${c.kvHeads * c.group}/${c.kvHeads}/${c.headDim}/${variant}/${c.rows}`;
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = new PromptAttentionKernel(device, { heads: c.kvHeads * c.group, kvHeads: c.kvHeads, headDim: c.headDim, matrixCores: variant, maxBindings: 2, ...(c.rows && { rows: c.rows }) })));
  shapes.add(`hd ${c.headDim}: ${k.shape.rows} rows x ${k.shape.keys} keys`);
  return k;
}

const label = (c: Case, word?: number) => `hd ${c.headDim} G ${c.group} KV ${c.kvHeads} n ${c.n} S ${c.S}${c.gate ? " gated" : ""}${word !== undefined ? ` word ${word}` : ""}`;

function runCase(c: Case, variant: true | "emulated"): void {
  const { headDim: hd, kvHeads: KV, group: G, n, S } = c;
  const H = KV * G, layers = c.layers ?? 1, qOffset = c.qOffset ?? 0, outOffset = c.outOffset ?? 0;
  const ctxLen = c.ctx ?? n + S - 1 + 3;
  const kernel = kernelFor(c, variant);
  const perLayer = ctxLen * KV * hd, layer = layers - 1;
  const k = halves(layers * perLayer, seed++), v = halves(layers * perLayer, seed++);
  const lk = k.values.subarray(layer * perLayer), lv = v.values.subarray(layer * perLayer);
  const floats = S * H * hd;
  using qBuf = new Buffer(device, { size: BigInt(4 * (qOffset + floats)), memory: "upload" });
  using gBuf = new Buffer(device, { size: BigInt(4 * (qOffset + floats)), memory: "upload" });
  using kBuf = new Buffer(device, { size: BigInt(k.bits.byteLength), memory: "device" });
  using vBuf = new Buffer(device, { size: BigInt(v.bits.byteLength), memory: "device" });
  uploadBytes(device, kBuf, 0n, bytesOf(k.bits));
  uploadBytes(device, vBuf, 0n, bytesOf(v.bits));
  using out = hostBuffer(device, outOffset + floats);
  using pos = hostBuffer(device, 2, "upload");
  const fromBuffer = c.words !== undefined;
  const binding = kernel.bind({ q: qBuf, keys: kBuf, values: vBuf, out, ...(fromBuffer && { positions: pos }), ...(c.gate && { gate: gBuf }) });
  using pool = new CommandPool(device);
  const cb = pool.allocate().begin();
  kernel.record(cb, binding, {
    n, S, maxPositions: fromBuffer ? ctxLen : n + S - 1, cacheOffset: layer * perLayer, qOffset, outOffset,
    ...(fromBuffer && { posIndex: 1 }), ...(c.gate && { gateOffset: qOffset }),
  });
  cb.barrier("computeToHost").end();
  using fence = new Fence(device);
  using submission = new Submission(device, [cb], { fence });
  u32(pos, 2)[0] = ctxLen >>> 1; // what a wrong posIndex would visibly read
  for (const word of c.words ?? [undefined]) {
    const q = randomGaussianF32(floats, seed++, 2), g = randomGaussianF32(floats, seed++, 2);
    new Float32Array(qBuf.host()).set(q, qOffset);
    new Float32Array(gBuf.host()).set(g, qOffset);
    if (word !== undefined) u32(pos, 2)[1] = word;
    new Uint32Array(out.host(), 0, outOffset + floats).fill(SENTINEL);
    submission.submit();
    // a first dispatch includes Lavapipe's compile (COLD_COMPILE_MS): the emulated head_dim 256 kernel's
    // took past the fence's 60 s default in CI with a cold shader cache (2026-12-08)
    if (!fence.wait(BigInt(COLD_COMPILE_MS) * 1_000_000n)) {
      device.waitIdle(); // the buffers, the pool and the fence are disposed on the way out: nothing may still use them
      throw new Error(`${label(c, word)}: attention timed out`);
    }
    fence.reset();
    expectTail(out, outOffset + floats, label(c, word));
    if (u32(out, outOffset).some((w) => w !== SENTINEL)) throw new Error(`${label(c, word)}: a word before outOffset was written`);
    const got = f32(out, floats, outOffset).slice();
    const p0 = (word === undefined ? n : Math.min(n + word, ctxLen - (S - 1))) - 1;
    const reference = (at: number) => {
      const ref = new Float32Array(floats);
      attendCpu(q, lk, lv, S, at, H, KV, hd, ref);
      if (c.gate) for (let i = 0; i < floats; i++) ref[i] = ref[i]! / (1 + Math.exp(-g[i]!));
      return ref;
    };
    const e = nmse(reference(p0), got);
    if (!(e <= BOUND)) throw new Error(`${label(c, word)} (${variant}): NMSE ${e} against attendCpu`);
    worst = Math.max(worst, e);
    if (p0 > 0) leastOffByOne = Math.min(leastOffByOne, nmse(reference(p0 - 1), got));
    if (p0 + S < ctxLen) leastOffByOne = Math.min(leastOffByOne, nmse(reference(p0 + 1), got));
  }
}

const cases: Case[] = [
  { headDim: 128, kvHeads: 2, group: 8, n: 1, S: 5 },
  { headDim: 128, kvHeads: 4, group: 8, n: 1, S: 65, qOffset: 8, outOffset: 12 },
  { headDim: 128, kvHeads: 1, group: 8, n: 37, S: 130, layers: 2 },
  { headDim: 128, kvHeads: 2, group: 4, n: 1, S: 200, words: [0, 33, 5000], ctx: 300 },
  { headDim: 64, kvHeads: 2, group: 2, n: 9, S: 71 },
  { headDim: 32, kvHeads: 3, group: 1, n: 1, S: 40 },
  { headDim: 256, kvHeads: 2, group: 8, n: 1, S: 70, gate: true },
  { headDim: 256, kvHeads: 1, group: 4, n: 100, S: 33, gate: true, layers: 2, words: [0, 7], ctx: 180 },
];

describe("dec_attention_cm: a prompt chunk's attention in one dispatch", () => {
  for (const variant of variants) {
    for (const c of cases) {
      test(`${variant === true ? "matrix cores" : "emulated"}: ${label(c)}`, () => runCase(c, variant));
    }
  }

  test("bounds and the negative control", () => {
    if (variants.length === 0) {
      console.log("  prompt attention: no variant ran (reasons above)");
      return;
    }
    console.log(`  prompt attention: shapes run ${[...shapes].join("; ")}`);
    console.log(`  prompt attention: worst NMSE ${worst.toExponential(2)} (bound ${BOUND}); one position off: least NMSE ${leastOffByOne.toExponential(2)}`);
    expect(worst).toBeLessThanOrEqual(BOUND);
    expect(leastOffByOne).toBeGreaterThan(BOUND);
  });

  test("the self-check (the emulation here; the real kernel where cooperative matrices are on) and where DecoderAttention takes the kernel", () => {
    if (variants.length === 0) return;
    const shape = { heads: 16, kvHeads: 2, headDim: 128 };
    const pass = promptAttentionSelfCheck(device, shape, "emulated");
    expect(pass.ok, pass.why).toBe(true);
    // negative control: a bound no f16 product meets fails the check, saying why
    const fail = promptAttentionSelfCheck(device, shape, "emulated", 1e-12);
    expect(fail.ok).toBe(false);
    expect(fail.why).toContain("failed its self-check");
    const real = device.enabled.cooperativeMatrix ? promptAttentionSelfCheck(device, shape) : undefined;
    console.log(`  prompt attention self-check: emulated NMSE ${pass.nmse.toExponential(2)}${real ? `; the real kernel: ${real.why}` : ""}`);
    if (real) expect(real.ok, real.why).toBe(true);
    using att = new DecoderAttention(device, { ...shape, maxBindings: 1, promptMatrixCores: { variant: variants[0]!, fromTokens: MAX_ATTENTION_TOKENS + 1 } });
    expect([4, 64, 65, 512].map((S) => att.promptOnMatrixCores(S))).toEqual([false, false, true, true]);
    expect(att.promptOnMatrixCores(65, true)).toBe(false); // batched calls keep their kernels
    using none = new DecoderAttention(device, { ...shape, maxBindings: 1 });
    expect(none.promptOnMatrixCores(512)).toBe(false);
    expect(() => new DecoderAttention(device, { ...shape, promptMatrixCores: { variant: "emulated", fromTokens: 4 } })).toThrow(/fromTokens/);
  });

  test("refused: a call past the cache or the buffers, a posIndex without positions, odd offsets", () => {
    if (variants.length === 0) return;
    const c = cases[0]!;
    const kernel = kernelFor(c, variants[0]!);
    using b = new Buffer(device, { size: 4096n, memory: "device" });
    const binding = kernel.bind({ q: b, keys: b, values: b, out: b });
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    expect(() => kernel.record(cb, binding, { n: 10, S: 8, maxPositions: 16 })).toThrow(/maxPositions 16/);
    expect(() => kernel.record(cb, binding, { n: 1, S: 8, maxPositions: 8, posIndex: 0 })).toThrow(/posIndex needs/);
    expect(() => kernel.record(cb, binding, { n: 1, S: 8, maxPositions: 8, qOffset: 2 })).toThrow(/qOffset/);
    expect(() => kernel.record(cb, binding, { n: 1, S: 8, maxPositions: 8, gateOffset: 0 })).toThrow(/gate buffer/);
    // a call past the bound buffers (4096 B: 8 tokens of 16 x 128 floats need 65536)
    expect(() => kernel.record(cb, binding, { n: 1, S: 8, maxPositions: 8 })).toThrow(/the q buffer \(4096 B\) is shorter/);
    cb.end();
  });
});
