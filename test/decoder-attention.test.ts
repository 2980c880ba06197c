/**
 * dec_attention (split over the sequence + log-sum-exp combine) on the real driver against
 * attendCpu (f64) over the same f16-rounded keys and values: head_dim 64/128/256 x GQA 1/2/4/8 x
 * n in {1, 7, 3*C+5} x S in {1, 3}, plus long contexts (4096), S = 4, a chunk size other than 64,
 * a layer offset into a two-layer cache and a q/out offset, and prompt chunks of 5..64 tokens whose
 * workgroups walk spans of several chunks with the online-softmax rule (dec_attention_prefill by
 * default; test/decoder-attention-prefill.test.ts compares it with the general pass 1). Output buffers carry sentinel words.
 *
 * Replay: n from a positions buffer (token 0 sees n + positions[posIndex]). One command buffer is
 * recorded per case with the grid sized for maxPositions = ctx and replayed for several words
 * written between submits (q rewritten too), each against a fresh attendCpu: head_dim 64/128/256 x
 * GQA 1/2/4/8 over several chunks, words up to ctx - 1 with ctx 4096 and 32768, S = 3, chunk 16,
 * posIndex > 0, words past the context (capped at ctx - (S - 1)). Negative control: each replay's
 * output against the reference of the previous (stale) word and of the word ignored fails the bound.
 *
 * Bound: NMSE <= 1e-10 per case. Both sides use the same f16 keys/values; the GPU's errors are f32
 * rounding of the dot products (head_dim terms, relative ~1e-7 on scores of magnitude <= ~10), of
 * exp, and of per-chunk f32 sums of at most C terms plus a combine over <= 64 chunks; each is a
 * relative error of order 1e-6 at worst, so squared errors of order 1e-12 and below.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { DecoderAttention, type DecoderAttentionOptions } from "../src/kernels/decoder/attention.ts";
import { GatingKernel } from "../src/kernels/decoder/gating.ts";
import { attendCpu } from "../src/model/ops.ts";
import { quantizeGroup } from "../src/quant/intdot.ts";
import { nmse, randomGaussianF32 } from "../src/quant/index.ts";
import { CommandPool } from "../src/vk/commands.ts";
import { Buffer } from "../src/vk/memory.ts";
import { Fence, Submission } from "../src/vk/sync.ts";
import { uploadBytes } from "../src/vk/transfer.ts";
import { bytesOf, halves } from "./support/attention-data.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { SENTINEL as TAIL_SENTINEL, expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
const ops = new Map<string, DecoderAttention>();
const replayOps = new Map<string, DecoderAttention>();
afterAll(() => {
  for (const op of ops.values()) op[Symbol.dispose]();
  for (const op of replayOps.values()) op[Symbol.dispose]();
  finish(ctx);
});

const BOUND = 1e-10;
const SENTINEL = 0x7fc0dead;
const SENTINEL_WORDS = 16;
let seed = 100;
let worst = 0;

interface Case {
  headDim: number;
  kvHeads: number;
  group: number;
  n: number;
  S: number;
  chunk?: number;
  /** Cache layers (the case uses the last one) and positions per layer. */
  layers?: number;
  qStd?: number;
  qOffset?: number;
  outOffset?: number;
  /** Record for this many positions (surplus workgroups exit). */
  maxPositions?: number;
  /** Unrolled K/V loops (the GPU variant; off on a CPU device by default). */
  unroll?: boolean;
  /** Prompt chunks through dec_attention_prefill (default) or the general pass 1 (false). */
  prefillKernel?: boolean;
}

/** Runs one case on the GPU and returns the NMSE against attendCpu. */
function runCase(c: Case): number {
  const { headDim: hd, kvHeads: KV, group: G, n, S } = c;
  const H = KV * G;
  const layers = c.layers ?? 1;
  const positions = n + S - 1;
  const ctxLen = positions + 3; // a few unused positions past the context
  const qOffset = c.qOffset ?? 0, outOffset = c.outOffset ?? 0;
  const key = `${H}/${KV}/${hd}/${c.chunk ?? 64}/${c.unroll ?? "default"}/${c.prefillKernel ?? "default"}`;
  let op = ops.get(key);
  if (!op) ops.set(key, (op = new DecoderAttention(device, { heads: H, kvHeads: KV, headDim: hd, chunk: c.chunk, maxBindings: 32, unroll: c.unroll, prefillKernel: c.prefillKernel })));
  const perLayer = ctxLen * KV * hd;
  const k = halves(layers * perLayer, seed++);
  const v = halves(layers * perLayer, seed++);
  const q = randomGaussianF32(S * H * hd, seed++, c.qStd ?? 1);
  const layer = layers - 1;
  const cacheOffset = op.layerOffset(layer, ctxLen);

  using qBuf = new Buffer(device, { size: BigInt(4 * (qOffset + q.length)), memory: "upload" });
  new Float32Array(qBuf.host()).set(q, qOffset);
  using kBuf = new Buffer(device, { size: BigInt(k.bits.byteLength), memory: "device" });
  using vBuf = new Buffer(device, { size: BigInt(v.bits.byteLength), memory: "device" });
  uploadBytes(device, kBuf, 0n, bytesOf(k.bits));
  uploadBytes(device, vBuf, 0n, bytesOf(v.bits));
  using partials = new Buffer(device, { size: BigInt(op.partialBytes(c.maxPositions ?? positions, S)), memory: "device" });
  const outFloats = outOffset + S * H * hd;
  using out = new Buffer(device, { size: BigInt(4 * (outFloats + SENTINEL_WORDS)), memory: "readback" });
  new Uint32Array(out.host()).fill(SENTINEL);

  using pool = new CommandPool(device);
  const cb = pool.allocate().begin();
  const binding = op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out });
  op.record(cb, binding, { n, S, cacheOffset, qOffset, outOffset, maxPositions: c.maxPositions });
  cb.barrier("computeToHost").end();
  using fence = new Fence(device);
  using submission = new Submission(device, [cb], { fence });
  submission.submit();
  if (!fence.wait()) throw new Error("attention timed out");

  const got = new Float32Array(out.host(), 4 * outOffset, S * H * hd).slice();
  const head = new Uint32Array(out.host(), 0, outOffset);
  const tail = new Uint32Array(out.host(), 4 * outFloats, SENTINEL_WORDS);
  if (head.some((w) => w !== SENTINEL) || tail.some((w) => w !== SENTINEL)) throw new Error("a sentinel word around out was overwritten");
  const ref = new Float32Array(S * H * hd);
  const lk = k.values.subarray(layer * perLayer, (layer + 1) * perLayer);
  const lv = v.values.subarray(layer * perLayer, (layer + 1) * perLayer);
  attendCpu(q, lk, lv, S, n - 1, H, KV, hd, ref);
  const e = nmse(ref, got);
  worst = Math.max(worst, e);
  return e;
}

