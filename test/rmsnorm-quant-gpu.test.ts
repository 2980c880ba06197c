/**
 * dec_rmsnorm_quant (RmsNormQuantKernel) and NormFeed on the real driver under the validation layer:
 * the RMSNorm that also writes its rows quantized for the integer-dot GGML GEMVs.
 *
 * - y against the CPU rmsNorm (src/model/ops.ts): within 4 f32 ulps (only the sum of squares' order
 *   differs); x + add written back exactly.
 * - The quantized rows: bit for bit what quantize_act writes from the same y (the integer-dot GEMV
 *   over them equals, bit for bit, the GEMV that quantizes y itself), and the quantization rule
 *   recomputed on the CPU from y (power-of-two scale, round-half-even, the sum of q).
 * - NormFeed: quantizes only for a reader on the integer-dot path at that many tokens (the GEMV's
 *   calls, and the idp GEMM's chunks up to 64 tokens where it is on), and q, k, v reading it match
 *   each DeviceLinear's own record bit for bit (S = 1, 5, 9, 64; and 13, 64 with the GEMMs split).
 * Rows 1, 3, 8; n 32 .. 4128 (the scratch takes multiples of 32) (a last partial pass of groups), zero rows, in place.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { submitAndWait } from "../src/kernels/decoder/common.ts";
import { DeviceGgmlMatrix, GgmlGemvIdpKernel, GgmlIdpScratch } from "../src/kernels/decoder/ggml-gemv.ts";
import { RmsNormKernel, RmsNormQuantKernel } from "../src/kernels/decoder/rmsnorm.ts";
import { DeviceLinear, GGML_IDP_GEMM_MAX_TOKENS, GGML_IDP_MAX_TOKENS, LinearKernels } from "../src/graph/device-linear.ts";
import { NormFeed } from "../src/graph/norm-feed.ts";
import { FloatLinear, GgmlBlockLinear } from "../src/model/linear.ts";
import { rmsNorm } from "../src/model/ops.ts";
import { GGML_BLOCK_LAYOUTS, ggmlBlockTensor, type GgmlBlockTensor, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext({ integerDotProduct: "on" });
const device = ctx.device;
const noIdp = !device.enabled.integerDotProduct;
const cpu = device.info.type === 4;
const norm = new RmsNormQuantKernel(device, cpu ? { workgroupSize: 8 } : {});
const normTree = new RmsNormQuantKernel(device, { useSubgroup: false, workgroupSize: 16 });
const idp = new Map<GgmlBlockType, GgmlGemvIdpKernel>();
const idpKernel = (t: GgmlBlockType) => {
  let k = idp.get(t);
  if (!k) idp.set(t, (k = new GgmlGemvIdpKernel(device, t, cpu ? { workgroupSize: 8, rowsPerWorkgroup: 4, tokensPerChunk: 1 } : {})));
  return k;
};
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  for (const k of idp.values()) k[Symbol.dispose]();
  normTree[Symbol.dispose]();
  norm[Symbol.dispose]();
  finish(ctx);
});

function randomTensor(type: GgmlBlockType, rows: number, cols: number, seed: number): GgmlBlockTensor {
  const { blockElements, blockBytes, halfOffsets } = GGML_BLOCK_LAYOUTS[type];
  const rand = mulberry32(seed);
  const bytes = new Uint8Array(rows * (cols / blockElements) * blockBytes);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(rand() * 256);
  for (let p = 0; p < bytes.length; p += blockBytes) {
    for (const h of halfOffsets) {
      const bits = f32ToF16Bits((rand() < 0.5 ? -1 : 1) * 2 ** (-10 + 6 * rand()));
      bytes[p + h] = bits & 0xff;
      bytes[p + h + 1] = bits >> 8;
    }
  }
  return ggmlBlockTensor(type, bytes, rows, cols);
}

/** quantize_act's rule for one group of 16 on the CPU: the packed words, the scale and the sum of q. */
function quantizeGroup(y: Float32Array, at: number): { words: number[]; scale: number; sum: number } {
  let amax = 0;
  for (let i = 0; i < 16; i++) amax = Math.max(amax, Math.abs(y[at + i]!));
  if (amax === 0) return { words: [0, 0, 0, 0], scale: 0, sum: 0 };
  let e = Math.floor(Math.log2(amax)) + 1;
  while (amax >= 2 ** e) e++;
  while (amax < 2 ** (e - 1)) e--;
  const words = [0, 0, 0, 0];
  let sum = 0;
  for (let i = 0; i < 16; i++) {
    const v = y[at + i]! * 2 ** (7 - e), f = Math.floor(v), d = v - f;
    const q = Math.min(127, Math.max(-127, d > 0.5 || (d === 0.5 && f % 2 !== 0) ? f + 1 : f));
    sum += q;
    words[i >> 2] = (words[i >> 2]! | ((q & 0xff) << (8 * (i & 3)))) >>> 0;
  }
  return { words, scale: 2 ** (e - 7), sum };
}

