/**
 * The recurrent delta rule's quantized output (shaders/dec_delta_rule.comp flags bit 4,
 * DeltaRuleArgs.quantized): besides its float rows, each token's gated-norm output as the
 * integer-dot GEMVs read it, so out_proj of a GGML file runs with no quantize step of its own. On the
 * real driver under the validation layer, against GgmlQuantizeKernel (quantize_act, the rule every
 * integer-dot input follows) run over the same call's float rows: xq, scales and sums bit for bit,
 * and the float rows bit for bit against the same call without the quantized output. Shapes: value
 * heads of 32 and of 128 (llama.cpp's tiled heads as the graph runs them: 2 dispatches of 2 heads,
 * each writing its columns of the row), GQA 3 with keys of 16; calls of 1 and 3 tokens, and a
 * batch (runs: 3 tokens of 2 sequences).
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { InvalidArgumentError } from "../src/errors.ts";
import { DeltaRuleKernel, submitAndWait, type DeltaRuleArgs } from "../src/kernels/decoder/index.ts";
import { DeltaRuleChunkedKernel } from "../src/kernels/decoder/delta-rule.ts";
import { GgmlIdpScratch, GgmlQuantizeKernel } from "../src/kernels/decoder/ggml-gemv.ts";
import { RUN_WORDS, writeRuns } from "../src/kernels/decoder/runs.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { Buffer } from "../src/vk/memory.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
const kernels: DeltaRuleKernel[] = [];
const quantize = new GgmlQuantizeKernel(device);
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of kernels) k[Symbol.dispose]();
  quantize[Symbol.dispose]();
  finish(ctx);
});

let seed = 7001;
const random = (n: number, std = 1) => randomGaussianF32(n, seed++, std);
function bufferOf(data: Float32Array): Buffer {
  const b = hostBuffer(device, data.length, "upload");
  f32(b, data.length).set(data);
  return b;
}
/** words of a device buffer, as raw 32-bit words. */
function read(b: Buffer, words: number): Uint32Array {
  using rb = hostBuffer(device, words);
  submitAndWait(device, (cb) => cb.copyBuffer(b, rb, BigInt(4 * words)));
  return u32(rb, words).slice();
}

interface Shape { label: string; keyHeads: number; valueHeads: number; keyDim: number; valueDim: number; groups: number }
const SHAPES: Shape[] = [
  { label: "2 key / 4 value heads of 32", keyHeads: 2, valueHeads: 4, keyDim: 32, valueDim: 32, groups: 1 },
  { label: "heads of 128, GQA 2, tiled: 2 dispatches of 2 heads", keyHeads: 2, valueHeads: 4, keyDim: 128, valueDim: 128, groups: 2 },
  { label: "GQA 3 (1 / 3 heads of 32, keys of 16)", keyHeads: 1, valueHeads: 3, keyDim: 16, valueDim: 32, groups: 1 },
];

