/**
 * The decoder's GPU kernels (shaders/dec_*.comp, src/kernels/decoder/) on the real driver, under
 * the validation layer, against the CPU functions of src/model/ops.ts (and src/sampling/select.ts
 * argmax and selectTopK) on random data. Every output buffer carries sentinel words past its end (and the KV
 * cache around the rows written), checked after each run.
 */
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { ArgmaxKernel, ARGMAX_NONE, RmsNormKernel, RopeKvKernel, submitAndWait, TopKKernel, type RopeKvArgs } from "../src/kernels/decoder/index.ts";
import { applyRope, rmsNorm, ropeInverseFrequencies } from "../src/model/ops.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import { argmax, selectTopK } from "../src/sampling/select.ts";
import { CommandPool } from "../src/vk/commands.ts";
import type { Buffer, MemoryUse } from "../src/vk/memory.ts";
import { Fence, Submission } from "../src/vk/sync.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { expectTail, f32, hostBuffer as deviceHostBuffer, u32, SENTINEL, SENTINEL_WORDS as TAIL } from "./support/host-buffers.ts";
import { nmse as nmseOf } from "../src/quant/metrics.ts";
import { InvalidArgumentError } from "../src/errors.ts";

const ctx = openTestContext();
const device = ctx.device;
const rms = new RmsNormKernel(device);
const rmsShared = new RmsNormKernel(device, { useSubgroup: false, workgroupSize: 64 });
const rope = new RopeKvKernel(device);
const argmaxKernel = new ArgmaxKernel(device);
const topk = new TopKKernel(device);
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
afterAll(() => {
  topk[Symbol.dispose]();
  argmaxKernel[Symbol.dispose]();
  rope[Symbol.dispose]();
  rmsShared[Symbol.dispose]();
  rms[Symbol.dispose]();
  finish(ctx);
});

let seed = 7;
const hostBuffer = (words: number, memory?: MemoryUse) => deviceHostBuffer(device, words, memory);

function maxRel(ref: ArrayLike<number>, got: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = Math.abs(ref[i]! - got[i]!);
    m = Math.max(m, d === 0 ? 0 : d / Math.abs(ref[i]!));
  }
  return m;
}

/** Distance in f32 ulps of the reference (ulp at least that of the smallest normal). */
function ulps(ref: number, got: number): number {
  const a = Math.max(Math.abs(ref), 2 ** -126);
  const ulp = 2 ** (Math.floor(Math.log2(a)) - 23);
  return Math.abs(ref - got) / ulp;
}

// ---------------------------------------------------------------------------------------------
describe("dec_rmsnorm vs ops.ts rmsNorm (NMSE ≤ 1e-10 per case, each element within 1e-5 relative)", () => {
  const cases: [number, number][] = [[1, 1], [3, 1], [1, 33], [5, 33], [2, 2047], [3, 4097], [2, 8192], [64, 128]]; // [rows, n]
  for (const [name, kernel] of [["subgroup + shared reduction", rms], ["shared-memory reduction, 64 threads", rmsShared]] as const) {
    test(`${name}: rows x n = ${cases.map(([r, n]) => `${r}x${n}`).join(", ")}`, () => {
      let worst = 0, worstRel = 0;
      for (const [R, n] of cases) {
        const eps = 1e-6;
        const x = randomGaussianF32(R * n, seed++, 3);
        const w = randomGaussianF32(n, seed++);
        using xb = hostBuffer(R * n, "upload");
        using wb = hostBuffer(n, "upload");
        using yb = hostBuffer(R * n);
        f32(xb, R * n).set(x);
        f32(wb, n).set(w);
        submitAndWait(device, (cb) => kernel.record(cb, { x: xb, w: wb, y: yb, rows: R, n, eps }));
        const ref = new Float32Array(R * n);
        rmsNorm(x, w, n, R, eps, ref);
        const got = f32(yb, R * n);
        const e = nmseOf(ref, got), rel = maxRel(ref, got);
        expect(e).toBeLessThanOrEqual(1e-10);
        expect(rel).toBeLessThanOrEqual(1e-5);
        expectTail(yb, R * n, `y ${R}x${n}`);
        expect(Array.from(f32(xb, R * n))).toEqual(Array.from(x)); // x untouched without a residual
        worst = Math.max(worst, e);
        worstRel = Math.max(worstRel, rel);
      }
      console.log(`  rmsnorm ${name}: worst NMSE ${worst.toExponential(2)}, worst element relative error ${worstRel.toExponential(2)}`);
    }, 60_000);
  }

  test("fused residual: h += add (bit-exact f32 sums), y = rmsNorm(h); offsets and strides", () => {
    for (const [R, n] of [[1, 33], [4, 2047], [2, 4097]] as const) {
      const stride = n + 5, yStride = n + 3, xOff = 11, aOff = 7, wOff = 2, yOff = 13;
      const words = xOff + R * stride;
      const h = randomGaussianF32(words, seed++), add = randomGaussianF32(aOff + R * stride, seed++, 0.5), w = randomGaussianF32(wOff + n, seed++);
      using hb = hostBuffer(words);
      using ab = hostBuffer(add.length, "upload");
      using wb = hostBuffer(w.length, "upload");
      using yb = hostBuffer(yOff + R * yStride);
      f32(hb, words).set(h);
      f32(ab, add.length).set(add);
      f32(wb, w.length).set(w);
      submitAndWait(device, (cb) => rms.record(cb, { x: hb, add: ab, w: wb, y: yb, rows: R, n, eps: 1e-5, xOffset: xOff, xStride: stride, addOffset: aOff, wOffset: wOff, yOffset: yOff, yStride }));
      const hRef = h.slice();
      const rows = new Float32Array(R * n), yRef = new Float32Array(R * n), got = new Float32Array(R * n);
      for (let r = 0; r < R; r++) for (let i = 0; i < n; i++) {
        const at = xOff + r * stride + i;
        hRef[at] = h[at]! + add[aOff + r * stride + i]!;
        rows[r * n + i] = hRef[at]!;
        got[r * n + i] = f32(yb, 1, yOff + r * yStride + i)[0]!;
      }
      expect(Array.from(f32(hb, words))).toEqual(Array.from(hRef)); // gaps between rows untouched too
      rmsNorm(rows, w.subarray(wOff), n, R, 1e-5, yRef);
      expect(nmseOf(yRef, got)).toBeLessThanOrEqual(1e-10);
      expect(maxRel(yRef, got)).toBeLessThanOrEqual(1e-5);
      // the gaps of y between rows and before yOffset keep their sentinels
      for (let r = 0; r < R; r++) expect(Array.from(u32(yb, yStride - n, yOff + r * yStride + n))).toEqual(new Array(yStride - n).fill(SENTINEL));
      expect(Array.from(u32(yb, yOff))).toEqual(new Array(yOff).fill(SENTINEL));
      expectTail(hb, words, "h");
      expectTail(yb, yOff + R * yStride, "y");
    }
  }, 60_000);

  test("per-head q/k norm in place (y = x): rows = tokens x heads, n = headDim 64/128/256", () => {
    for (const hd of [64, 128, 256]) {
      const R = 3 * 8; // 3 tokens x 8 heads
      const q = randomGaussianF32(R * hd, seed++, 2), w = randomGaussianF32(hd, seed++);
      using qb = hostBuffer(R * hd);
      using wb = hostBuffer(hd, "upload");
      f32(qb, R * hd).set(q);
      f32(wb, hd).set(w);
      submitAndWait(device, (cb) => rms.record(cb, { x: qb, w: wb, y: qb, rows: R, n: hd, eps: 1e-6 }));
      const ref = q.slice();
      rmsNorm(ref, w, hd, R, 1e-6, ref);
      expect(nmseOf(ref, f32(qb, R * hd))).toBeLessThanOrEqual(1e-10);
      expect(maxRel(ref, f32(qb, R * hd))).toBeLessThanOrEqual(1e-5);
      expectTail(qb, R * hd, "q");
    }
  }, 60_000);
});