const ulpDistance = (ref: number, got: number) => Math.abs(ref - got) / 2 ** (Math.floor(Math.log2(Math.max(Math.abs(ref), 2 ** -126))) - 23);

interface NormRun { x: Float32Array; y: Float32Array; xq: Uint32Array; xscale: Float32Array; xsum: Int32Array }

/** The kernel over R rows of n (x at an offset, with or without the residual; y in place when asked). */
function runNorm(kernel: RmsNormQuantKernel, R: number, n: number, seed: number, o: { add?: boolean; inPlace?: boolean; zeroRow?: number } = {}): NormRun & { x0: Float32Array; add: Float32Array | undefined; w: Float32Array } {
  const xo = 4, x0 = randomGaussianF32(R * n, seed), w = randomGaussianF32(n, seed + 1);
  if (o.zeroRow !== undefined) x0.fill(0, o.zeroRow * n, (o.zeroRow + 1) * n);
  const add = o.add ? randomGaussianF32(R * n, seed + 2) : undefined;
  if (add && o.zeroRow !== undefined) for (let i = o.zeroRow * n; i < (o.zeroRow + 1) * n; i++) add[i] = -x0[i]!;
  using xb = hostBuffer(device, xo + R * n, "upload");
  using ab = hostBuffer(device, R * n, "upload");
  using wb = hostBuffer(device, n, "upload");
  using yb = hostBuffer(device, R * n);
  using scratch = new GgmlIdpScratch(device, n, Math.max(R, 1));
  f32(xb, R * n, xo).set(x0);
  if (add) f32(ab, R * n).set(add);
  f32(wb, n).set(w);
  const y = o.inPlace ? xb : yb;
  submitAndWait(device, (cb) => kernel.record(cb, { x: xb, add: add ? ab : undefined, w: wb, y, rows: R, n, eps: 1e-6, xOffset: xo, yOffset: o.inPlace ? xo : 0 }, scratch));
  expectTail(xb, xo + R * n, "x");
  if (!o.inPlace) expectTail(yb, R * n, "y");
  const groups = (R * n) / 16;
  const read = <T>(b: typeof scratch.xq, make: (buf: ArrayBuffer, n: number) => T, words: number) => {
    using rb = hostBuffer(device, words);
    submitAndWait(device, (cb) => cb.copyBuffer(b, rb, BigInt(4 * words)));
    return make(rb.host().slice(0, 4 * words), words);
  };
  return {
    x0, add, w,
    x: f32(xb, R * n, xo).slice(),
    y: o.inPlace ? f32(xb, R * n, xo).slice() : f32(yb, R * n).slice(),
    xq: read(scratch.xq, (b) => new Uint32Array(b), 4 * groups),
    xscale: read(scratch.xscale, (b) => new Float32Array(b), groups),
    xsum: read(scratch.xsum, (b) => new Int32Array(b), groups),
  };
}