const label = (c: Case) => `hd ${c.headDim} G ${c.group} KV ${c.kvHeads} n ${c.n} S ${c.S}${c.chunk ? ` C ${c.chunk}` : ""}`;

describe("attendCpu (the oracle) on cases with a closed form", () => {
  test("one position gives that value row of head h's KV head floor(h / G); zero keys give the mean of the causal values", () => {
    const hd = 4, KV = 2, G = 4, H = KV * G, S = 3, p0 = 5;
    const keys = new Float32Array((p0 + S) * KV * hd); // all zero: every score equal
    const values = randomGaussianF32((p0 + S) * KV * hd, 7);
    const q = randomGaussianF32(S * H * hd, 8);
    const one = new Float32Array(H * hd);
    attendCpu(q, keys, values, 1, 0, H, KV, hd, one);
    for (let h = 0; h < H; h++) for (let i = 0; i < hd; i++) expect(one[h * hd + i]).toBe(values[Math.floor(h / G) * hd + i]!);
    const out = new Float32Array(S * H * hd);
    attendCpu(q, keys, values, S, p0, H, KV, hd, out);
    for (let t = 0; t < S; t++) for (let h = 0; h < H; h++) for (let i = 0; i < hd; i++) {
      let mean = 0;
      for (let p = 0; p <= p0 + t; p++) mean += values[(p * KV + Math.floor(h / G)) * hd + i]!;
      mean /= p0 + t + 1;
      expect(Math.abs(out[(t * H + h) * hd + i]! - mean)).toBeLessThan(1e-6);
    }
  });
});

describe("dec_attention vs attendCpu over f16 keys/values (NMSE <= 1e-10)", () => {
  const C = 64;
  for (const headDim of [32, 64, 128, 256]) {
    test(`head_dim ${headDim}: GQA 1/2/4/8 x n in {1, 7, 3C+5} x S in {1, 3}`, () => {
      for (const group of [1, 2, 4, 8]) for (const n of [1, 7, 3 * C + 5]) for (const S of [1, 3]) {
        const c: Case = { headDim, kvHeads: 2, group, n, S, qStd: 2 };
        const e = runCase(c);
        if (!(e <= BOUND)) throw new Error(`${label(c)}: NMSE ${e}`);
      }
    }, 120_000);
  }

  test("long contexts (4096 positions), S = 1 and 3, peaky scores", () => {
    for (const c of [
      { headDim: 128, kvHeads: 1, group: 4, n: 4096, S: 1, qStd: 3 },
      { headDim: 128, kvHeads: 1, group: 4, n: 4094, S: 3, qStd: 3 },
      { headDim: 256, kvHeads: 1, group: 2, n: 4096, S: 3 },
    ] satisfies Case[]) {
      const e = runCase(c);
      if (!(e <= BOUND)) throw new Error(`${label(c)}: NMSE ${e}`);
    }
  }, 120_000);

  test("S = 4 (head_dim 256, GQA 8: tokens split over z where shared memory is short), chunk 16 and 100, layer and q/out offsets", () => {
    for (const c of [
      { headDim: 256, kvHeads: 1, group: 8, n: 130, S: 4 },
      { headDim: 64, kvHeads: 4, group: 2, n: 50, S: 4, chunk: 16 },
      { headDim: 128, kvHeads: 2, group: 1, n: 301, S: 3, chunk: 100 },
      { headDim: 128, kvHeads: 2, group: 4, n: 70, S: 3, layers: 3, qOffset: 8, outOffset: 5 },
      { headDim: 64, kvHeads: 2, group: 2, n: 7, S: 3, maxPositions: 4096 }, // a grid sized for 4096: surplus workgroups exit
    ] satisfies Case[]) {
      const e = runCase(c);
      if (!(e <= BOUND)) throw new Error(`${label(c)}: NMSE ${e}`);
    }
  }, 120_000);

  test("prompt chunks (S 5..64): spans of several chunks walked with the online softmax, tokens split over z, GQA 1/8", () => {
    for (const c of [
      { headDim: 128, kvHeads: 2, group: 8, n: 1, S: 64 }, // a chunk from position 0: causal within the call
      { headDim: 128, kvHeads: 4, group: 8, n: 300, S: 64, chunk: 16 }, // 23 chunks: spans of 2 chunks
      { headDim: 64, kvHeads: 2, group: 1, n: 1000, S: 5, chunk: 8, qStd: 3 }, // 126 chunks: spans of 8, peaky scores
      { headDim: 256, kvHeads: 1, group: 4, n: 77, S: 33, chunk: 16 },
      { headDim: 64, kvHeads: 2, group: 2, n: 9, S: 17, chunk: 8, maxPositions: 2000 }, // spans sized for 2000 positions: surplus exit
    ] satisfies Case[]) {
      const e = runCase(c);
      if (!(e <= BOUND)) throw new Error(`${label(c)}: NMSE ${e}`);
    }
  }, 120_000);

  test("bad shapes and calls throw before anything is recorded", () => {
    expect(() => new DecoderAttention(device, { heads: 12, kvHeads: 4, headDim: 128 })).toThrow(/1, 2, 4 or 8/);
    expect(() => new DecoderAttention(device, { heads: 8, kvHeads: 2, headDim: 96 })).toThrow(/64, 128 or 256/);
    using op = new DecoderAttention(device, { heads: 4, kvHeads: 2, headDim: 64, maxBindings: 1 });
    using small = new Buffer(device, { size: 64n, memory: "device" });
    const binding = op.bind({ q: small, keys: small, values: small, partials: small, out: small });
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    expect(() => op.record(cb, binding, { n: 1, S: 65 })).toThrow(/S must be/);
    expect(() => op.record(cb, binding, { n: 0, S: 1 })).toThrow(/n must be/);
    expect(() => op.record(cb, binding, { n: 1, S: 1, cacheOffset: 4 })).toThrow(/multiple of 8/);
    expect(() => op.record(cb, binding, { n: 100, S: 1 })).toThrow(/partials scratch/);
    cb.end();
  });

  test("worst NMSE of the suite", () => {
    console.log(`dec_attention: worst NMSE ${worst.toExponential(2)} (bound ${BOUND})`);
    expect(worst).toBeGreaterThan(0);
    expect(worst).toBeLessThanOrEqual(BOUND);
  });
});