// ---------------------------------------------------------------------------------------------
/** The CPU reference of one rope_kv call: rotated q, k (f32) and the f16 bits of k and v. */
function ropeReference(q: Float32Array, k: Float32Array, S: number, H: number, KV: number, hd: number, pos0: number, inv: Float32Array) {
  const qr = q.slice(), kr = k.slice();
  for (let t = 0; t < S; t++) {
    applyRope(qr, t * H * hd, H, hd, pos0 + t, inv);
    applyRope(kr, t * KV * hd, KV, hd, pos0 + t, inv);
  }
  return { q: qr, k: kr };
}

/** Per-element bound |gpu - cpu| ≤ bound (|x1| + |x2|) of the pair it came from (2^-21: see the report). */
function expectRotated(ref: Float32Array, got: Float32Array, orig: Float32Array, rows: number, hd: number, what: string, bound = 2 ** -21): number {
  const half = hd / 2;
  let worst = 0;
  for (let r = 0; r < rows; r++) for (let i = 0; i < half; i++) {
    const b = r * hd;
    const scale = Math.abs(orig[b + i]!) + Math.abs(orig[b + i + half]!);
    for (const j of [i, i + half]) {
      const d = Math.abs(ref[b + j]! - got[b + j]!);
      const rel = scale === 0 ? d : d / scale;
      worst = Math.max(worst, rel);
      if (!(rel <= bound)) throw new Error(`${what}: row ${r} element ${j}: cpu ${ref[b + j]} gpu ${got[b + j]} (|d|/(|x1|+|x2|) = ${rel})`);
    }
  }
  return worst;
}

/** Fused head norm: the error of the normalised values (f32 sum of squares, a few ulp in 1/sqrt) adds to the rotation's 2^-21. */
const NORM_ROPE_BOUND = 2 ** -20;