function checkRun(r: ReturnType<typeof runNorm>, R: number, n: number, inPlace = false): void {
  const x = r.add ? r.x0.map((v, i) => Math.fround(v + r.add![i]!)) : r.x0;
  if (!inPlace) expect(Array.from(r.x)).toEqual(Array.from(x)); // the residual sum written back exactly (or x untouched)
  const ref = new Float32Array(R * n);
  rmsNorm(x, r.w, n, R, 1e-6, ref);
  let worst = 0;
  for (let i = 0; i < ref.length; i++) worst = Math.max(worst, ulpDistance(ref[i]!, r.y[i]!));
  expect(worst).toBeLessThanOrEqual(4);
  for (let g = 0; g < (R * n) / 16; g++) {
    const q = quantizeGroup(r.y, 16 * g);
    expect([...r.xq.subarray(4 * g, 4 * g + 4)]).toEqual(q.words);
    expect(r.xscale[g]).toBe(q.scale);
    expect(r.xsum[g]).toBe(q.sum);
  }
}

describe("dec_rmsnorm_quant: y as the CPU rmsNorm, the quantized rows as quantize_act's rule", () => {
  test("rows 1, 3, 8; n 32, 96, 2048, 4128; with and without the residual; in place; the tree reduction", () => {
    let seed = 500;
    for (const [R, n] of [[1, 32], [3, 96], [1, 2048], [8, 2048], [3, 4128]] as const) {
      for (const add of [false, true]) checkRun(runNorm(norm, R, n, seed++, { add }), R, n);
    }
    checkRun(runNorm(norm, 3, 2048, seed++, { add: true, inPlace: true }), 3, 2048, true);
    checkRun(runNorm(normTree, 3, 288, seed++, { add: true }), 3, 288);
  }, 120_000);

  test("a row of zeros: scale 0, q 0, its sum 0 (the other rows unaffected)", () => {
    const r = runNorm(norm, 3, 64, 900, { add: true, zeroRow: 1 });
    checkRun(r, 3, 64);
    expect([...r.xscale.subarray(4, 8)]).toEqual([0, 0, 0, 0]);
    expect([...r.xq.subarray(16, 32)].every((w) => w === 0)).toBe(true);
  });

  test("bad arguments: n not a multiple of 16, a scratch of another width or too few rows, an offset not a multiple of 4", () => {
    using b = hostBuffer(device, 4096, "upload");
    using s64 = new GgmlIdpScratch(device, 64, 2);
    const args = { x: b, w: b, y: b, rows: 2, n: 64, eps: 1e-6 };
    expect(() => submitAndWait(device, (cb) => norm.record(cb, { ...args, n: 40 }, s64))).toThrow(/multiple of 16/);
    expect(() => submitAndWait(device, (cb) => norm.record(cb, { ...args, n: 32 }, s64))).toThrow(/quantized rows of 2 x 64 for 2 rows of 32/);
    expect(() => submitAndWait(device, (cb) => norm.record(cb, { ...args, rows: 3 }, s64))).toThrow(/quantized rows of 2 x 64/);
    expect(() => submitAndWait(device, (cb) => norm.record(cb, { ...args, xOffset: 2 }, s64))).toThrow(/multiples of 4 floats/);
  });
});

