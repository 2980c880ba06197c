/**
 * dec_attention_prefill (prompt chunks' pass 1: a block of tokens per workgroup, K/V tiles in
 * shared memory, register tiles) on the real driver, each case against attendCpu (f64) over the
 * same f16-rounded keys and values AND against the general pass 1 (prefillKernel: false) on the
 * same inputs, both through the same combine. S in {5, 8, 17, 64}; n from 1 to a few hundred (so
 * chunks are partly masked and n + S is rarely a multiple of the tile); head_dim 32/64/128/256 x
 * GQA 1/2/4/8; n pushed, and n from a positions buffer (one recording replayed at several words,
 * words past the context capped); spans of several chunks (long n, small chunks), surplus spans
 * (maxPositions past n + S - 1), a layer offset and a q/out offset; shapes: rows 8..64, tiles
 * 8..64, K/V tiles as floats and as halves, 64..256 threads, the graphs' GPU shape (chunk 32, 128 threads). Every
 * case checks that the prefill kernel ran (its shape), its partial records one by one against the
 * general pass 1's (checkRecords), and sentinel words past out and the partials.
 *
 * Bound: NMSE <= 1e-10 per case, as test/decoder-attention.test.ts argues it (f32 dot products of
 * head_dim terms, exp, sums of at most a span's terms, a combine over <= 16 spans). Negative
 * control in the suite: each output against the reference one position off (token t seeing
 * n + t - 1 or n + t + 1 positions) fails the bound.
 */
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { DECODE_ATTENTION_TOKENS, DecoderAttention, type PrefillShapeOptions } from "../src/kernels/decoder/attention.ts";
import { attendCpu } from "../src/model/ops.ts";
import { nmse, randomGaussianF32 } from "../src/quant/index.ts";
import { CommandPool } from "../src/vk/commands.ts";
import { Buffer } from "../src/vk/memory.ts";
import { Fence, Submission } from "../src/vk/sync.ts";
import { uploadBytes } from "../src/vk/transfer.ts";
import { bytesOf, halves } from "./support/attention-data.ts";
import { finish, openTestContext } from "./support/gpu.ts";
import { SENTINEL, expectTail, f32, hostBuffer, u32 } from "./support/host-buffers.ts";

const ctx = openTestContext();
const device = ctx.device;
afterEach(() => expect(ctx.instance.takeMessages()).toEqual([]));
const ops = new Map<string, DecoderAttention>();
afterAll(() => {
  for (const op of ops.values()) op[Symbol.dispose]();
  finish(ctx);
});

const BOUND = 1e-10;
let seed = 7000;
let worstRef = 0, worstGeneral = 0, worstRecord = 0, leastOffByOne = Infinity;
let recordsRead = 0, recordsEmpty = 0;
const shapesRun = new Set<string>();

interface Case {
  headDim: number;
  kvHeads: number;
  group: number;
  /** Positions seen by token 0 (with `words`: the base added to each word). */
  n: number;
  S: number;
  chunk?: number;
  workgroupSize?: number;
  shape?: PrefillShapeOptions;
  qStd?: number;
  /** n from a positions buffer: one recording (grid sized for ctx) replayed once per word. */
  words?: number[];
  /** Cache positions (required with words; else n + S - 1 plus a few unused). */
  ctx?: number;
  posIndex?: number;
  /** Record for this many positions (pushed n; surplus spans exit). */
  maxPositions?: number;
  /** Cache layers (the case uses the last one). */
  layers?: number;
  qOffset?: number;
  outOffset?: number;
}

function opFor(c: Case, prefillKernel: boolean): DecoderAttention {
  const H = c.kvHeads * c.group;
  const key = `${H}/${c.kvHeads}/${c.headDim}/${c.chunk}/${c.workgroupSize}/${prefillKernel}/${JSON.stringify(c.shape ?? {})}`;
  let op = ops.get(key);
  if (!op) {
    op = new DecoderAttention(device, {
      heads: H, kvHeads: c.kvHeads, headDim: c.headDim, chunk: c.chunk, workgroupSize: c.workgroupSize, maxBindings: 4, prefillKernel,
      ...(c.shape && { prefillShape: c.shape }),
    });
    ops.set(key, op);
  }
  return op;
}