/** One call of S tokens (a batch when stateOf is given) with and without the quantized output, and quantize_act over its rows. */
function run(sh: Shape, S: number, stateOf?: number[]) {
  const { keyHeads: KH, valueHeads: VH, keyDim: kd, valueDim: vd, groups: g } = sh;
  let kernel = kernels.find((k) => k.keyDim === kd && k.valueDim === vd);
  if (!kernel) kernels.push((kernel = new DeltaRuleKernel(device, { keyDim: kd, valueDim: vd })));
  const Kd = KH * kd, Vd = VH * vd, C = 2 * Kd + Vd, heads = VH / g, slots = stateOf ? 2 : 1;
  const stateFloats = kernel.stateFloats(VH);
  const params = new Float32Array(2 * VH + vd);
  params.set(Float32Array.from({ length: VH }, (_, h) => -0.05 * (h + 1)), 0);
  params.set(random(VH).map((x) => x - 1), VH);
  params.set(random(vd, 0.3).map((x) => x + 1), 2 * VH);
  const state0 = random(slots * stateFloats, 0.3);
  using qkv = bufferOf(random(S * C)), a = bufferOf(random(S * VH)), b = bufferOf(random(S * VH, 2)), z = bufferOf(random(S * Vd)), pb = bufferOf(params);
  using stateA = bufferOf(state0), stateB = bufferOf(state0);
  using outA = hostBuffer(device, S * Vd), outB = hostBuffer(device, S * Vd);
  using table = hostBuffer(device, RUN_WORDS, "upload");
  if (stateOf) writeRuns(u32(table, RUN_WORDS), stateOf, S);
  using scratch = new GgmlIdpScratch(device, Vd, 8), check = new GgmlIdpScratch(device, Vd, 8);
  const args = (j: number, state: Buffer, out: Buffer): DeltaRuleArgs => ({
    S, keyHeads: g === 1 ? KH : heads, valueHeads: heads, qkv, qOffset: 0, kOffset: Kd, vOffset: 2 * Kd + j * heads * vd, qkvStride: C,
    a, b, aOffset: j * heads, aStride: VH, bOffset: j * heads, bStride: VH, params: pb, negAOffset: j * heads, dtBiasOffset: VH + j * heads,
    state, stateOffset: j * heads * kd * vd, out, outOffset: j * heads * vd, outStride: Vd,
    norm: { z, zOffset: j * heads * vd, zStride: Vd, weightOffset: 2 * VH, eps: 1e-6 },
    ...(stateOf && { runs: { table, stateStride: stateFloats, states: slots } }),
  });
  submitAndWait(device, (cb) => {
    for (let j = 0; j < g; j++) kernel.record(cb, args(j, stateA, outA));
    for (let j = 0; j < g; j++) kernel.record(cb, { ...args(j, stateB, outB), quantized: scratch });
    cb.barrier("computeToCompute");
    quantize.record(cb, outB, 0, check, Vd, S);
  });
  const groups = (S * Vd) / 16;
  return {
    floats: { plain: read(outA, S * Vd), quantizing: read(outB, S * Vd) },
    got: { xq: read(scratch.xq, 4 * groups), xscale: read(scratch.xscale, groups), xsum: read(scratch.xsum, groups) },
    want: { xq: read(check.xq, 4 * groups), xscale: read(check.xscale, groups), xsum: read(check.xsum, groups) },
    groups,
  };
}

describe("dec_delta_rule's quantized output", () => {
  for (const sh of SHAPES) {
    for (const [what, S, stateOf] of [["1 token", 1, undefined], ["3 tokens", 3, undefined], ["a batch of 3 tokens of 2 sequences", 3, [1, 0, 1]]] as const) {
      test(`${sh.label}, ${what}: xq, scales and sums equal quantize_act's over the call's rows bit for bit; the float rows as without it`, () => {
        const r = run(sh, S, stateOf ? [...stateOf] : undefined);
        expect(r.floats.quantizing).toEqual(r.floats.plain);
        expect(r.got.xscale).toEqual(r.want.xscale);
        expect(r.got.xsum).toEqual(r.want.xsum);
        expect(r.got.xq).toEqual(r.want.xq);
        // not all zero: the rows were written
        expect(r.got.xscale.some((w) => w !== 0)).toBe(true);
      });
    }
  }

  test("a scratch of other columns or too few tokens, heads not on groups of 16, the chunked kernel: InvalidArgumentErrors", () => {
    using k = new DeltaRuleKernel(device, { keyDim: 16, valueDim: 16 });
    using k8 = new DeltaRuleKernel(device, { keyDim: 16, valueDim: 8 });
    using chunked = new DeltaRuleChunkedKernel(device, { keyDim: 16, valueDim: 16 });
    using buf = hostBuffer(device, 4096), wide = new GgmlIdpScratch(device, 64, 8), one = new GgmlIdpScratch(device, 32, 1), ok = new GgmlIdpScratch(device, 32, 8);
    const base = (valueDim: number): DeltaRuleArgs => ({ S: 2, keyHeads: 1, valueHeads: 2, qkv: buf, a: buf, b: buf, params: buf, state: buf, out: buf, outStride: 2 * valueDim, norm: { z: buf, weightOffset: 0, eps: 1e-6 } });
    const tryRecord = (kernel: DeltaRuleKernel | DeltaRuleChunkedKernel, a: DeltaRuleArgs) => () =>
      submitAndWait(device, (cb) => (kernel instanceof DeltaRuleKernel ? kernel.record(cb, a) : kernel.recordCore(cb, a)));
    expect(tryRecord(k, { ...base(16), quantized: wide })).toThrow(InvalidArgumentError);
    expect(tryRecord(k, { ...base(16), quantized: one })).toThrow(InvalidArgumentError);
    expect(tryRecord(k8, { ...base(16), outStride: 32, quantized: ok })).toThrow(InvalidArgumentError);
    expect(tryRecord(chunked, { ...base(16), quantized: ok })).toThrow(InvalidArgumentError);
  });
});
