/**
 * dec_attention_decode with ROPE_FOLD (the q/k head norms, RoPE and the f16 KV append folded into
 * decode's pass 1) against dec_rope_kv followed by the unfolded dec_attention_decode on the same
 * inputs: out and both whole caches bit-equal, for head_dim 64/128/256 x GQA 1/2/8 (two KV heads)
 * x positions 1, 31, 32, 33, 500 (chunk 32: both sides of chunk edges) x head norms on and off,
 * partial rotary (Qwen3.5: rotaryDim < headDim), S = 2..4 (tokens straddling a chunk edge: token
 * t reads the new rows of tokens < t), the positions word from a buffer (posIndex > 0) or n alone,
 * a grid capped below the chunks (maxDecodeGroups 1 and 3: a workgroup walks several chunks), the
 * kernel's default shape (chunk 64), the unrolled variant GPUs run, and a layer offset in the cache.
 * The cache rows at the new positions start as random garbage, so a fold that read them (instead of
 * its own new rows) would differ. Each fold's out is also compared with an f64 reference (CPU
 * rmsNorm per head, applyRope, f16 rounding, attendCpu): NMSE <= 1e-6 (the CPU's cos/sin and
 * rounding differ from the kernels' by an ulp, which can flip a half of k; measured figures printed).
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { DecoderAttention } from "../src/kernels/decoder/attention.ts";
import { RopeKvKernel } from "../src/kernels/decoder/rope-kv.ts";
import { applyRope, attendCpu, rmsNorm, ropeInverseFrequencies } from "../src/model/ops.ts";
import { f16BitsToF32, f32ToF16Bits } from "../src/quant/half.ts";
import { nmse, randomGaussianF32 } from "../src/quant/index.ts";
import { CommandPool } from "../src/vk/commands.ts";
import { Buffer } from "../src/vk/memory.ts";
import { Fence, Submission } from "../src/vk/sync.ts";
import { halves } from "./support/attention-data.ts";
import { finish, openTestContext } from "./support/gpu.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
const ops = new Map<string, DecoderAttention>();
const rope = new RopeKvKernel(device, { maxSets: 1024 });
const ropeShared = new RopeKvKernel(device, { maxSets: 64, useSubgroup: false });
afterAll(() => {
  for (const op of ops.values()) op[Symbol.dispose]();
  rope[Symbol.dispose]();
  ropeShared[Symbol.dispose]();
  finish(ctx);
});

const REF_BOUND = 1e-6;
/** Per test: llvmpipe compiles a pipeline per shape. */
const TIMEOUT = 60_000;
const EPS = 1e-6;
let seed = 7000;
let worstRef = 0;
let cases = 0;

interface Case {
  headDim: number;
  group: number;
  /** Position of token 0 (the positions word, or n - 1 without a buffer). */
  pos: number;
  S?: number;
  kvHeads?: number;
  norm?: boolean;
  rotaryDim?: number;
  /** Read the position from a positions buffer (default true) at this word (default 0). */
  viaBuffer?: boolean;
  posIndex?: number;
  /** The graph's GPU shape by default (chunk 32, 128 threads); {} for the kernel's defaults. */
  shape?: { chunk?: number; workgroupSize?: number };
  maxDecodeGroups?: number;
  unroll?: boolean;
  /** Cache layers (the case uses the last). */
  layers?: number;
  /** The head norm's shared-memory tree on both sides (no subgroupAdd). */
  sharedTree?: boolean;
}

function opFor(c: Case, H: number, KV: number): DecoderAttention {
  const shape = c.shape ?? { chunk: 32, workgroupSize: 128 };
  const key = `${H}/${KV}/${c.headDim}/${shape.chunk}/${shape.workgroupSize}/${c.maxDecodeGroups}/${c.unroll}/${c.sharedTree}`;
  let op = ops.get(key);
  if (!op) {
    op = new DecoderAttention(device, { heads: H, kvHeads: KV, headDim: c.headDim, maxBindings: 256, ropeFold: true, ...shape, ...(c.maxDecodeGroups && { maxDecodeGroups: c.maxDecodeGroups }), ...(c.unroll !== undefined && { unroll: c.unroll }), ...(c.sharedTree && { ropeFoldSubgroup: false }) });
    expect(op.ropeFold).toBe(true);
    ops.set(key, op);
  }
  return op;
}

const hostBuf = (bytes: number, data?: ArrayBufferView) => {
  const b = new Buffer(device, { size: BigInt(Math.max(16, Math.ceil(bytes / 16) * 16)), memory: "readback" });
  if (data) new Uint8Array(b.host()).set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  return b;
};