interface ReplayCase {
  headDim: number;
  kvHeads: number;
  group: number;
  /** Cache rows = maxPositions (the grid and partials are sized for it, once). */
  ctx: number;
  S?: number;
  /** The base added to the word (default 1: decode, token at position word sees word + 1). */
  n?: number;
  /** The words written into positions[posIndex] before each replay. */
  words: number[];
  posIndex?: number;
  chunk?: number;
  /** Kernel options beyond the shape (threads, unroll, the decode kernel and its grid). */
  kernel?: Pick<DecoderAttentionOptions, "workgroupSize" | "unroll" | "decodeKernel" | "maxDecodeGroups" | "combineTail">;
}

interface Replay {
  word: number;
  /** attendCpu's p0 for this word: position of token 0 (capped as the shader caps n). */
  p0: number;
  got: Float32Array;
  q: Float32Array;
  nmse: number;
}

/** Position of token 0 for a word: n + word positions seen by token 0, capped at ctx - (S - 1). */
const p0Of = (n: number, word: number, S: number, ctx: number) => Math.min(n + word, ctx - (S - 1)) - 1;

/**
 * Records ONE command buffer on a binding with a positions buffer (maxPositions = ctx) and
 * replays it once per word (the word and q rewritten by the host between submits); each output
 * against attendCpu at that word's position. Returns the replays and a reference function for
 * the negative controls.
 */
function replayCase(c: ReplayCase): { replays: Replay[]; reference: (q: Float32Array, p0: number) => Float32Array } {
  const { headDim: hd, kvHeads: KV, group: G, ctx: ctxLen } = c;
  const S = c.S ?? 1, n = c.n ?? 1, posIndex = c.posIndex ?? 0;
  const H = KV * G;
  const key = `${H}/${KV}/${hd}/${c.chunk ?? 64}/${JSON.stringify(c.kernel ?? {})}`;
  let op = replayOps.get(key);
  if (!op) replayOps.set(key, (op = new DecoderAttention(device, { heads: H, kvHeads: KV, headDim: hd, chunk: c.chunk, maxBindings: 8, ...c.kernel })));
  const perLayer = ctxLen * KV * hd;
  const k = halves(perLayer, seed++);
  const v = halves(perLayer, seed++);

  using qBuf = new Buffer(device, { size: BigInt(4 * S * H * hd), memory: "upload" });
  using kBuf = new Buffer(device, { size: BigInt(k.bits.byteLength), memory: "device" });
  using vBuf = new Buffer(device, { size: BigInt(v.bits.byteLength), memory: "device" });
  uploadBytes(device, kBuf, 0n, bytesOf(k.bits));
  uploadBytes(device, vBuf, 0n, bytesOf(v.bits));
  using partials = new Buffer(device, { size: BigInt(op.partialBytes(ctxLen, S)), memory: "device" });
  const outFloats = S * H * hd;
  using out = hostBuffer(device, outFloats);
  // the other words hold a value a wrong posIndex would visibly use
  using pos = hostBuffer(device, posIndex + 1, "upload");
  u32(pos, posIndex + 1).fill(ctxLen >>> 1);

  using pool = new CommandPool(device);
  const cb = pool.allocate().begin();
  const binding = op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out, positions: pos });
  op.record(cb, binding, { n, S, posIndex, maxPositions: ctxLen });
  cb.barrier("computeToHost").end();
  using fence = new Fence(device);
  using submission = new Submission(device, [cb], { fence });

  const reference = (q: Float32Array, p0: number) => {
    const ref = new Float32Array(S * H * hd);
    attendCpu(q, k.values, v.values, S, p0, H, KV, hd, ref);
    return ref;
  };
  const replays: Replay[] = [];
  for (const word of c.words) {
    const q = randomGaussianF32(S * H * hd, seed++, 2);
    new Float32Array(qBuf.host()).set(q);
    u32(pos, 1, posIndex)[0] = word;
    new Uint32Array(out.host()).fill(TAIL_SENTINEL);
    submission.submit();
    if (!fence.wait()) throw new Error("attention replay timed out");
    fence.reset();
    const got = new Float32Array(out.host(), 0, outFloats).slice();
    expectTail(out, outFloats, "attention out");
    const p0 = p0Of(n, word, S, ctxLen);
    const e = nmse(reference(q, p0), got);
    replayWorst = Math.max(replayWorst, e);
    replays.push({ word, p0, got, q, nmse: e });
  }
  return { replays, reference };
}

let replayWorst = 0;
const replayLabel = (c: ReplayCase, r: Replay) =>
  `hd ${c.headDim} G ${c.group} KV ${c.kvHeads} ctx ${c.ctx} S ${c.S ?? 1} n ${c.n ?? 1} word ${r.word}${c.chunk ? ` C ${c.chunk}` : ""}${c.kernel ? ` ${JSON.stringify(c.kernel)}` : ""}`;