describe("dec_rope_kv vs ops.ts applyRope", () => {
  test("cos/sin: rotating (1, 0) at positions 0..2^24 gives f32 cos and sin within 2 ulp of the rounded f64 values", () => {
    const hd = 256, S = 64;
    let worst = 0, exact = 0, total = 0;
    for (const theta of [1e4, 1e6]) {
      const inv = ropeInverseFrequencies(hd, theta);
      for (const pos0 of [0, 1000, 40000, 131072 - 17, 1_000_003, (1 << 24) - S]) {
        const q = new Float32Array(S * hd);
        for (let t = 0; t < S; t++) for (let i = 0; i < hd / 2; i++) q[t * hd + i] = 1;
        using qb = hostBuffer(S * hd), kb = hostBuffer(S * hd), vb = hostBuffer(S * hd, "upload"), ib = hostBuffer(hd / 2, "upload");
        using kc = hostBuffer(hd / 2), vc = hostBuffer(hd / 2);
        f32(qb, S * hd).set(q);
        f32(kb, S * hd).set(q);
        f32(ib, hd / 2).set(inv);
        submitAndWait(device, (cb) => rope.record(cb, { q: qb, k: kb, v: vb, invFreq: ib, kCache: kc, vCache: vc, S, heads: 1, kvHeads: 1, headDim: hd, ctx: 1, pos0, writeCache: false }));
        const got = f32(qb, S * hd);
        for (let t = 0; t < S; t++) for (let i = 0; i < hd / 2; i++) {
          const angle = Math.fround((pos0 + t) * inv[i]!);
          for (const [ref, g] of [[Math.fround(Math.cos(angle)), got[t * hd + i]!], [Math.fround(Math.sin(angle)), got[t * hd + hd / 2 + i]!]] as const) {
            const u = ulps(ref, g);
            worst = Math.max(worst, u);
            if (u === 0) exact++;
            total++;
            if (!(u <= 2)) throw new Error(`theta ${theta} pos ${pos0 + t} i ${i} angle ${angle}: ref ${ref} gpu ${g} (${u} ulp)`);
          }
        }
        expect(Array.from(f32(kb, S * hd))).toEqual(Array.from(got)); // k heads rotate the same way
        expect(Array.from(u32(kc, hd / 2 + TAIL))).toEqual(new Array(hd / 2 + TAIL).fill(SENTINEL)); // writeCache false
      }
    }
    console.log(`  rope cos/sin: ${total} values, ${(100 * exact / total).toFixed(2)}% correctly rounded, worst ${worst.toFixed(2)} ulp`);
  }, 120_000);

  // Far positions need a cache of ctx > pos rows: one shared pair of caches of CTX rows x 2 kv heads x 256.
  const CTX = 40_064, ROW_MAX = 2 * 256;
  // created in beforeAll: a filtered run (bun test -t) that skips this block creates nothing to leak
  let kCache!: Buffer, vCache!: Buffer;
  // head-norm reduction variants: shared-memory tree with a workgroup of 24 (not a power of two),
  // and 16 threads (several groups of 4 per thread from head_dim 128)
  let ropeShared!: RopeKvKernel, ropeNarrow!: RopeKvKernel;
  beforeAll(() => {
    kCache = hostBuffer((CTX * ROW_MAX) / 2);
    vCache = hostBuffer((CTX * ROW_MAX) / 2);
    ropeShared = new RopeKvKernel(device, { useSubgroup: false, workgroupSize: 24 });
    ropeNarrow = new RopeKvKernel(device, { workgroupSize: 16 });
  });
  afterAll(() => {
    ropeNarrow[Symbol.dispose]();
    ropeShared[Symbol.dispose]();
    kCache[Symbol.dispose]();
    vCache[Symbol.dispose]();
  });

  interface NormCase {
    eps: number;
    /** Also check that the comparison fails against references that ignore the weights, eps, or the norm. */
    controls?: boolean;
  }
  /** Head norm case data: weights at offsets 3 and hd + 8 of a buffer that is NaN elsewhere. */
  function normData(hd: number) {
    const qw = randomGaussianF32(hd, seed++, 0.5).map((x) => 1 + x), kw = randomGaussianF32(hd, seed++, 0.5).map((x) => 1 + x);
    const qOffset = 3, kOffset = hd + 8, words = 2 * hd + 13;
    const host = new Float32Array(words).fill(NaN);
    host.set(qw, qOffset);
    host.set(kw, kOffset);
    return { qw, kw, qOffset, kOffset, words, host };
  }
  /** Heads (rows) at scales 1, 2^-10, 4 from `start` in that cycle: eps (~1e-6) matters at 2^-10. */
  const headScales = [1, 2 ** -10, 4];
  function scaleHeads(x: Float32Array, hd: number, start: number): void {
    for (let r = 0; r < x.length / hd; r++) for (let i = 0; i < hd; i++) x[r * hd + i] = x[r * hd + i]! * headScales[(r + start) % headScales.length]!;
  }
  const headNorm = (x: Float32Array, w: Float32Array, hd: number, eps: number) => {
    const out = new Float32Array(x.length);
    rmsNorm(x, w, hd, x.length / hd, eps, out);
    return out;
  };

  /** Runs one case and checks q, k (f32), the cache rows written (f16) and the rows around them. */
  function ropeCase(
    S: number, H: number, KV: number, hd: number, pos0: number, theta: number,
    opts: { viaBuffer?: boolean; special?: boolean; norm?: NormCase; kernel?: RopeKvKernel } = {},
  ) {
    const inv = ropeInverseFrequencies(hd, theta, "bf16");
    const q = randomGaussianF32(S * H * hd, seed++), k = randomGaussianF32(S * KV * hd, seed++, 4), v = randomGaussianF32(S * KV * hd, seed++, 2);
    const nd = opts.norm ? normData(hd) : undefined;
    if (nd) {
      scaleHeads(q, hd, 0); // q has >= 2 heads: one at 2^-10
      scaleHeads(k, hd, 1); // k head 0 at 2^-10
    }
    if (opts.special) {
      const sp = [0, -0, 65504, -65519.99, 65520, 1e5, Infinity, -Infinity, NaN, 2 ** -24, 2 ** -25, -(2 ** -25) * 1.5, 2 ** -14, 2 ** -14 - 2 ** -25, 6.1e-5, 3e-8, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 2049, 2051];
      sp.forEach((x, i) => (v[i] = x));
      for (let i = sp.length; i < v.length; i++) v[i] = v[i]! * 2 ** -(i % 30); // a spread of exponents, subnormal halves included
    }
    const row = KV * hd, qn = S * H * hd, kn = S * row;
    using qb = hostBuffer(qn), kb = hostBuffer(kn), vb = hostBuffer(kn, "upload"), ib = hostBuffer(hd / 2, "upload"), pb = hostBuffer(4, "upload");
    using wb = hostBuffer(nd?.words ?? 1, "upload");
    f32(qb, qn).set(q);
    f32(kb, kn).set(k);
    f32(vb, kn).set(v);
    f32(ib, hd / 2).set(inv);
    const args: RopeKvArgs = { q: qb, k: kb, v: vb, invFreq: ib, kCache, vCache, S, heads: H, kvHeads: KV, headDim: hd, ctx: CTX, pos0 };
    if (opts.viaBuffer) {
      u32(pb, 4).set([0, 0, pos0 - 5, 0]);
      Object.assign(args, { pos0: 5, positions: pb, posIndex: 2 });
    }
    if (nd) {
      f32(wb, nd.words).set(nd.host);
      args.norm = { weights: wb, qOffset: nd.qOffset, kOffset: nd.kOffset, eps: opts.norm!.eps };
    }
    submitAndWait(device, (cb) => (opts.kernel ?? rope).record(cb, args));
    // with the norm: the CPU's normalised q, k (ops.ts rmsNorm per head), then rotated
    const eps = opts.norm?.eps ?? 0;
    const qIn = nd ? headNorm(q, nd.qw, hd, eps) : q, kIn = nd ? headNorm(k, nd.kw, hd, eps) : k;
    const bound = nd ? NORM_ROPE_BOUND : 2 ** -21;
    const ref = ropeReference(qIn, kIn, S, H, KV, hd, pos0, inv);
    const worstQ = expectRotated(ref.q, f32(qb, qn), qIn, S * H, hd, "q", bound);
    const worstK = expectRotated(ref.k, f32(kb, kn), kIn, S * KV, hd, "k", bound);
    if (nd && opts.norm!.controls) {
      // negative controls: the same comparison fails against a reference that ignores the weights,
      // eps (heads at scale 2^-10 have mean(x^2) ~ 1e-6), or the norm altogether
      const ones = new Float32Array(hd).fill(1);
      const wrong: [string, Float32Array, Float32Array][] = [
        ["weights ignored", headNorm(q, ones, hd, eps), headNorm(k, ones, hd, eps)],
        ["no norm", q, k],
      ];
      if (eps > 0) wrong.push(["eps ignored", headNorm(q, nd.qw, hd, 0), headNorm(k, nd.kw, hd, 0)]);
      if (eps > 0) wrong.push(["eps doubled", headNorm(q, nd.qw, hd, 2 * eps), headNorm(k, nd.kw, hd, 2 * eps)]);
      for (const [name, wq, wk] of wrong) {
        const r = ropeReference(wq, wk, S, H, KV, hd, pos0, inv);
        expect(() => expectRotated(r.q, f32(qb, qn), wq, S * H, hd, `q (${name})`, bound)).toThrow();
        expect(() => expectRotated(r.k, f32(kb, kn), wk, S * KV, hd, `k (${name})`, bound)).toThrow();
      }
    }
    expectTail(qb, qn, "q");
    expectTail(kb, kn, "k");
    // cache rows pos0..pos0+S-1: v exact; k within 1 f16 ulp of the CPU's k rounded, exact against the GPU's own f32 k
    const kh = new Uint16Array(kCache.host(), 2 * pos0 * row, kn), vh = new Uint16Array(vCache.host(), 2 * pos0 * row, kn);
    const gk = f32(kb, kn);
    let kExact = 0;
    for (let i = 0; i < kn; i++) {
      expect(vh[i]).toBe(f32ToF16Bits(v[i]!));
      expect(kh[i]).toBe(f32ToF16Bits(gk[i]!));
      const want = f32ToF16Bits(ref.k[i]!);
      if (kh[i] === want) kExact++;
      else if (!((kh[i]! ^ want) < 0x8000 && Math.abs(kh[i]! - want) <= 1)) throw new Error(`k cache ${i}: gpu 0x${kh[i]!.toString(16)} cpu 0x${want.toString(16)}`);
    }
    // the rows before and after keep their sentinels; then restore them for the next case
    for (const r of [pos0 - 1, pos0 + S]) {
      if (r < 0 || r >= CTX) continue;
      expect(Array.from(u32(kCache, row / 2, (r * row) / 2))).toEqual(new Array(row / 2).fill(SENTINEL));
      expect(Array.from(u32(vCache, row / 2, (r * row) / 2))).toEqual(new Array(row / 2).fill(SENTINEL));
    }
    u32(kCache, kn / 2, (pos0 * row) / 2).fill(SENTINEL);
    u32(vCache, kn / 2, (pos0 * row) / 2).fill(SENTINEL);
    return { worst: Math.max(worstQ, worstK), kExact, kTotal: kn };
  }

  test("q, k rotated and k, v cached at position 40000: head_dim 64/128/256 x GQA 1, 2, 4, 8 x S 1, 3", () => {
    let worst = 0, exact = 0, total = 0;
    for (const hd of [64, 128, 256]) for (const [H, KV] of [[2, 2], [4, 2], [8, 2], [16, 2], [8, 1]] as const) for (const S of [1, 3]) {
      const r = ropeCase(S, H, KV, hd, 40_000 + S, 1e6);
      worst = Math.max(worst, r.worst);
      exact += r.kExact;
      total += r.kTotal;
    }
    console.log(`  rope q/k: worst |gpu-cpu|/(|x1|+|x2|) = ${worst.toExponential(2)} (bound 2^-21 = ${(2 ** -21).toExponential(2)}); k cache f16 ${exact}/${total} equal to the CPU's k rounded, the rest 1 ulp`);
  }, 120_000);

  test("positions from a buffer (positions[posIndex] + pos0 + t) near 0 and at 40000 with S = 7; f16 edge values of v exact", () => {
    ropeCase(7, 4, 1, 128, 0 + 5, 1e4, { viaBuffer: true, special: true });
    ropeCase(7, 8, 2, 64, 40_000, 1e6, { viaBuffer: true, special: true });
    ropeCase(7, 8, 2, 256, 39_999, 1e6, { viaBuffer: true });
  }, 60_000);

  test("head norm fused (flags bit 2) vs rmsNorm per head then applyRope: head_dim 32/64/128/256 x GQA 1..8 x S 1..5 at position ~40000; k, v cached", () => {
    let worst = 0, exact = 0, total = 0, cases = 0;
    for (const hd of [32, 64, 128, 256]) {
      // KV * hd <= ROW_MAX (the shared cache's row)
      const shapes: [number, number][] = hd <= 128 ? [[2, 2], [6, 2], [8, 1], [16, 2], [4, 4], [7, 1]] : [[2, 2], [6, 2], [8, 1], [16, 2], [7, 1]];
      for (const [H, KV] of shapes) for (const S of [1, 2, 3, 5]) {
        const eps = [1e-6, 1e-5, 0][cases % 3]!;
        const r = ropeCase(S, H, KV, hd, 40_000 - S * 7, 1e6, { norm: { eps, controls: cases % 4 === 0 } });
        worst = Math.max(worst, r.worst);
        exact += r.kExact;
        total += r.kTotal;
        cases++;
      }
    }
    console.log(`  rope + head norm: ${cases} cases, worst |gpu-cpu|/(|x1|+|x2|) = ${worst.toExponential(2)} (bound 2^-20 = ${NORM_ROPE_BOUND.toExponential(2)}); k cache f16 ${exact}/${total} equal to the CPU's k rounded, the rest 1 ulp`);
  }, 120_000);

  test("head norm: positions from a buffer; f16 edge values of v exact (v not normalised); shared-memory tree of 24 threads and 16 threads (several groups per thread)", () => {
    let worst = 0;
    for (const r of [
      ropeCase(5, 4, 1, 128, 0 + 5, 1e4, { viaBuffer: true, special: true, norm: { eps: 1e-6, controls: true } }),
      ropeCase(4, 8, 2, 64, 40_000, 1e6, { viaBuffer: true, special: true, norm: { eps: 1e-6 } }),
      ropeCase(3, 8, 2, 256, 39_999, 1e6, { viaBuffer: true, norm: { eps: 1e-6, controls: true } }),
      ...[ropeShared, ropeNarrow].flatMap((kernel) => [32, 64, 128, 256].map((hd) =>
        ropeCase(3, 8, 2, hd, 39_000 + hd, 1e6, { viaBuffer: hd === 128, norm: { eps: 1e-6, controls: true }, kernel }))),
    ]) worst = Math.max(worst, r.worst);
    console.log(`  rope + head norm (positions buffer, other reductions): worst |gpu-cpu|/(|x1|+|x2|) = ${worst.toExponential(2)}`);
  }, 60_000);

  test("head norm at position 0 (the rotation is the identity): each normalised q, k element vs ops.ts rmsNorm and vs dec_rmsnorm on the same heads", () => {
    let worstCpu = 0, worstRms = 0, worstUlpRms = 0, n = 0;
    for (const kernel of [rope, ropeShared, ropeNarrow]) for (const hd of [32, 64, 128, 256]) for (const eps of [1e-6, 0]) {
      const S = 2, H = 6, KV = 2, qn = S * H * hd, kn = S * KV * hd;
      const q = randomGaussianF32(qn, seed++), k = randomGaussianF32(kn, seed++, 4), v = randomGaussianF32(kn, seed++);
      scaleHeads(q, hd, 0);
      scaleHeads(k, hd, 1);
      const nd = normData(hd);
      using qb = hostBuffer(qn), kb = hostBuffer(kn), vb = hostBuffer(kn, "upload"), ib = hostBuffer(hd / 2, "upload"), wb = hostBuffer(nd.words, "upload");
      using rq = hostBuffer(qn), rk = hostBuffer(kn); // dec_rmsnorm's outputs
      using kc = hostBuffer(kn / 2), vc = hostBuffer(kn / 2);
      f32(qb, qn).set(q);
      f32(kb, kn).set(k);
      f32(vb, kn).set(v);
      f32(ib, hd / 2).set(ropeInverseFrequencies(hd, 1e6));
      f32(wb, nd.words).set(nd.host);
      f32(rq, qn).set(q);
      f32(rk, kn).set(k);
      submitAndWait(device, (cb) => {
        rms.record(cb, { x: rq, w: wb, y: rq, rows: S * H, n: hd, eps, wOffset: nd.qOffset });
        rms.record(cb, { x: rk, w: wb, y: rk, rows: S * KV, n: hd, eps, wOffset: nd.kOffset });
        // S tokens at position 0 each: pos0 = 0 and S = 1, twice (token 1 at offset)
        for (let t = 0; t < S; t++) {
          kernel.record(cb, {
            q: qb, k: kb, v: vb, invFreq: ib, kCache: kc, vCache: vc, S: 1, heads: H, kvHeads: KV, headDim: hd, ctx: 1, pos0: 0,
            qOffset: t * H * hd, kOffset: t * KV * hd, vOffset: t * KV * hd, kCacheOffset: 0, vCacheOffset: 0, writeCache: t === 0,
            norm: { weights: wb, qOffset: nd.qOffset, kOffset: nd.kOffset, eps },
          });
        }
      });
      for (const [x, w, gb, rb, len] of [[q, nd.qw, qb, rq, qn], [k, nd.kw, kb, rk, kn]] as const) {
        const ref = headNorm(x, w, hd, eps), got = f32(gb, len), viaRms = f32(rb, len);
        worstCpu = Math.max(worstCpu, maxRel(ref, got));
        worstRms = Math.max(worstRms, maxRel(viaRms, got));
        for (let i = 0; i < len; i++) worstUlpRms = Math.max(worstUlpRms, ulps(viaRms[i]!, got[i]!));
        n += len;
      }
      expect(Array.from(new Uint16Array(vc.host(), 0, kn / S))).toEqual(Array.from(v.subarray(0, kn / S), f32ToF16Bits)); // v cached as is
      expectTail(qb, qn, "q");
      expectTail(kb, kn, "k");
    }
    console.log(`  head norm at position 0: ${n} values, worst relative error vs rmsNorm (f64 sum) ${worstCpu.toExponential(2)}, vs dec_rmsnorm ${worstRms.toExponential(2)} (${worstUlpRms.toFixed(1)} ulp)`);
    expect(worstCpu).toBeLessThanOrEqual(1e-6);
    expect(worstRms).toBeLessThanOrEqual(1e-6);
  }, 60_000);

  test("head norm arguments are validated", () => {
    using qb = hostBuffer(64), kb = hostBuffer(64), vb = hostBuffer(64), ib = hostBuffer(32), kc = hostBuffer(64), vc = hostBuffer(64), wb = hostBuffer(100);
    const base: RopeKvArgs = { q: qb, k: kb, v: vb, invFreq: ib, kCache: kc, vCache: vc, S: 1, heads: 1, kvHeads: 1, headDim: 64, ctx: 1, pos0: 0 };
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    for (const norm of [
      { weights: wb, qOffset: 0, kOffset: Number(wb.size) / 4 - 63, eps: 1e-6 }, // k vector one word past the end
      { weights: wb, qOffset: -1, kOffset: 0, eps: 1e-6 },
      { weights: wb, qOffset: 0.5, kOffset: 0, eps: 1e-6 },
      { weights: wb, qOffset: 0, kOffset: 0, eps: -1e-6 },
      { weights: wb, qOffset: 0, kOffset: 0, eps: NaN },
      { weights: wb, qOffset: 0, kOffset: 0, eps: Infinity },
    ]) expect(() => rope.record(cb, { ...base, norm })).toThrow(InvalidArgumentError);
    rope.record(cb, { ...base, norm: { weights: wb, qOffset: Number(wb.size) / 4 - 64, kOffset: 0, eps: 0 } }); // the last 64 words: accepted
    cb.end();
  });

  test("layer offset in the cache, positions >= ctx not written; one recording replayed with new positions", () => {
    const hd = 64, KV = 2, H = 4, ctxRows = 8, layers = 3, row = KV * hd, S = 2;
    const inv = ropeInverseFrequencies(hd, 1e6);
    using qb = hostBuffer(S * H * hd), kb = hostBuffer(S * row), vb = hostBuffer(S * row, "upload"), ib = hostBuffer(hd / 2, "upload"), pb = hostBuffer(1, "upload");
    using kc = hostBuffer((layers * ctxRows * row) / 2), vc = hostBuffer((layers * ctxRows * row) / 2);
    f32(ib, hd / 2).set(inv);
    const layerBase = ctxRows * row; // halves: layer 1
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    rope.record(cb, { q: qb, k: kb, v: vb, invFreq: ib, kCache: kc, vCache: vc, S, heads: H, kvHeads: KV, headDim: hd, ctx: ctxRows, pos0: 0, positions: pb, kCacheOffset: layerBase, vCacheOffset: layerBase });
    cb.barrier("computeToHost").end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    for (const p of [0, 3, 7]) { // 7: token 1 is at position 8 = ctx, rotated but not cached
      const q = randomGaussianF32(S * H * hd, seed++), k = randomGaussianF32(S * row, seed++), v = randomGaussianF32(S * row, seed++);
      f32(qb, q.length).set(q);
      f32(kb, k.length).set(k);
      f32(vb, v.length).set(v);
      u32(pb, 1)[0] = p;
      new Uint32Array(kc.host()).fill(SENTINEL);
      new Uint32Array(vc.host()).fill(SENTINEL);
      submission.submit();
      expect(fence.wait()).toBe(true);
      fence.reset();
      const ref = ropeReference(q, k, S, H, KV, hd, p, inv);
      expectRotated(ref.q, f32(qb, q.length), q, S * H, hd, "q");
      expectRotated(ref.k, f32(kb, k.length), k, S * KV, hd, "k");
      const kh = new Uint16Array(kc.host()), vh = new Uint16Array(vc.host());
      const gk = f32(kb, k.length);
      for (let slot = 0; slot < layers * ctxRows; slot++) {
        const layer = Math.floor(slot / ctxRows), pos = slot % ctxRows, t = pos - p;
        const written = layer === 1 && t >= 0 && t < S;
        for (let i = 0; i < row; i += 2) {
          const at = slot * row + i;
          if (written) {
            expect(kh[at]).toBe(f32ToF16Bits(gk[t * row + i]!));
            expect(vh[at + 1]).toBe(f32ToF16Bits(v[t * row + i + 1]!));
          } else {
            expect(new Uint32Array(kc.host(), 2 * at, 1)[0]).toBe(SENTINEL);
            expect(new Uint32Array(vc.host(), 2 * at, 1)[0]).toBe(SENTINEL);
          }
        }
      }
      expectTail(kc, (layers * ctxRows * row) / 2, "k cache");
    }
  }, 60_000);

  test("batched (flags bit 3): tokens of different sequences, each rotated at its own position and cached at its own row", () => {
    const hd = 64, KV = 2, H = 8, ctxRows = 12, row = KV * hd;
    const steps = [[{ pos: 5, cacheRow: 5 }, { pos: 0, cacheRow: 12 }, { pos: 11, cacheRow: 35 }], [{ pos: 40000, cacheRow: 30 }, { pos: 7, cacheRow: 7 }, { pos: 1, cacheRow: 13 }]];
    const S = steps[0]!.length, rows = 3 * ctxRows;
    const inv = ropeInverseFrequencies(hd, 1e6);
    using qb = hostBuffer(S * H * hd), kb = hostBuffer(S * row), vb = hostBuffer(S * row, "upload"), ib = hostBuffer(hd / 2, "upload"), pb = hostBuffer(128, "upload");
    using kc = hostBuffer((rows * row) / 2), vc = hostBuffer((rows * row) / 2);
    f32(ib, hd / 2).set(inv);
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    rope.record(cb, { q: qb, k: kb, v: vb, invFreq: ib, kCache: kc, vCache: vc, S, heads: H, kvHeads: KV, headDim: hd, ctx: rows, pos0: 0, positions: pb, batched: true });
    cb.barrier("computeToHost").end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    for (const step of steps) {
      const q = randomGaussianF32(S * H * hd, seed++), k = randomGaussianF32(S * row, seed++), v = randomGaussianF32(S * row, seed++);
      f32(qb, q.length).set(q);
      f32(kb, k.length).set(k);
      f32(vb, v.length).set(v);
      step.forEach(({ pos, cacheRow }, t) => {
        u32(pb, 128)[t] = pos;
        u32(pb, 128)[64 + t] = cacheRow;
      });
      new Uint32Array(kc.host()).fill(SENTINEL);
      new Uint32Array(vc.host()).fill(SENTINEL);
      submission.submit();
      expect(fence.wait()).toBe(true);
      fence.reset();
      const gk = f32(kb, k.length), kh = new Uint16Array(kc.host()), vh = new Uint16Array(vc.host());
      step.forEach(({ pos }, t) => {
        const ref = ropeReference(q.subarray(t * H * hd, (t + 1) * H * hd), k.subarray(t * row, (t + 1) * row), 1, H, KV, hd, pos, inv);
        expectRotated(ref.q, f32(qb, H * hd, t * H * hd), q.subarray(t * H * hd), H, hd, "q");
        expectRotated(ref.k, f32(kb, row, t * row), k.subarray(t * row), KV, hd, "k");
      });
      for (let r = 0; r < rows; r++) {
        const t = step.findIndex((x) => x.cacheRow === r);
        for (let i = 0; i < row; i += 2) {
          const at = r * row + i;
          if (t >= 0) {
            expect(kh[at]).toBe(f32ToF16Bits(gk[t * row + i]!));
            expect(vh[at + 1]).toBe(f32ToF16Bits(v[t * row + i + 1]!));
          } else {
            expect(new Uint32Array(kc.host(), 2 * at, 1)[0]).toBe(SENTINEL);
          }
        }
      }
    }
  }, 60_000);
});