const label = (c: Case, word?: number) =>
  `hd ${c.headDim} G ${c.group} KV ${c.kvHeads} n ${c.n} S ${c.S}${c.chunk ? ` C ${c.chunk}` : ""}${word !== undefined ? ` word ${word}` : ""}${c.shape ? ` ${JSON.stringify(c.shape)}` : ""}`;

/**
 * Runs one case through the prefill kernel and the general pass 1 (one command buffer, replayed
 * per word) and checks both against attendCpu; returns the prefill kernel's shape label.
 */
function runCase(c: Case): string {
  const { headDim: hd, kvHeads: KV, group: G, n, S } = c;
  const H = KV * G, layers = c.layers ?? 1, qOffset = c.qOffset ?? 0, outOffset = c.outOffset ?? 0;
  const fromBuffer = c.words !== undefined;
  const ctxLen = c.ctx ?? n + S - 1 + 3;
  const maxPositions = fromBuffer ? ctxLen : c.maxPositions;
  const prefill = opFor(c, true), general = opFor(c, false);
  const entry = prefill.prefillFor(S);
  if (!entry) throw new Error(`${label(c)}: the prefill kernel does not serve this call`);
  expect(general.prefillFor(S)).toBeUndefined();
  const s = entry.shape;
  const shapeLabel = `rows ${s.rows} tile ${s.tile} ${s.halfTiles ? "halves" : "floats"} wg ${s.workgroupSize} (${s.ra}x${s.ka}, ${s.rc}x${s.qc})`;
  shapesRun.add(`hd ${hd} G ${G}: ${shapeLabel}`);

  const perLayer = ctxLen * KV * hd, layer = layers - 1;
  const k = halves(layers * perLayer, seed++), v = halves(layers * perLayer, seed++);
  const lk = k.values.subarray(layer * perLayer), lv = v.values.subarray(layer * perLayer);
  const cacheOffset = prefill.layerOffset(layer, ctxLen);
  const floats = S * H * hd;
  using qBuf = new Buffer(device, { size: BigInt(4 * (qOffset + floats)), memory: "upload" });
  using kBuf = new Buffer(device, { size: BigInt(k.bits.byteLength), memory: "device" });
  using vBuf = new Buffer(device, { size: BigInt(v.bits.byteLength), memory: "device" });
  uploadBytes(device, kBuf, 0n, bytesOf(k.bits));
  uploadBytes(device, vBuf, 0n, bytesOf(v.bits));
  const partialWords = prefill.partialBytes(maxPositions ?? n + S - 1, S) / 4;
  using partialsA = hostBuffer(device, partialWords), partialsB = hostBuffer(device, partialWords);
  using outA = hostBuffer(device, outOffset + floats), outB = hostBuffer(device, outOffset + floats);
  const posIndex = c.posIndex ?? 0;
  using pos = hostBuffer(device, posIndex + 1, "upload");
  u32(pos, posIndex + 1).fill(ctxLen >>> 1); // what a wrong posIndex would visibly read

  using pool = new CommandPool(device);
  const cb = pool.allocate().begin();
  const call = { n, S, cacheOffset, qOffset, outOffset, ...(maxPositions !== undefined && { maxPositions }), ...(fromBuffer && { posIndex }) };
  const bind = (op: DecoderAttention, partials: Buffer, out: Buffer) => op.bind({ q: qBuf, keys: kBuf, values: vBuf, partials, out, ...(fromBuffer && { positions: pos }) });
  prefill.record(cb, bind(prefill, partialsA, outA), call);
  general.record(cb, bind(general, partialsB, outB), call);
  cb.barrier("computeToHost").end();
  using fence = new Fence(device);
  using submission = new Submission(device, [cb], { fence });

  let first = true;
  for (const word of c.words ?? [undefined]) {
    const q = randomGaussianF32(floats, seed++, c.qStd ?? 2);
    new Float32Array(qBuf.host()).set(q, qOffset);
    if (word !== undefined) u32(pos, 1, posIndex)[0] = word;
    for (const b of [outA, outB]) new Uint32Array(b.host(), 0, outOffset + floats).fill(SENTINEL);
    submission.submit();
    if (!fence.wait()) throw new Error(`${label(c, word)}: attention timed out`);
    fence.reset();
    for (const [b, what] of [[outA, "out"], [outB, "general out"], [partialsA, "partials"], [partialsB, "general partials"]] as const) {
      expectTail(b, b === outA || b === outB ? outOffset + floats : partialWords, `${label(c, word)}: ${what}`);
    }
    if (u32(outA, outOffset).some((w) => w !== SENTINEL)) throw new Error(`${label(c, word)}: a word before outOffset was written`);
    const got = f32(outA, floats, outOffset).slice(), want = f32(outB, floats, outOffset);
    // token 0 sees n (+ the word, capped at ctx - (S - 1)) positions: it sits at n - 1
    const p0 = (word === undefined ? n : Math.min(n + word, ctxLen - (S - 1))) - 1;
    const reference = (at: number) => {
      const ref = new Float32Array(floats);
      attendCpu(q, lk, lv, S, at, H, KV, hd, ref);
      return ref;
    };
    if (first) checkRecords(c, prefill, partialsA, partialsB, p0 + 1, maxPositions ?? n + S - 1);
    first = false;
    const eRef = nmse(reference(p0), got), eGeneral = nmse(want, got);
    if (!(eRef <= BOUND)) throw new Error(`${label(c, word)} [${shapeLabel}]: NMSE ${eRef} against attendCpu`);
    if (!(eGeneral <= BOUND)) throw new Error(`${label(c, word)} [${shapeLabel}]: NMSE ${eGeneral} against the general pass 1`);
    worstRef = Math.max(worstRef, eRef);
    worstGeneral = Math.max(worstGeneral, eGeneral);
    // negative control: one position off either way (the causal mask shifted) fails the bound
    if (p0 > 0) leastOffByOne = Math.min(leastOffByOne, nmse(reference(p0 - 1), got));
    if (p0 + S < ctxLen) leastOffByOne = Math.min(leastOffByOne, nmse(reference(p0 + 1), got));
  }
  return shapeLabel;
}