function expectReplays(c: ReplayCase): Replay[] {
  const { replays } = replayCase(c);
  for (const r of replays) if (!(r.nmse <= BOUND)) throw new Error(`${replayLabel(c, r)}: NMSE ${r.nmse}`);
  return replays;
}

describe("dec_attention replayed: n from a positions buffer, one recording for maxPositions = ctx (NMSE <= 1e-10)", () => {
  const C = 64;
  for (const headDim of [64, 128, 256]) {
    test(`head_dim ${headDim}: GQA 1/2/4/8, ctx 3C+37, decode (S 1, n 1) at words 0, 1, C-1, C, 2C+5, ctx-1 (out of order)`, () => {
      const ctx = 3 * C + 37;
      for (const group of [1, 2, 4, 8]) expectReplays({ headDim, kvHeads: 2, group, ctx, words: [C - 1, 0, 2 * C + 5, ctx - 1, 1, C] });
    }, 120_000);
  }

  test("far from 0: ctx 4096 (64 chunks) and 32768 (512 chunks), decode at words near the end, in the middle and back", () => {
    expectReplays({ headDim: 128, kvHeads: 1, group: 4, ctx: 4096, words: [4095, 2047, 3000, 65, 4094] });
    expectReplays({ headDim: 256, kvHeads: 2, group: 8, ctx: 4096, words: [4000, 1234] });
    expectReplays({ headDim: 64, kvHeads: 2, group: 2, ctx: 4096, words: [3333, 4095] });
    expectReplays({ headDim: 128, kvHeads: 1, group: 8, ctx: 32768, words: [32767, 20000, 12345] });
  }, 300_000);

  test("S = 3 and 4 with a base n, chunk 16, posIndex 3", () => {
    expectReplays({ headDim: 128, kvHeads: 2, group: 4, ctx: 300, S: 3, n: 1, words: [0, 200, 297] });
    expectReplays({ headDim: 256, kvHeads: 1, group: 8, ctx: 260, S: 4, n: 5, words: [0, 100, 251] });
    expectReplays({ headDim: 64, kvHeads: 4, group: 2, ctx: 150, S: 3, n: 2, chunk: 16, words: [17, 0, 145] });
    expectReplays({ headDim: 64, kvHeads: 2, group: 1, ctx: 500, posIndex: 3, words: [499, 10, 250] });
  }, 120_000);

  test("words past the context are capped at ctx - (S - 1) positions (no reads past the cache, the grid or the partials)", () => {
    const c: ReplayCase = { headDim: 64, kvHeads: 2, group: 4, ctx: 200, S: 2, words: [199, 200, 5000, 0xffffffff] };
    const replays = expectReplays(c);
    for (const r of replays) expect(r.p0).toBe(c.ctx - 2); // token 0 at ctx - 2, token 1 at ctx - 1: sees the whole cache
  }, 60_000);

  test("negative control: each replay against the reference of the previous (stale) word and of the word ignored fails the bound", () => {
    const c: ReplayCase = { headDim: 128, kvHeads: 2, group: 4, ctx: 1000, words: [10, 11, 500, 999, 998] };
    const { replays, reference } = replayCase(c);
    let least = Infinity;
    replays.forEach((r, i) => {
      expect(r.nmse).toBeLessThanOrEqual(BOUND);
      const ignored = nmse(reference(r.q, 0), r.got); // n alone: token 0 sees 1 position
      least = Math.min(least, ignored);
      if (i > 0) least = Math.min(least, nmse(reference(r.q, replays[i - 1]!.p0), r.got)); // the previous replay's word
    });
    console.log(`  dec_attention replay negative control: least NMSE ${least.toExponential(2)} (bound ${BOUND})`);
    expect(least).toBeGreaterThan(1e3 * BOUND);
  }, 60_000);

  test("bad replay calls throw before anything is recorded", () => {
    using op = new DecoderAttention(device, { heads: 4, kvHeads: 2, headDim: 64, maxBindings: 2 });
    using small = new Buffer(device, { size: 64n, memory: "device" });
    using pos = new Buffer(device, { size: 8n, memory: "upload" });
    const withPos = op.bind({ q: small, keys: small, values: small, partials: small, out: small, positions: pos });
    const without = op.bind({ q: small, keys: small, values: small, partials: small, out: small });
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    expect(() => op.record(cb, withPos, { n: 1, S: 1 })).toThrow(/maxPositions is required/);
    expect(() => op.record(cb, withPos, { n: 1, S: 1, maxPositions: 1, posIndex: 2 })).toThrow(/posIndex 2 is outside/);
    expect(() => op.record(cb, withPos, { n: 3, S: 2, maxPositions: 3 })).toThrow(/below n \+ S - 1/);
    expect(() => op.record(cb, without, { n: 1, S: 1, posIndex: 0 })).toThrow(/posIndex needs/);
    cb.end();
  });

  test("worst NMSE of the replays", () => {
    console.log(`dec_attention replay: worst NMSE ${replayWorst.toExponential(2)} (bound ${BOUND})`);
    expect(replayWorst).toBeGreaterThan(0);
    expect(replayWorst).toBeLessThanOrEqual(BOUND);
  });
});

test("the unrolled K/V loops (the variant GPUs run) give the same answer: head_dim 64 and 128, GQA 1 and 4, n across several chunks, and a prompt chunk", () => {
  for (const headDim of [64, 128]) for (const group of [1, 4]) for (const n of [1, 37, 100]) {
    const e = runCase({ headDim, kvHeads: 2, group, n, S: 1, chunk: 16, unroll: true, qStd: 2 });
    expect({ headDim, group, n, ok: e <= 1e-10 }).toEqual({ headDim, group, n, ok: true });
  }
  // a prompt chunk on the general pass 1 (dec_attention_prefill has no unrolled variant): spans of several
  // chunks (few rows: llvmpipe compiles the unrolled loops of more for minutes)
  const e = runCase({ headDim: 64, kvHeads: 2, group: 1, n: 300, S: 6, chunk: 16, unroll: true, qStd: 2, prefillKernel: false });
  expect(e).toBeLessThanOrEqual(1e-10);
}, 120_000);