/** The f64 reference of the fold's out: per-head rmsNorm, RoPE on the first rd dims, k and v rounded to f16, attendCpu. */
function reference(c: Case, H: number, KV: number, S: number, q: Float32Array, k: Float32Array, v: Float32Array, cacheK: Float32Array, cacheV: Float32Array, inv: Float32Array, qw: Float32Array, kw: Float32Array): Float32Array {
  const hd = c.headDim, rd = c.rotaryDim ?? hd;
  const head = (x: Float32Array, o: number, w: Float32Array, pos: number) => {
    const h = x.slice(o, o + hd);
    if (c.norm) rmsNorm(h.slice(), w, hd, 1, EPS, h);
    const r = h.slice(0, rd);
    applyRope(r, 0, 1, rd, pos, inv);
    h.set(r);
    return h;
  };
  const qr = new Float32Array(q.length);
  for (let t = 0; t < S; t++) for (let h = 0; h < H; h++) qr.set(head(q, (t * H + h) * hd, qw, c.pos + t), (t * H + h) * hd);
  const keys = cacheK.slice(), values = cacheV.slice();
  for (let t = 0; t < S; t++) {
    for (let h = 0; h < KV; h++) {
      const o = (t * KV + h) * hd, row = ((c.pos + t) * KV + h) * hd;
      const kh = head(k, o, kw, c.pos + t);
      for (let i = 0; i < hd; i++) {
        keys[row + i] = f16BitsToF32(f32ToF16Bits(kh[i]!));
        values[row + i] = f16BitsToF32(f32ToF16Bits(v[o + i]!));
      }
    }
  }
  const out = new Float32Array(S * H * hd);
  attendCpu(qr, keys, values, S, c.pos, H, KV, hd, out);
  return out;
}

/** Runs the case both ways; returns the cache words and out floats that differ, and the fold's NMSE against the f64 reference. */
function runCase(c: Case): { outDiffs: number; cacheDiffs: number; refNmse: number } {
  const hd = c.headDim, G = c.group, KV = c.kvHeads ?? 2, H = KV * G, S = c.S ?? 1, rd = c.rotaryDim ?? hd;
  const viaBuffer = c.viaBuffer ?? true, posIndex = c.posIndex ?? 0, layers = c.layers ?? 1;
  const op = opFor(c, H, KV);
  const rows = c.pos + S + 5; // a few rows past the new ones
  const perLayer = rows * KV * hd;
  const cache = { k: halves(layers * perLayer, seed++), v: halves(layers * perLayer, seed++) };
  const q = randomGaussianF32(S * H * hd, seed++);
  const k = randomGaussianF32(S * KV * hd, seed++);
  const v = randomGaussianF32(S * KV * hd, seed++);
  const inv = ropeInverseFrequencies(rd, 1e6, "bf16");
  const norms = new Float32Array(2 * hd);
  const nw = randomGaussianF32(2 * hd, seed++, 0.2);
  for (let i = 0; i < 2 * hd; i++) norms[i] = 1 + nw[i]!;
  const positions = new Uint32Array(posIndex + 1);
  positions[posIndex] = c.pos;
  const n = viaBuffer ? 1 : c.pos + 1;
  const cacheOffset = op.layerOffset(layers - 1, rows);

  using qA = hostBuf(4 * q.length, q), kA = hostBuf(4 * k.length, k), qB = hostBuf(4 * q.length, q), kB = hostBuf(4 * k.length, k), vBuf = hostBuf(4 * v.length, v);
  using invBuf = hostBuf(4 * inv.length, inv), normBuf = hostBuf(4 * norms.length, norms), posBuf = hostBuf(4 * positions.length, positions);
  using kcA = hostBuf(2 * cache.k.bits.length, cache.k.bits), vcA = hostBuf(2 * cache.v.bits.length, cache.v.bits);
  using kcB = hostBuf(2 * cache.k.bits.length, cache.k.bits), vcB = hostBuf(2 * cache.v.bits.length, cache.v.bits);
  const partialBytes = op.partialBytes(rows, S);
  using partA = hostBuf(partialBytes), partB = hostBuf(partialBytes), outA = hostBuf(4 * S * H * hd), outB = hostBuf(4 * S * H * hd);
  const pos = viaBuffer ? { positions: posBuf } : {};
  const norm = c.norm ? { qOffset: 0, kOffset: hd } : undefined;

  using pool = new CommandPool(device);
  const cb = pool.allocate().begin();
  // unfolded: dec_rope_kv (q, k in place; k, v into the cache), a barrier, the attention
  (c.sharedTree ? ropeShared : rope).record(cb, {
    q: qA, k: kA, v: vBuf, invFreq: invBuf, kCache: kcA, vCache: vcA, S, heads: H, kvHeads: KV, headDim: hd, ctx: rows, pos0: n - 1,
    kCacheOffset: cacheOffset, vCacheOffset: cacheOffset, rotaryDim: rd,
    ...(viaBuffer && { positions: posBuf, posIndex }), ...(norm && { norm: { weights: normBuf, ...norm, eps: EPS } }),
  });
  cb.barrier("computeToCompute");
  const bindA = op.bind({ q: qA, keys: kcA, values: vcA, partials: partA, out: outA, ...pos });
  op.record(cb, bindA, { n, S, cacheOffset, ...(viaBuffer && { posIndex, maxPositions: rows }) });
  // folded: raw q, k, v
  const bindB = op.bind({ q: qB, keys: kcB, values: vcB, partials: partB, out: outB, ...pos, fold: { k: kB, v: vBuf, invFreq: invBuf, normWeights: normBuf } });
  op.record(cb, bindB, { n, S, cacheOffset, ...(viaBuffer && { posIndex, maxPositions: rows }), rope: { rotaryDim: rd, ...(norm && { norm: { ...norm, eps: EPS } }) } });
  cb.barrier("computeToHost").end();
  using fence = new Fence(device);
  using submission = new Submission(device, [cb], { fence });
  submission.submit();
  if (!fence.wait()) throw new Error("rope fold case timed out");

  const words = (b: Buffer, count: number) => new Uint32Array(b.host(), 0, count);
  const diff = (a: Uint32Array, b: Uint32Array) => a.reduce((d, w, i) => d + (w !== b[i] ? 1 : 0), 0);
  const outWords = S * H * hd;
  const outDiffs = diff(words(outA, outWords), words(outB, outWords));
  const cacheWords = cache.k.bits.length / 2;
  const cacheDiffs = diff(words(kcA, cacheWords), words(kcB, cacheWords)) + diff(words(vcA, cacheWords), words(vcB, cacheWords));
  // the fold leaves q and k as the GEMVs wrote them
  expect(diff(words(qB, q.length), new Uint32Array(q.buffer))).toBe(0);
  expect(diff(words(kB, k.length), new Uint32Array(k.buffer))).toBe(0);
  const lk = cache.k.values.subarray((layers - 1) * perLayer, layers * perLayer), lv = cache.v.values.subarray((layers - 1) * perLayer, layers * perLayer);
  const ref = reference(c, H, KV, S, q, k, v, lk, lv, inv, norms.subarray(0, hd), norms.subarray(hd));
  const refNmse = nmse(ref, new Float32Array(outB.host(), 0, S * H * hd));
  worstRef = Math.max(worstRef, refNmse);
  cases++;
  return { outDiffs, cacheDiffs, refNmse };
}