describe("the scaled add (Qwen3.5's gated shared expert folded into the next norm)", () => {
  test("both kernels: x += add + sigmoid(gate[r]) * add2 as the CPU path forms it (within f32 rounding of its terms); y and the quantized rows follow", () => {
    using plain = new RmsNormKernel(device, cpu ? { workgroupSize: 8 } : {});
    const R = 3, n = 2048, seed = 1200;
    const x0 = randomGaussianF32(R * n, seed), add = randomGaussianF32(R * n, seed + 1), add2 = randomGaussianF32(R * n, seed + 2);
    const w = randomGaussianF32(n, seed + 3), gate = Float32Array.from([0.3, -2.5, 4]);
    // the CPU path's order (hybrid-decoder.ts): ffn + sigmoid(g) * shared in f32, then the residual
    const want = x0.map((v, i) => {
      const r = Math.floor(i / n), sg = Math.fround(1 / (1 + Math.exp(-gate[r]!)));
      return Math.fround(v + Math.fround(add[i]! + Math.fround(sg * add2[i]!)));
    });
    for (const quant of [false, true]) {
      using xb = hostBuffer(device, R * n, "upload");
      using ab = hostBuffer(device, R * n, "upload");
      using a2 = hostBuffer(device, R * n, "upload");
      using gb = hostBuffer(device, 2 + R, "upload");
      using wb = hostBuffer(device, n, "upload");
      using yb = hostBuffer(device, R * n);
      using scratch = new GgmlIdpScratch(device, n, R);
      f32(xb, R * n).set(x0);
      f32(ab, R * n).set(add);
      f32(a2, R * n).set(add2);
      f32(gb, R, 2).set(gate);
      f32(wb, n).set(w);
      const args = { x: xb, add: ab, scaledAdd: { x: a2, gate: gb, gateOffset: 2 }, w: wb, y: yb, rows: R, n, eps: 1e-6 };
      submitAndWait(device, (cb) => (quant ? norm.record(cb, args, scratch) : plain.record(cb, args)));
      const got = f32(xb, R * n);
      // f32 rounding of each term (the driver's exp may differ from Math.exp by an ulp or two): the
      // error against the terms' magnitudes, not the sum's (which may cancel)
      let worst = 0;
      for (let i = 0; i < want.length; i++) {
        const scale = Math.abs(x0[i]!) + Math.abs(add[i]!) + Math.abs(add2[i]!);
        worst = Math.max(worst, Math.abs(want[i]! - got[i]!) / scale);
      }
      expect(worst).toBeLessThanOrEqual(2 ** -21);
      const ref = new Float32Array(R * n);
      rmsNorm(got, w, n, R, 1e-6, ref);
      let worstY = 0;
      for (let i = 0; i < ref.length; i++) worstY = Math.max(worstY, ulpDistance(ref[i]!, f32(yb, R * n)[i]!));
      expect(worstY).toBeLessThanOrEqual(4);
      expect(() => submitAndWait(device, (cb) => plain.record(cb, { ...args, add: undefined }))).toThrow(/needs the residual add/);
    }
  });
});

describe.skipIf(noIdp)("the integer-dot GEMV over the norm's quantized rows", () => {
  test("equals, bit for bit, the GEMV that quantizes y itself (Q4_K, Q6_K, Q5_0; S 1, 3, 8)", () => {
    let seed = 700;
    for (const type of ["Q4_K", "Q6_K", "Q5_0"] as const) {
      const n = 512, rows = 37;
      const w = randomTensor(type, rows, n, seed++);
      using m = new DeviceGgmlMatrix(device, w);
      for (const S of [1, 3, 8]) {
        using xb = hostBuffer(device, S * n, "upload");
        using wb = hostBuffer(device, n, "upload");
        using yb = hostBuffer(device, S * n);
        using fromNorm = new GgmlIdpScratch(device, n, S);
        using own = new GgmlIdpScratch(device, n, S);
        using y1 = hostBuffer(device, S * rows);
        using y2 = hostBuffer(device, S * rows);
        f32(xb, S * n).set(randomGaussianF32(S * n, seed++));
        f32(wb, n).set(randomGaussianF32(n, seed++));
        const k = idpKernel(type);
        submitAndWait(device, (cb) => {
          norm.record(cb, { x: xb, w: wb, y: yb, rows: S, n, eps: 1e-6 }, fromNorm);
          cb.barrier("computeToCompute");
          k.recordQuantized(cb, { matrix: m, y: y1, S, scratch: fromNorm });
          k.record(cb, { matrix: m, x: yb, y: y2, S, scratch: own });
        });
        expect(Array.from(u32(y1, S * rows))).toEqual(Array.from(u32(y2, S * rows)));
        expectTail(y1, S * rows, "y from the norm's rows");
      }
    }
  }, 120_000);
});