describe("dec_attention batched: tokens of different sequences sharing one cache, one recording replayed (NMSE <= 1e-10)", () => {
  /**
   * `seqs` sequences of ctx rows each in one cache; S tokens, token t of sequence slot[t] at
   * position pos[t] (it sees that sequence's rows 0..pos[t]); each token against attendCpu over
   * its own sequence's rows alone. Two replays with other positions, and the negative control:
   * the same output against another sequence's rows fails the bound.
   */
  function batchedCase(c: { headDim: number; kvHeads: number; group: number; ctx: number; seqs: number; chunk?: number; steps: { slot: number; pos: number }[][] }): number {
    const { headDim: hd, kvHeads: KV, group: G, ctx } = c;
    const H = KV * G, S = c.steps[0]!.length, rowsPerSeq = ctx * KV * hd;
    using op = new DecoderAttention(device, { heads: H, kvHeads: KV, headDim: hd, chunk: c.chunk, maxBindings: 1 });
    const k = halves(c.seqs * rowsPerSeq, seed++), v = halves(c.seqs * rowsPerSeq, seed++);
    using qBuf = new Buffer(device, { size: BigInt(4 * S * H * hd), memory: "upload" });
    using kBuf = new Buffer(device, { size: BigInt(k.bits.byteLength), memory: "device" });
    using vBuf = new Buffer(device, { size: BigInt(v.bits.byteLength), memory: "device" });
    uploadBytes(device, kBuf, 0n, bytesOf(k.bits));
    uploadBytes(device, vBuf, 0n, bytesOf(v.bits));
    using partials = new Buffer(device, { size: BigInt(op.partialBytes(ctx, S)), memory: "device" });
    using out = hostBuffer(device, S * H * hd);
    using pos = hostBuffer(device, 128, "upload");
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    const binding = op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out, positions: pos });
    op.record(cb, binding, { n: 1, S, maxPositions: ctx, batched: true });
    cb.barrier("computeToHost").end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    let worst = 0;
    for (const step of c.steps) {
      const q = randomGaussianF32(S * H * hd, seed++, 2);
      new Float32Array(qBuf.host()).set(q);
      const words = u32(pos, 128);
      step.forEach(({ slot, pos: p }, t) => {
        words[t] = p;
        words[64 + t] = slot * ctx + p;
      });
      submission.submit();
      expect(fence.wait()).toBe(true);
      fence.reset();
      const got = f32(out, S * H * hd);
      step.forEach(({ slot, pos: p }, t) => {
        const ref = new Float32Array(H * hd);
        const rows = (s: number) => [k.values.subarray(s * rowsPerSeq, (s + 1) * rowsPerSeq), v.values.subarray(s * rowsPerSeq, (s + 1) * rowsPerSeq)] as const;
        const qt = q.subarray(t * H * hd, (t + 1) * H * hd), gt = got.subarray(t * H * hd, (t + 1) * H * hd);
        const [ks, vs] = rows(slot);
        attendCpu(qt, ks, vs, 1, p, H, KV, hd, ref);
        const e = nmse(ref, gt);
        if (!(e <= BOUND)) throw new Error(`token ${t} (sequence ${slot}, position ${p}): NMSE ${e}`);
        worst = Math.max(worst, e);
        // negative control: another sequence's rows at the same position
        const [ko, vo] = rows((slot + 1) % c.seqs);
        attendCpu(qt, ko, vo, 1, p, H, KV, hd, ref);
        expect(nmse(ref, gt)).toBeGreaterThan(1e-4);
      });
      expectTail(out, S * H * hd, "out");
    }
    return worst;
  }

  test("4 sequences, head_dim 128, GQA 8 and 1, positions 0 to ctx - 1 (several chunks), out of order, two tokens of one sequence's neighbours", () => {
    const e1 = batchedCase({
      headDim: 128, kvHeads: 2, group: 8, ctx: 200, seqs: 4, chunk: 32,
      steps: [
        [{ slot: 0, pos: 0 }, { slot: 3, pos: 199 }, { slot: 1, pos: 64 }, { slot: 2, pos: 37 }],
        [{ slot: 2, pos: 150 }, { slot: 0, pos: 1 }, { slot: 1, pos: 31 }, { slot: 3, pos: 32 }],
      ],
    });
    const e2 = batchedCase({ headDim: 64, kvHeads: 4, group: 1, ctx: 70, seqs: 3, chunk: 16, steps: [[{ slot: 2, pos: 69 }, { slot: 0, pos: 5 }, { slot: 1, pos: 33 }, { slot: 0, pos: 40 }, { slot: 2, pos: 0 }]] });
    console.log(`  dec_attention batched: worst NMSE ${Math.max(e1, e2).toExponential(2)}`);
  }, 120_000);

  test("a batched call without a positions buffer, or of more than 64 tokens, is refused", () => {
    using op = new DecoderAttention(device, { heads: 4, kvHeads: 2, headDim: 64, maxBindings: 2 });
    using small = new Buffer(device, { size: 1024n, memory: "device" });
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    const without = op.bind({ q: small, keys: small, values: small, partials: small, out: small });
    const withPos = op.bind({ q: small, keys: small, values: small, partials: small, out: small, positions: small });
    expect(() => op.record(cb, without, { n: 1, S: 2, maxPositions: 8, batched: true })).toThrow(/positions buffer/);
    expect(() => op.record(cb, withPos, { n: 1, S: 65, maxPositions: 8, batched: true })).toThrow(/S must be|at most 64/);
    cb.end();
  });
});

/**
 * dec_attention_decode (decode calls' pass 1) in the shapes the graphs give it: GPUs take chunk 32
 * and 128 threads (decode-graph.ts), so the kernel runs 64..256 threads with 2..8 lanes per
 * position; CPU devices chunk 64 and 64 threads. Decode at positions 0 (word 0: one position), 30,
 * 31, 32 (a chunk's last, a chunk's first), 576 (the profile's), a multiple of the chunk, and the
 * cache's last position; the grid capped below the chunks (workgroups walking several chunks);
 * the unrolled variant (value loads before the barrier) on fewer cases (llvmpipe compiles it
 * slowly); against the general pass 1 (decodeKernel: false) through the same CPU reference.
 */