/**
 * The partial records themselves (the first submit: the buffers held sentinels before), record
 * by record against the general pass 1's: every record the combine reads (span c of token t with
 * c * span < n + t) written by both, the same m (within f32 rounding of the scores) and the same
 * span-local output acc / l (NMSE <= BOUND); every other record the prefill kernel wrote exactly
 * dec_attention's empty record (m -3.0e38, l 0, zero sums).
 */
function checkRecords(c: Case, op: DecoderAttention, mine: Buffer, theirs: Buffer, n: number, positions: number): void {
  const { headDim: hd, S } = c, H = c.kvHeads * c.group, rec = hd + 4;
  const spans = op.spans(positions, S), span = op.chunk * op.itersPerSpan(positions, S);
  const a = f32(mine, S * H * spans * rec), b = f32(theirs, S * H * spans * rec);
  const aw = u32(mine, S * H * spans * rec), bw = u32(theirs, S * H * spans * rec);
  for (let t = 0; t < S; t++) for (let h = 0; h < H; h++) for (let k = 0; k < spans; k++) {
    const at = ((t * H + h) * spans + k) * rec, where = `${label(c)}: record (t ${t}, h ${h}, span ${k})`;
    if (k * span < n + t) {
      if (aw[at + hd] === SENTINEL || bw[at + hd] === SENTINEL) throw new Error(`${where} is read by the combine but not written`);
      const mA = a[at + hd]!, mB = b[at + hd]!, lA = a[at + hd + 1]!, lB = b[at + hd + 1]!;
      if (!(Math.abs(mA - mB) <= 1e-5 * (1 + Math.abs(mB)))) throw new Error(`${where}: m ${mA} against the general pass 1's ${mB}`);
      const outA = a.subarray(at, at + hd).map((x) => x / lA), outB = b.subarray(at, at + hd).map((x) => x / lB);
      const e = nmse(outB, outA);
      if (!(e <= BOUND)) throw new Error(`${where}: acc / l NMSE ${e} against the general pass 1's`);
      worstRecord = Math.max(worstRecord, e);
      recordsRead++;
    } else if (aw[at + hd] !== SENTINEL) {
      const zero = a.subarray(at, at + hd).every((x) => x === 0);
      if (!(a[at + hd] === Math.fround(-3.0e38) && a[at + hd + 1] === 0 && zero)) throw new Error(`${where}: past the token's context but not dec_attention's empty record (m ${a[at + hd]}, l ${a[at + hd + 1]})`);
      // where the general pass 1 wrote it too, word for word the same (the pad words aside)
      if (bw[at + hd] !== SENTINEL && !aw.subarray(at, at + hd + 2).every((w, i) => w === bw[at + i])) throw new Error(`${where}: the empty record differs from the general pass 1's`);
      recordsEmpty++;
    }
  }
}