// ---------------------------------------------------------------------------------------------
describe("dec_argmax vs select.ts argmax (exact id and value)", () => {
  const V_MAX = 262_144;
  let logits!: Buffer, result!: Buffer;
  beforeAll(() => {
    logits = hostBuffer(V_MAX, "upload");
    result = hostBuffer(2);
  });
  afterAll(() => {
    logits[Symbol.dispose]();
    result[Symbol.dispose]();
  });

  function run(x: Float32Array): { id: number; value: number } {
    f32(logits, x.length).set(x);
    u32(result, 2).fill(SENTINEL);
    submitAndWait(device, (cb) => argmaxKernel.record(cb, { logits, V: x.length, result }));
    expectTail(result, 2, "result");
    return { id: u32(result, 1)[0]!, value: f32(result, 1, 1)[0]! };
  }
  function expectArgmax(x: Float32Array, what: string): void {
    const want = argmax(x);
    const got = run(x);
    expect({ what, id: got.id }).toEqual({ what, id: want < 0 ? ARGMAX_NONE : want });
    if (want >= 0) expect(got.value).toBe(x[want]!);
    else expect(got.value).toBe(-Infinity);
  }

  test("random logits, V = 1, 33, 2047, 4097, 151936, 262144", () => {
    for (const V of [1, 33, 2047, 4097, 151_936, 262_144]) expectArgmax(randomGaussianF32(V, seed++, 5), `V=${V}`);
  }, 60_000);

  test("ties resolve to the lowest id: within a thread, across threads, across workgroups", () => {
    const V = 151_936;
    for (const ids of [[7, 7 + 256], [4096 + 3, 4095], [151_935, 100_000, 60_001], [3, 2], [0, 151_935]]) {
      const x = randomGaussianF32(V, seed++);
      for (const i of ids) x[i] = 9;
      expectArgmax(x, `ties at ${ids.join(", ")}`);
      expect(run(x).id).toBe(Math.min(...ids));
    }
    expectArgmax(new Float32Array(V).fill(-3), "all equal");
    expect(run(new Float32Array(V).fill(-3)).id).toBe(0);
  }, 60_000);

  test("-Infinity and NaN are never chosen; all -Infinity gives none (select.ts: -1)", () => {
    const V = 70_000;
    const x = new Float32Array(V).fill(-Infinity);
    expectArgmax(x, "all -inf");
    expect(run(x).id).toBe(ARGMAX_NONE);
    x[V - 1] = -1e30;
    expectArgmax(x, "one finite at the end");
    x.fill(NaN, 0, 5000);
    x[4000] = -1e38;
    expectArgmax(x, "NaN and -inf around two finite values");
    const y = randomGaussianF32(V, seed++);
    for (let i = 0; i < V; i += 3) y[i] = -Infinity;
    for (let i = 1; i < V; i += 7) y[i] = NaN;
    expectArgmax(y, "mixed");
    x.fill(NaN);
    expect(run(x).id).toBe(ARGMAX_NONE);
  }, 60_000);

  test("one recording replayed: the arrival counter is back to 0 after every dispatch", () => {
    const V = 100_003;
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    argmaxKernel.record(cb, { logits, V, result });
    cb.barrier("computeToHost").end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    for (let r = 0; r < 4; r++) {
      const x = randomGaussianF32(V, seed++);
      f32(logits, V).set(x);
      submission.submit();
      expect(fence.wait()).toBe(true);
      fence.reset();
      expect(u32(result, 1)[0]).toBe(argmax(x));
    }
  }, 60_000);
});