describe("dec_attention_decode (decode's pass 1) vs attendCpu (NMSE <= 1e-10)", () => {
  const gpuShape = { workgroupSize: 128 } as const;
  for (const headDim of [32, 64, 128, 256]) {
    test(`head_dim ${headDim}: GQA 1/2/4/8, chunk 32 and 128 threads, decode at positions 0, 30, 31, 32, 576, 640, ctx-1`, () => {
      const ctx = 700;
      for (const group of [1, 2, 4, 8]) {
        expectReplays({ headDim, kvHeads: 2, group, ctx, chunk: 32, kernel: gpuShape, words: [31, 0, 576, 30, ctx - 1, 32, 640] });
      }
    }, 120_000);
  }

  test("the kernel's default shape (chunk 64), chunks other than a power of two (20, 100), S = 2..4 at a base n (one token per workgroup)", () => {
    expectReplays({ headDim: 128, kvHeads: 4, group: 8, ctx: 300, words: [299, 64, 63, 1] });
    expectReplays({ headDim: 64, kvHeads: 2, group: 4, ctx: 333, chunk: 20, kernel: gpuShape, words: [39, 40, 332, 5] });
    expectReplays({ headDim: 256, kvHeads: 1, group: 2, ctx: 450, chunk: 100, words: [99, 100, 449] });
    expectReplays({ headDim: 128, kvHeads: 2, group: 8, ctx: 200, S: 4, n: 2, chunk: 32, kernel: gpuShape, words: [0, 30, 194] });
    expectReplays({ headDim: 256, kvHeads: 2, group: 8, ctx: 100, S: 2, chunk: 32, kernel: gpuShape, words: [31, 98] });
  }, 120_000);

  test("a grid capped below the chunks (maxDecodeGroups 1, 3, 128): workgroups walk every grid-th chunk; 8192 and 32768 caches at 576 and 4096", () => {
    expectReplays({ headDim: 128, kvHeads: 2, group: 8, ctx: 700, chunk: 32, kernel: { ...gpuShape, maxDecodeGroups: 3 }, words: [576, 95, 96, 699, 0] });
    expectReplays({ headDim: 64, kvHeads: 1, group: 4, ctx: 300, chunk: 32, kernel: { ...gpuShape, maxDecodeGroups: 1 }, words: [299, 31, 32] });
    expectReplays({ headDim: 128, kvHeads: 1, group: 8, ctx: 8192, chunk: 32, kernel: gpuShape, words: [4096, 576, 8191] });
    expectReplays({ headDim: 256, kvHeads: 1, group: 8, ctx: 32768, chunk: 32, kernel: gpuShape, words: [576, 4095] });
  }, 300_000);

  test("unrolled (the variant GPUs run: value loads held across the barrier): head_dim 64 and 128, GQA 1 and 8, chunk 16 and 32", () => {
    for (const [headDim, group, chunk] of [[64, 8, 32], [128, 1, 32], [128, 8, 16]] as const) {
      expectReplays({ headDim, kvHeads: 2, group, ctx: 150, chunk, kernel: { ...gpuShape, unroll: true }, words: [0, chunk - 1, chunk, 149] });
    }
  }, 120_000);

  test("the general pass 1 (decodeKernel: false) still serves decode; a bad maxDecodeGroups is refused", () => {
    const replays = expectReplays({ headDim: 128, kvHeads: 2, group: 8, ctx: 700, chunk: 32, kernel: { ...gpuShape, decodeKernel: false }, words: [576, 0, 699] });
    expect(replays.length).toBe(3);
    expect(() => new DecoderAttention(device, { heads: 8, kvHeads: 1, headDim: 128, maxDecodeGroups: 0 })).toThrow(/maxDecodeGroups/);
  }, 60_000);

  test("COMBINE_TAIL (the records merged by each row group's last workgroup, no combine dispatch): head_dim 64/128/256, GQA 1 and 8, a capped grid with idle workgroups, S = 4, unrolled; each recording replayed (its arrival counters back at zero after every call)", () => {
    const tail = { ...gpuShape, combineTail: true } as const;
    using op = new DecoderAttention(device, { heads: 16, kvHeads: 2, headDim: 128, chunk: 32, ...tail });
    expect(op.combineTail).toBe(true);
    expect([op.dispatches(1), op.dispatches(4), op.dispatches(5)]).toEqual([1, 1, 2]);
    for (const headDim of [64, 128, 256]) {
      for (const group of [1, 8]) expectReplays({ headDim, kvHeads: 2, group, ctx: 700, chunk: 32, kernel: tail, words: [31, 0, 576, 30, 699, 32, 640, 576] });
    }
    expectReplays({ headDim: 128, kvHeads: 2, group: 8, ctx: 700, chunk: 32, kernel: { ...tail, maxDecodeGroups: 3 }, words: [576, 95, 96, 699, 0, 20] });
    expectReplays({ headDim: 128, kvHeads: 2, group: 8, ctx: 200, S: 4, n: 2, chunk: 32, kernel: tail, words: [0, 30, 194] });
    expectReplays({ headDim: 128, kvHeads: 2, group: 8, ctx: 150, chunk: 16, kernel: { ...tail, unroll: true }, words: [0, 15, 16, 149] });
  }, 300_000);

  test("worst NMSE of the replays (decode kernel included)", () => {
    console.log(`dec_attention_decode: worst replay NMSE ${replayWorst.toExponential(2)} (bound ${BOUND})`);
    expect(replayWorst).toBeLessThanOrEqual(BOUND);
  });
});

/**
 * The output gate folded into the combine (a binding with a gate buffer): out * sigmoid(gate)
 * against the same attention followed by GatingKernel's "sigmoid-gate" (the dispatch it
 * replaces, same f32 expression: expected bit for bit) and against attendCpu times
 * fround(sigmoid(gate)) as hybrid-decoder.ts computes it. Decode (S 1, the decode kernel), S 3,
 * a prompt chunk of 17 (the general pass 1), batched, a gate offset. Negative control: the
 * ungated reference fails the bound.
 */