describe("dec_attention_prefill vs attendCpu and the general pass 1 (NMSE <= 1e-10)", () => {
  // n per (GQA, S): 1 (causal within the call), then partly masked tiles at assorted offsets
  const ns = [1, 37, 150, 301];
  for (const headDim of [32, 64, 128, 256]) {
    test(`head_dim ${headDim}: GQA 1/2/4/8 x S 5/8/17/64, n 1..301 (pushed)`, () => {
      let i = 0;
      for (const group of [1, 2, 4, 8]) for (const S of [5, 8, 17, 64]) {
        runCase({ headDim, kvHeads: group === 8 ? 1 : 2, group, n: ns[i++ % ns.length]!, S });
      }
    }, 300_000);
  }

  test("n from a positions buffer: one recording per case replayed at several words (out of order, 0, the last, past the end: capped), posIndex 2", () => {
    runCase({ headDim: 128, kvHeads: 1, group: 8, n: 1, S: 64, ctx: 400, chunk: 16, words: [200, 0, 336, 17, 5000] });
    runCase({ headDim: 64, kvHeads: 2, group: 2, n: 3, S: 17, ctx: 300, posIndex: 2, words: [100, 280, 0xffffffff, 1] });
    runCase({ headDim: 256, kvHeads: 1, group: 4, n: 1, S: 5, ctx: 250, chunk: 32, words: [245, 31, 32, 0] });
    runCase({ headDim: 32, kvHeads: 2, group: 1, n: 2, S: 8, ctx: 500, chunk: 8, words: [491, 64, 63] });
  }, 300_000);

  test("spans of several chunks (long n, small chunks: up to 16 spans of up to 8 chunks), surplus spans, layer and q/out offsets", () => {
    runCase({ headDim: 128, kvHeads: 1, group: 8, n: 1500, S: 64, chunk: 32 }); // 49 chunks: 13 spans of 4
    runCase({ headDim: 64, kvHeads: 2, group: 4, n: 900, S: 17, chunk: 8, qStd: 3 }); // 115 chunks: 15 spans of 8, peaky scores
    runCase({ headDim: 256, kvHeads: 1, group: 2, n: 700, S: 8, chunk: 16 }); // 44 chunks: 15 spans of 3
    runCase({ headDim: 32, kvHeads: 4, group: 1, n: 999, S: 5, chunk: 64 }); // one span per chunk past 16
    runCase({ headDim: 64, kvHeads: 2, group: 2, n: 9, S: 17, chunk: 8, maxPositions: 2000 }); // grid sized for 2000: surplus spans exit
    runCase({ headDim: 128, kvHeads: 2, group: 4, n: 70, S: 8, layers: 3, qOffset: 8, outOffset: 5 });
  }, 300_000);

  test("shapes: rows 8..64, tiles 8..64, K/V tiles as floats and halves, 64..256 threads, the graphs' GPU shape (chunk 32, 128 threads)", () => {
    for (const c of [
      { headDim: 128, kvHeads: 1, group: 8, n: 100, S: 64, chunk: 32, workgroupSize: 128 },
      { headDim: 256, kvHeads: 1, group: 8, n: 77, S: 17, chunk: 32, workgroupSize: 128 },
      { headDim: 64, kvHeads: 1, group: 8, n: 45, S: 64, shape: { rows: 64, tile: 16 } },
      { headDim: 64, kvHeads: 2, group: 2, n: 130, S: 64, shape: { rows: 64, tile: 8, halfTiles: true } },
      { headDim: 128, kvHeads: 2, group: 4, n: 33, S: 17, shape: { rows: 16, tile: 64, halfTiles: true } },
      { headDim: 32, kvHeads: 2, group: 1, n: 210, S: 17, shape: { rows: 8, tile: 64 } },
      { headDim: 128, kvHeads: 1, group: 8, n: 64, S: 8, shape: { rows: 8, tile: 8 } }, // one token a workgroup
      { headDim: 256, kvHeads: 1, group: 2, n: 50, S: 64, shape: { tile: 8, halfTiles: false } },
      { headDim: 128, kvHeads: 1, group: 8, n: 200, S: 64, shape: { workgroupSize: 64 } }, // 4x4 register tiles
      { headDim: 64, kvHeads: 2, group: 4, n: 90, S: 17, shape: { workgroupSize: 256, tile: 16 } },
    ] satisfies Case[]) runCase(c);
  }, 300_000);

  test("the shapes chosen: halved where shared memory is short, every call of S > 4 tokens on the kernel, decode and prefillKernel false on the others", () => {
    const limit = device.info.limits.maxComputeSharedMemorySize;
    for (const headDim of [32, 64, 128, 256]) for (const group of [1, 2, 4, 8]) {
      using op = new DecoderAttention(device, { heads: 2 * group, kvHeads: 2, headDim, maxBindings: 1 });
      for (let S = DECODE_ATTENTION_TOKENS + 1; S <= 64; S++) {
        const e = op.prefillFor(S);
        expect({ headDim, group, S, served: e !== undefined }).toEqual({ headDim, group, S, served: true });
        const s = e!.shape;
        expect(s.sharedBytes).toBeLessThanOrEqual(limit);
        expect((s.rows / s.ra) * (s.tile / s.ka)).toBe(s.workgroupSize);
        expect((s.rows / s.rc) * (headDim / 4 / s.qc)).toBe(s.workgroupSize);
        expect(s.rows % group).toBe(0);
        expect(s.rows).toBeLessThanOrEqual(32);
      }
      for (let S = 1; S <= DECODE_ATTENTION_TOKENS; S++) expect(op.prefillFor(S)).toBeUndefined();
    }
    using off = new DecoderAttention(device, { heads: 8, kvHeads: 1, headDim: 128, maxBindings: 1, prefillKernel: false });
    expect(off.prefill).toBeUndefined();
    expect(off.prefillFor(64)).toBeUndefined();
    expect(() => new DecoderAttention(device, { heads: 8, kvHeads: 1, headDim: 128, prefillShape: { rows: 24 } })).toThrow(/rows must be a power of two/);
    expect(() => new DecoderAttention(device, { heads: 8, kvHeads: 1, headDim: 128, prefillShape: { tile: 4 } })).toThrow(/tile must be a power of two/);
    expect(() => new DecoderAttention(device, { heads: 8, kvHeads: 1, headDim: 128, prefillShape: { workgroupSize: 96 } })).toThrow(/workgroupSize must be a power of two/);
  });

  test("worst NMSE of the suite, the shapes run, and the negative control", () => {
    console.log(`dec_attention_prefill: worst NMSE ${worstRef.toExponential(2)} vs attendCpu, ${worstGeneral.toExponential(2)} vs the general pass 1 (bound ${BOUND})`);
    console.log(`  records: ${recordsRead} read by the combine (worst span-local NMSE ${worstRecord.toExponential(2)} vs the general pass 1), ${recordsEmpty} empty ones written as dec_attention writes them`);
    console.log(`  negative control: least NMSE against the reference one position off ${leastOffByOne.toExponential(2)}`);
    console.log(`  shapes run:\n    ${[...shapesRun].sort().join("\n    ")}`);
    expect(worstRef).toBeGreaterThan(0);
    expect(worstRef).toBeLessThanOrEqual(BOUND);
    expect(worstGeneral).toBeLessThanOrEqual(BOUND);
    expect(leastOffByOne).toBeGreaterThan(1e3 * BOUND);
    expect(recordsEmpty).toBeGreaterThan(0);
    expect(new Set([...shapesRun].map((l) => l.includes("halves"))).size).toBe(2);
  });
});