// ---------------------------------------------------------------------------------------------
describe("dec_topk vs select.ts selectTopK (exact ids, values and count, best first)", () => {
  let logits!: Buffer, result!: Buffer;
  beforeAll(() => {
    logits = hostBuffer(262_144, "upload");
    result = hostBuffer(topk.resultWords);
  });
  afterAll(() => {
    logits[Symbol.dispose]();
    result[Symbol.dispose]();
  });
  function expectTopK(x: Float32Array, k: number, what: string): number {
    const ids = new Int32Array(k), values = new Float64Array(k);
    const n = selectTopK(x, k, ids, values);
    f32(logits, x.length).set(x);
    u32(result, topk.resultWords).fill(SENTINEL);
    submitAndWait(device, (cb) => topk.record(cb, { logits, V: x.length, k, result }));
    const K = topk.maxK;
    const count = u32(result, 1, 2 * K)[0]!;
    expect({ what, count }).toEqual({ what, count: n });
    expect({ what, ids: Array.from(u32(result, n)) }).toEqual({ what, ids: Array.from(ids.subarray(0, n)) });
    expect({ what, values: Array.from(f32(result, n, K)) }).toEqual({ what, values: Array.from(values.subarray(0, n)) });
    // slots past the count keep their sentinels
    expect(Array.from(u32(result, K - n, n))).toEqual(new Array(K - n).fill(SENTINEL));
    expectTail(result, topk.resultWords, "result");
    return n;
  }

  test("random logits: V = 1, 33, 4097, 151936 x k = 1, 5, 40, 64", () => {
    for (const V of [1, 33, 4097, 151_936]) for (const k of [1, 5, 40, 64]) expectTopK(randomGaussianF32(V, seed++, 3), k, `V=${V} k=${k}`);
  }, 60_000);

  test("ties across the k boundary and across workgroups; -Infinity and NaN excluded (fewer than k found)", () => {
    const V = 151_936;
    const x = randomGaussianF32(V, seed++);
    for (let i = 0; i < V; i += 997) x[i] = 5; // 153 equal values, k of them kept: the lowest ids
    expectTopK(x, 64, "153 ties, k = 64");
    const q = new Float32Array(V).fill(1); // all equal: ids 0..k-1
    expectTopK(q, 64, "all equal");
    const y = new Float32Array(V).fill(-Infinity);
    for (const i of [9, 70_000, 151_935, 4096]) y[i] = -i;
    y.fill(NaN, 10, 4000);
    expect(expectTopK(y, 64, "4 candidates")).toBe(4);
    expect(expectTopK(new Float32Array(V).fill(-Infinity), 8, "none")).toBe(0);
  }, 60_000);

  test("one recording replayed: the arrival counter is back to 0 after every dispatch", () => {
    const V = 100_003, k = 50;
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    topk.record(cb, { logits, V, k, result });
    cb.barrier("computeToHost").end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    for (let r = 0; r < 3; r++) {
      const x = randomGaussianF32(V, seed++);
      f32(logits, V).set(x);
      submission.submit();
      expect(fence.wait()).toBe(true);
      fence.reset();
      const ids = new Int32Array(k), values = new Float64Array(k);
      selectTopK(x, k, ids, values);
      expect(Array.from(u32(result, k))).toEqual(Array.from(ids));
    }
  }, 60_000);
});