describe("dec_attention with the output gate folded into the combine", () => {
  function gateCase(c: { headDim: number; kvHeads: number; group: number; ctx: number; S: number; word: number; gateOffset?: number; batched?: boolean; combineTail?: boolean }): { fold: number; cpu: number; ungated: number } {
    const { headDim: hd, kvHeads: KV, group: G, ctx: ctxLen, S } = c;
    const H = KV * G, gateOffset = c.gateOffset ?? 0, floats = S * H * hd;
    using op = new DecoderAttention(device, { heads: H, kvHeads: KV, headDim: hd, chunk: 32, workgroupSize: 128, maxBindings: 2, combineTail: c.combineTail ?? false });
    using gating = new GatingKernel(device, { maxSets: 2 });
    const k = halves(ctxLen * KV * hd, seed++), v = halves(ctxLen * KV * hd, seed++);
    const q = randomGaussianF32(floats, seed++, 2), gate = randomGaussianF32(floats, seed++, 2);
    using qBuf = new Buffer(device, { size: BigInt(4 * floats), memory: "upload" });
    new Float32Array(qBuf.host()).set(q);
    using kBuf = new Buffer(device, { size: BigInt(k.bits.byteLength), memory: "device" });
    using vBuf = new Buffer(device, { size: BigInt(v.bits.byteLength), memory: "device" });
    uploadBytes(device, kBuf, 0n, bytesOf(k.bits));
    uploadBytes(device, vBuf, 0n, bytesOf(v.bits));
    using gBuf = new Buffer(device, { size: BigInt(4 * (gateOffset + floats)), memory: "upload" });
    new Float32Array(gBuf.host()).set(gate, gateOffset);
    using gBuf0 = new Buffer(device, { size: BigInt(4 * floats), memory: "upload" });
    new Float32Array(gBuf0.host()).set(gate);
    using partials = new Buffer(device, { size: BigInt(op.partialBytes(ctxLen, S)), memory: "device" });
    using folded = hostBuffer(device, floats);
    using separate = hostBuffer(device, floats);
    using pos = hostBuffer(device, 128, "upload");
    const words = u32(pos, 128);
    // batched: token t at position word - t of its own copy... here one sequence, rows from 0
    for (let t = 0; t < S; t++) {
      words[t] = c.batched ? c.word - t : c.word;
      words[64 + t] = words[t]!;
    }
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    const withGate = op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out: folded, positions: pos, gate: gBuf });
    const plain = op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out: separate, positions: pos });
    const call = { n: 1, S, maxPositions: ctxLen, batched: c.batched ?? false };
    op.record(cb, withGate, { ...call, gateOffset });
    cb.barrier("computeToCompute");
    op.record(cb, plain, call);
    cb.barrier("computeToCompute");
    gating.record(cb, { mode: "sigmoid-gate", x: separate, g: gBuf0, y: separate, S, n: H * hd });
    cb.barrier("computeToHost").end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    submission.submit();
    expect(fence.wait()).toBe(true);
    expectTail(folded, floats, "folded out");
    const got = f32(folded, floats), want = f32(separate, floats);
    const ref = new Float32Array(floats), one = new Float32Array(H * hd);
    for (let t = 0; t < S; t++) {
      // token t sees words[t] + 1 positions (batched) or word + 1 + t (capped at ctx)
      const p0 = c.batched ? words[t]! : Math.min(1 + c.word, ctxLen - (S - 1)) - 1 + t;
      attendCpu(q.subarray(t * H * hd, (t + 1) * H * hd), k.values, v.values, 1, p0, H, KV, hd, one);
      ref.set(one, t * H * hd);
    }
    const ungated = nmse(ref, got);
    for (let i = 0; i < floats; i++) ref[i] = ref[i]! * Math.fround(1 / (1 + Math.exp(-gate[i]!)));
    return { fold: nmse(want, got), cpu: nmse(ref, got), ungated };
  }

  test("decode (S 1, 3), a prompt chunk (S 17), batched (S 2), a gate offset: the fold equals attention then the gating dispatch", () => {
    let worstFold = 0, worstCpu = 0, leastUngated = Infinity;
    for (const c of [
      { headDim: 128, kvHeads: 2, group: 8, ctx: 700, S: 1, word: 576 },
      { headDim: 256, kvHeads: 2, group: 8, ctx: 300, S: 1, word: 31, gateOffset: 12 },
      { headDim: 64, kvHeads: 2, group: 4, ctx: 200, S: 3, word: 100 },
      { headDim: 128, kvHeads: 1, group: 2, ctx: 200, S: 17, word: 150 },
      { headDim: 128, kvHeads: 2, group: 8, ctx: 200, S: 2, word: 99, batched: true },
      // the gate applied by the decode kernel's combine tail (COMBINE_TAIL)
      { headDim: 256, kvHeads: 2, group: 8, ctx: 300, S: 1, word: 200, gateOffset: 4, combineTail: true },
      { headDim: 128, kvHeads: 2, group: 8, ctx: 200, S: 2, word: 99, batched: true, combineTail: true },
    ]) {
      const r = gateCase(c);
      worstFold = Math.max(worstFold, r.fold);
      worstCpu = Math.max(worstCpu, r.cpu);
      leastUngated = Math.min(leastUngated, r.ungated);
    }
    console.log(`  output gate fold: NMSE vs attention + gating ${worstFold.toExponential(2)}, vs CPU ${worstCpu.toExponential(2)}, ungated reference ${leastUngated.toExponential(2)}`);
    expect(worstFold).toBeLessThanOrEqual(1e-14);
    expect(worstCpu).toBeLessThanOrEqual(BOUND);
    expect(leastUngated).toBeGreaterThan(1e-3); // negative control: the gate is applied
  }, 120_000);

  test("gate calls that do not fit are refused before anything is recorded", () => {
    using op = new DecoderAttention(device, { heads: 4, kvHeads: 2, headDim: 64, maxBindings: 2 });
    using small = new Buffer(device, { size: 1024n, memory: "device" });
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    const withGate = op.bind({ q: small, keys: small, values: small, partials: small, out: small, gate: small });
    const without = op.bind({ q: small, keys: small, values: small, partials: small, out: small });
    expect(() => op.record(cb, without, { n: 1, S: 1, gateOffset: 4 })).toThrow(/gateOffset needs/);
    expect(() => op.record(cb, withGate, { n: 1, S: 1, gateOffset: 1000 })).toThrow(/gate buffer/);
    expect(() => op.record(cb, withGate, { n: 1, S: 1, gateOffset: -1 })).toThrow(/gateOffset must/);
    cb.end();
  });
});