const label = (c: Case) =>
  `hd ${c.headDim} G ${c.group} pos ${c.pos} S ${c.S ?? 1}${c.norm ? " norm" : ""}${c.rotaryDim ? ` rd ${c.rotaryDim}` : ""}${c.viaBuffer === false ? " n only" : ""}${c.maxDecodeGroups ? ` grid ${c.maxDecodeGroups}` : ""}${c.shape ? " default shape" : ""}${c.unroll ? " unrolled" : ""}${c.sharedTree ? " shared tree" : ""}`;

function check(list: Case[]): void {
  for (const c of list) {
    const r = runCase(c);
    expect({ case: label(c), out: r.outDiffs, cache: r.cacheDiffs, refOk: r.refNmse <= REF_BOUND }).toEqual({ case: label(c), out: 0, cache: 0, refOk: true });
  }
}

const POSITIONS = [1, 31, 32, 33, 500];

describe("dec_attention_decode ROPE_FOLD vs dec_rope_kv + dec_attention_decode (bit-equal out and caches)", () => {
  for (const headDim of [64, 128, 256]) {
    test(`head_dim ${headDim}: GQA 1/2/8 x positions ${POSITIONS.join(", ")} x head norms on/off, S = 1, positions from a buffer`, () => {
      check([1, 2, 8].flatMap((group) => POSITIONS.flatMap((pos) => [true, false].map((norm) => ({ headDim, group, pos, norm })))));
    }, TIMEOUT);
  }

  test("partial rotary (rotaryDim 64 of 256, 32 of 128, 4 of 64), head norms on and off", () => {
    check([
      ...POSITIONS.map((pos) => ({ headDim: 256, group: 8, pos, norm: true, rotaryDim: 64 })),
      { headDim: 256, group: 8, pos: 33, norm: false, rotaryDim: 64 },
      { headDim: 128, group: 2, pos: 500, norm: true, rotaryDim: 32 },
      { headDim: 64, group: 1, pos: 31, norm: true, rotaryDim: 4 },
    ]);
  }, TIMEOUT);

  test("S = 2..4: tokens on both sides of a chunk edge read the earlier tokens' new rows (from the workgroup, not the cache)", () => {
    check([
      ...[2, 3, 4].flatMap((S) => [30, 31, 32].map((pos) => ({ headDim: 128, group: 8, pos, S, norm: true }))),
      { headDim: 64, group: 1, pos: 1, S: 4, norm: true },
      { headDim: 256, group: 2, pos: 500, S: 3, norm: false },
      { headDim: 256, group: 8, pos: 61, S: 4, norm: true, rotaryDim: 64 },
    ]);
  }, TIMEOUT);

  test("n without a positions buffer, posIndex > 0, a layer offset, one KV head", () => {
    check([
      { headDim: 128, group: 8, pos: 33, viaBuffer: false, norm: true },
      { headDim: 64, group: 2, pos: 31, S: 3, viaBuffer: false, norm: true },
      { headDim: 128, group: 2, pos: 500, posIndex: 3, norm: true },
      { headDim: 128, group: 8, pos: 32, S: 2, layers: 2, norm: true },
      { headDim: 256, group: 8, pos: 33, kvHeads: 1, norm: true, rotaryDim: 64 },
    ]);
  }, TIMEOUT);

  test("a grid capped below the chunks (maxDecodeGroups 1, 3): the workgroup that walks the new rows' chunk handles them", () => {
    check([
      ...[1, 3].flatMap((g) => [
        { headDim: 128, group: 8, pos: 500, norm: true, maxDecodeGroups: g },
        { headDim: 128, group: 8, pos: 94, S: 4, norm: true, maxDecodeGroups: g },
        { headDim: 64, group: 2, pos: 33, S: 2, norm: false, maxDecodeGroups: g },
      ]),
    ]);
  }, TIMEOUT);

  test("the kernel's default shape (chunk 64, 64 threads: one 64-thread slice normalises every head in turn)", () => {
    check([
      ...[63, 64, 65].map((pos) => ({ headDim: 128, group: 8, pos, norm: true, shape: {} })),
      { headDim: 256, group: 8, pos: 62, S: 4, norm: true, rotaryDim: 64, shape: {} },
      { headDim: 64, group: 1, pos: 500, S: 2, norm: true, shape: {} },
    ]);
  }, TIMEOUT);

  test("the head norm's shared-memory tree (devices without subgroup arithmetic): both kernels without subgroupAdd", () => {
    check([
      ...[64, 128, 256].map((headDim) => ({ headDim, group: 8, pos: 33, norm: true, sharedTree: true })),
      { headDim: 128, group: 2, pos: 31, S: 4, norm: true, sharedTree: true },
      { headDim: 256, group: 8, pos: 500, S: 2, norm: true, rotaryDim: 64, sharedTree: true, shape: {} },
    ]);
  }, TIMEOUT);

  test("the unrolled variant GPUs run (one small shape: llvmpipe compiles the unrolled loops slowly)", () => {
    check([32, 33, 500].map((pos) => ({ headDim: 64, group: 2, pos, S: pos === 33 ? 2 : 1, norm: true, unroll: true })));
  }, 180_000);

  test("calls the fold does not take are refused", () => {
    const op = opFor({ headDim: 64, group: 1, pos: 0 }, 2, 2);
    using b = new Buffer(device, { size: 1n << 16n, memory: "device" });
    const plain = op.bind({ q: b, keys: b, values: b, partials: b, out: b, positions: b });
    const folded = op.bind({ q: b, keys: b, values: b, partials: b, out: b, positions: b, fold: { k: b, v: b, invFreq: b } });
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    expect(() => op.record(cb, plain, { n: 1, S: 1, maxPositions: 64, rope: {} })).toThrow(/fold buffers/);
    expect(() => op.record(cb, folded, { n: 1, S: 5, maxPositions: 64, rope: {} })).toThrow(/decode calls of one sequence/);
    expect(() => op.record(cb, folded, { n: 1, S: 2, maxPositions: 64, batched: true, rope: {} })).toThrow(/decode calls of one sequence/);
    expect(() => op.record(cb, folded, { n: 1, S: 1, maxPositions: 64, rope: { rotaryDim: 6 } })).toThrow(/rotaryDim/);
    cb.end();
    using plainOp = new DecoderAttention(device, { heads: 2, kvHeads: 2, headDim: 64 });
    expect(plainOp.ropeFold).toBe(false);
    expect(() => plainOp.bind({ q: b, keys: b, values: b, partials: b, out: b, fold: { k: b, v: b, invFreq: b } })).toThrow(/ropeFold/);
  });

  test("summary", () => {
    console.log(`  rope fold: ${cases} cases bit-equal to dec_rope_kv + dec_attention_decode (out and caches); worst NMSE against the f64 reference ${worstRef.toExponential(2)} (bound ${REF_BOUND})`);
    expect(cases).toBeGreaterThan(100);
  });
});