describe.skipIf(noIdp)("NormFeed", () => {
  /**
   * The norm of S rows of D, then q, k, v (Q4_K, Q6_K, Q5_0) through recordFrom with what it returns,
   * against each DeviceLinear's own record (quantize its own x) bit for bit; a float router reads xn too.
   */
  function feedCheck(lk: LinearKernels, D: number, S: number, seed: number): { quantized: boolean; dispatches: number; perMatrix: number } {
    using feed = new NormFeed(lk, D);
    const make = (type: GgmlBlockType, rows: number, seed: number, name: string) => {
      const t = randomTensor(type, rows, D, seed);
      return new DeviceLinear(lk, name, new GgmlBlockLinear(type, t.bytes, t.rows, t.cols, name));
    };
    using q = make("Q4_K", 40, seed, "q");
    using k = make("Q6_K", 8, seed + 1, "k");
    using v = make("Q5_0", 8, seed + 2, "v");
    using router = new DeviceLinear(lk, "router", new FloatLinear("F32", randomGaussianF32(16 * D, seed + 3), 16, D));
    using hb = hostBuffer(device, S * D, "upload");
    using wb = hostBuffer(device, D, "upload");
    using xn = hostBuffer(device, S * D);
    const ys = [q, k, v].map((m) => [hostBuffer(device, S * m.rows), hostBuffer(device, S * m.rows)] as const);
    try {
      f32(hb, S * D).set(randomGaussianF32(S * D, seed + 10 + S));
      f32(wb, D).set(randomGaussianF32(D, seed + 20 + S));
      let quantized: GgmlIdpScratch | undefined;
      let dispatches = 0;
      submitAndWait(device, (cb) => {
        quantized = feed.record(cb, { x: hb, w: wb, y: xn, rows: S, n: D, eps: 1e-6 }, [router, q, k, v]);
        cb.barrier("computeToCompute");
        [q, k, v].forEach((m, i) => (dispatches += m.recordFrom(cb, xn, quantized, ys[i]![0], S)));
      });
      submitAndWait(device, (cb) => [q, k, v].forEach((m, i) => m.record(cb, xn, ys[i]![1], S)));
      ys.forEach(([a, b], i) => {
        const n = S * [q, k, v][i]!.rows;
        expect({ S, m: i, y: Array.from(u32(a, n)) }).toEqual({ S, m: i, y: Array.from(u32(b, n)) });
        expectTail(a, n, "y from the norm's rows");
      });
      // only float readers: no quantized rows
      submitAndWait(device, (cb) => expect(feed.record(cb, { x: hb, w: wb, y: xn, rows: S, n: D, eps: 1e-6 }, [router])).toBeUndefined());
      return { quantized: quantized !== undefined, dispatches, perMatrix: q.dispatches(S) };
    } finally {
      for (const [a, b] of ys) {
        a[Symbol.dispose]();
        b[Symbol.dispose]();
      }
    }
  }

  test(`quantizes for a reader on the integer-dot path only (the GEMV's calls and the idp GEMM's chunks: ${GGML_IDP_GEMM_MAX_TOKENS} tokens); q, k, v reading it match their own records`, () => {
    using lk = new LinearKernels(device, { integerDot: true });
    // the idp GEMMs off (GGML and q4/q8): chunks past the GEMV's tokens take the float GEMM, which reads xn
    using gemv = new LinearKernels(device, { integerDot: true, ggmlGemmIdp: false, quantGemmIdp: false });
    expect([lk.quantizedTokens, gemv.quantizedTokens]).toEqual([GGML_IDP_GEMM_MAX_TOKENS, GGML_IDP_MAX_TOKENS]);
    for (const [kernels, S] of [[lk, 1], [lk, 5], [lk, GGML_IDP_MAX_TOKENS + 1], [lk, GGML_IDP_GEMM_MAX_TOKENS], [gemv, 5], [gemv, GGML_IDP_MAX_TOKENS + 1], [gemv, GGML_IDP_GEMM_MAX_TOKENS]] as const) {
      const r = feedCheck(kernels, 256, S, 1);
      const idpPath = S <= kernels.quantizedTokens;
      // from the norm's rows: one dispatch a matrix (no quantize of its own)
      expect({ S, quantized: r.quantized, dispatches: r.dispatches }).toEqual({ S, quantized: idpPath, dispatches: idpPath ? 3 : 3 * r.perMatrix });
    }
  }, 120_000);

  test("a 64-token chunk with the GEMMs split (forced: Lavapipe never splits; 768 columns in 3 runs): q, k, v from the norm's rows equal their own records bit for bit", () => {
    using lk = new LinearKernels(device, { integerDot: true, gemmSplits: () => 3 });
    for (const S of [13, GGML_IDP_GEMM_MAX_TOKENS]) expect(feedCheck(lk, 768, S, 40)).toMatchObject({ quantized: true, dispatches: 3 });
  }, 120_000);
});