describe("dec_attention's combine writing its rows quantized for the integer-dot o_proj (flags bit 3)", () => {
  /** quantize_act's rule for one group of 16 on the CPU (quantizeGroup): packed words, scale, sum of q. */
  function quantizeGroup16(y: Float32Array, at: number): { words: number[]; scale: number; sum: number } {
    const q = new Int8Array(16);
    const { scale, sum } = quantizeGroup(y, at, at + 16, q, 0);
    const bytes = new DataView(q.buffer);
    const words = [0, 1, 2, 3].map((w) => bytes.getUint32(4 * w, true)); // byte j of a word: q[4w + j]
    return { words, scale, sum };
  }

  test("decode S 1 and 3 (the combine, and the decode kernel's COMBINE_TAIL), prompt chunks S 9 and 40, head_dim 128 and 256, with and without the gate: the rows as quantize_act's rule from out; bad calls refused", () => {
    for (const c of [
      { headDim: 128, kvHeads: 4, group: 8, ctx: 700, S: 1, word: 576, gated: false },
      { headDim: 256, kvHeads: 2, group: 8, ctx: 300, S: 3, word: 40, gated: true },
      { headDim: 128, kvHeads: 4, group: 8, ctx: 700, S: 1, word: 576, gated: false, combineTail: true },
      { headDim: 256, kvHeads: 2, group: 8, ctx: 300, S: 3, word: 40, gated: true, combineTail: true },
      // prompt chunks (the graphs' o_proj reads these rows up to 64 tokens): pass 1 is dec_attention_prefill
      { headDim: 128, kvHeads: 4, group: 8, ctx: 700, S: 40, word: 100, gated: false },
      { headDim: 256, kvHeads: 2, group: 8, ctx: 300, S: 9, word: 7, gated: true },
    ]) {
      const { headDim: hd, kvHeads: KV, group: G, ctx: ctxLen, S } = c;
      const H = KV * G, floats = S * H * hd;
      using op = new DecoderAttention(device, { heads: H, kvHeads: KV, headDim: hd, chunk: 32, workgroupSize: 128, maxBindings: 2, combineTail: c.combineTail ?? false });
      expect(op.dispatches(S)).toBe(c.combineTail && S <= 4 ? 1 : 2);
      const k = halves(ctxLen * KV * hd, seed++), v = halves(ctxLen * KV * hd, seed++);
      using qBuf = new Buffer(device, { size: BigInt(4 * floats), memory: "upload" });
      new Float32Array(qBuf.host()).set(randomGaussianF32(floats, seed++, 2));
      using kBuf = new Buffer(device, { size: BigInt(k.bits.byteLength), memory: "device" });
      using vBuf = new Buffer(device, { size: BigInt(v.bits.byteLength), memory: "device" });
      uploadBytes(device, kBuf, 0n, bytesOf(k.bits));
      uploadBytes(device, vBuf, 0n, bytesOf(v.bits));
      using gBuf = new Buffer(device, { size: BigInt(4 * floats), memory: "upload" });
      new Float32Array(gBuf.host()).set(randomGaussianF32(floats, seed++, 2));
      using partials = new Buffer(device, { size: BigInt(op.partialBytes(ctxLen, S)), memory: "device" });
      using out = hostBuffer(device, floats);
      using pos = hostBuffer(device, 128, "upload");
      u32(pos, 1)[0] = c.word;
      const groups = floats / 16;
      // host-visible quantized rows (the layout GgmlIdpScratch holds), sentinels past them
      using xq = hostBuffer(device, 4 * groups), xscale = hostBuffer(device, groups), xsum = hostBuffer(device, groups);
      const quantized = { xq, xscale, xsum, cols: H * hd, maxTokens: S };
      const binding = op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out, positions: pos, quantized, ...(c.gated && { gate: gBuf }) });
      using pool = new CommandPool(device);
      const cb = pool.allocate().begin();
      op.record(cb, binding, { n: 1, S, maxPositions: ctxLen, quantize: true });
      cb.barrier("computeToHost").end();
      using fence = new Fence(device);
      using submission = new Submission(device, [cb], { fence });
      submission.submit();
      expect(fence.wait()).toBe(true);
      const y = f32(out, floats);
      for (let g = 0; g < groups; g++) {
        const want = quantizeGroup16(y, 16 * g);
        expect({ g, words: [...u32(xq, 4, 4 * g)] }).toEqual({ g, words: want.words });
        expect({ g, scale: f32(xscale, 1, g)[0] }).toEqual({ g, scale: want.scale });
        expect({ g, sum: new Int32Array(xsum.host(), 4 * g, 1)[0] }).toEqual({ g, sum: want.sum });
      }
      expectTail(xq, 4 * groups, "xq");
      expectTail(xsum, groups, "xsum");
      const cb2 = pool.allocate().begin();
      const plain = op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out, positions: pos });
      expect(() => op.record(cb2, plain, { n: 1, S, maxPositions: ctxLen, quantize: true })).toThrow(/needs a binding with quantized rows/);
      expect(() => op.record(cb2, binding, { n: 1, S, maxPositions: ctxLen, quantize: true, outOffset: 4 })).toThrow(/offset 0/);
      expect(() => op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out, quantized: { ...quantized, cols: 64 } })).toThrow(/quantized rows of 64 columns/);
      cb2.end();
    }
  }, 60_000);
});
