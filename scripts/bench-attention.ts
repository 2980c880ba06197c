// GPU µs of one decode attention call (pass 1 + barrier + combine) as the resident graphs record
// it: S = 1, the position read from a host-written word (one recording for the whole cache, the
// grid sized for it), each call followed by a compute-to-compute barrier, calls cycling over
// --layers distinct caches (their K/V not all in the L2, as in a decode over many layers). Shapes:
// Qwen3-30B-A3B (32 query heads, 4 KV heads, head_dim 128) and Qwen3.6-like (16, 2, 256); positions
// 576 and 4096 in a cache of 8192, and 576 in a cache of 32768; the decode kernel
// (dec_attention_decode) against the general pass 1 (dec_attention, decodeKernel: false), for each
// --chunk. Qwen3.6's output gate: folded into the combine against attention + GatingKernel's
// sigmoid-gate dispatch and its barrier (the graph before the fold). Prints the KV bytes a call
// reads and what share of the measured read bandwidth that is. Clocks warmed with a streaming read
// before each measurement.
//   bun scripts/bench-attention.ts [--shape all|30b|3.6] [--chunk 16,32,64] [--kernel all|decode|general] [--groups N] [--calls 48] [--layers 16] [--reps 7]
//
// --prefill: a prompt chunk's attention instead: S = 64 tokens from positions 576 and 4096 of a cache
// of 8192, recorded as the graphs record it (the position from a host-written word, the grid and
// spans sized for the whole cache), dec_attention_prefill against the general pass 1 (prefillKernel:
// false) in the same run, for each --rows x --tile x --half x --threads of the prefill kernel (upper
// bounds: it halves what does not fit; the shape it ran is printed), GFLOP (QK^T and PV of the causal
// positions) and TFLOP/s, and the general pass 1's time over each variant's.
//   bun scripts/bench-attention.ts --prefill [--shape ...] [--chunk 32] [--rows 16,32,64] [--tile 16,32,64] [--half auto|on|off] [--threads 64,128,256]
//
// --long: a long prompt chunk as the graphs record it (--tokens each, default 512, its first token at
// positions 0 and 3584 of a cache of 4096): the 64-query calls one after another (recordLong: the
// prefill kernel and a combine each) against dec_attention_cm in one dispatch (recordPrompt; where
// the device has cooperative matrices that pass the kernel's self-check), in the same run, with
// GFLOP (QK^T and PV of the causal positions), TFLOP/s and the calls' time over the kernel's.
//   bun scripts/bench-attention.ts --long [--shape ...] [--tokens 512,2048]
import { parseArgs } from "node:util";
import { z } from "zod";
import { readConfig } from "../src/config.ts";
import { DEFAULT_DECODE_GROUPS, DEFAULT_PREFILL_ROWS, DEFAULT_PREFILL_TILE, DecoderAttention, type PrefillShapeOptions } from "../src/kernels/decoder/attention.ts";
import { GatingKernel } from "../src/kernels/decoder/gating.ts";
import { Buffer, CommandPool, Fence, QueryPool, Submission, uploadBytes, VulkanContext, type CommandBuffer } from "../src/vk/index.ts";
import { args, fail } from "./lib/cli.ts";
import { readBandwidth } from "./lib/gpu-time.ts";

const SCRIPT = "bench-attention";
const USAGE = "usage: bun scripts/bench-attention.ts [--shape all|30b|3.6] [--chunk 16,32,64] [--kernel all|decode|general] [--groups N] [--calls N] [--layers N] [--reps N] [--prefill [--rows 16,32] [--tile 16,32] [--half auto|on|off] [--threads 128]] [--long [--tokens 512]]";
const SHAPES = {
  "30b": { label: "Qwen3-30B-A3B", heads: 32, kvHeads: 4, headDim: 128, gated: false },
  "3.6": { label: "Qwen3.6-like", heads: 16, kvHeads: 2, headDim: 256, gated: true },
} as const;
/** (cache positions, decode position) pairs. */
const POINTS = [[8192, 576], [8192, 4096], [32768, 576]] as const;
/** --prefill: the chunk's tokens, its cache and its first token's positions. */
const PREFILL_S = 64;
const PREFILL_CACHE = 8192;
const PREFILL_POSITIONS = [576, 4096] as const;
/** --long: the cache and the chunk's first token's positions. */
const LONG_CACHE = 4096;
const LONG_POSITIONS = [0, 3584] as const;

const chunkList = z.string().regex(/^\d+(,\d+)*$/, "a comma-separated list of integers").transform((s) => s.split(",").map(Number))
  .refine((l) => l.every((c) => c >= 1 && c <= 1024), "chunks must be in 1..1024");
const pow2List = (what: string, lo: number, hi: number) =>
  z.string().regex(/^\d+(,\d+)*$/, "a comma-separated list of integers").transform((s) => s.split(",").map(Number))
    .refine((l) => l.every((x) => x >= lo && x <= hi && (x & (x - 1)) === 0), `${what} must be powers of two in ${lo}..${hi}`);
let flags: {
  shape: "all" | "30b" | "3.6"; chunk: number[]; kernel: "all" | "decode" | "general"; groups: number; calls: number; layers: number; reps: number;
  prefill: boolean; rows: number[]; tile: number[]; half: "auto" | "on" | "off"; threads?: number[]; long: boolean; tokens: number[];
};
try {
  const { values } = parseArgs({
    args: args(), strict: true, allowPositionals: false,
    options: {
      shape: { type: "string" }, chunk: { type: "string" }, kernel: { type: "string" }, groups: { type: "string" }, calls: { type: "string" }, layers: { type: "string" }, reps: { type: "string" },
      prefill: { type: "boolean" }, rows: { type: "string" }, tile: { type: "string" }, half: { type: "string" }, threads: { type: "string" },
      long: { type: "boolean" }, tokens: { type: "string" },
    },
  });
  const parsed = z.object({
    shape: z.enum(["all", "30b", "3.6"]).default("all"),
    chunk: chunkList.default([32]),
    kernel: z.enum(["all", "decode", "general"]).default("all"),
    groups: z.coerce.number().int().min(1).max(65535).default(DEFAULT_DECODE_GROUPS),
    calls: z.coerce.number().int().min(1).max(1000).default(48),
    layers: z.coerce.number().int().min(1).max(64).default(16),
    reps: z.coerce.number().int().min(1).max(100).default(7),
    prefill: z.boolean().default(false),
    rows: pow2List("rows", 1, 256).default([DEFAULT_PREFILL_ROWS]),
    tile: pow2List("tiles", 8, 256).default([DEFAULT_PREFILL_TILE]),
    half: z.enum(["auto", "on", "off"]).default("auto"),
    threads: pow2List("threads", 32, 1024).optional(),
    long: z.boolean().default(false),
    tokens: z.string().regex(/^\d+(,\d+)*$/, "a comma-separated list of integers").transform((t) => t.split(",").map(Number))
      .refine((l) => l.every((x) => x > 64 && x <= LONG_CACHE - LONG_POSITIONS[1]), `tokens must be in 65..${LONG_CACHE - LONG_POSITIONS[1]}`).default([512]),
  }).safeParse(values);
  if (!parsed.success) fail(SCRIPT, `${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, "; ")}; ${USAGE}`);
  flags = parsed.data;
} catch (e) {
  fail(SCRIPT, `${(e as Error).message.split("\n")[0]!}; ${USAGE}`);
}

using ctx = new VulkanContext({}, readConfig());
const device = ctx.device;
const cpu = device.info.type === 4;
using pool = new CommandPool(device);
using queries = new QueryPool(device, 2);
using fence = new Fence(device);
const bw = cpu ? undefined : readBandwidth(device, 1 << 30, 20);

/** Finite halves of magnitude < 0.25 with random signs and mantissas (two per word). */
function randomHalves(words: number, seed: number): Uint8Array {
  const w = new Uint32Array(words);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < words; i++) {
    x ^= x << 13; x ^= x >>> 17; x ^= x << 5;
    w[i] = ((x & 0x83ff83ff) | 0x30003000) >>> 0;
  }
  return new Uint8Array(w.buffer);
}

/** flags.layers caches of random halves (keys and values, layerBytes each), disposed together. */
function randomCaches(layerBytes: number): { keys: Buffer[]; values: Buffer[] } & Disposable {
  const keys: Buffer[] = [], values: Buffer[] = [];
  const dispose = () => { for (const b of [...keys, ...values]) b[Symbol.dispose](); };
  try {
    for (let l = 0; l < flags.layers; l++) {
      for (const list of [keys, values]) {
        const b = new Buffer(device, { size: BigInt(layerBytes), memory: "device" });
        list.push(b);
        uploadBytes(device, b, 0n, randomHalves(layerBytes / 4, 1 + l * 2 + list.length));
      }
    }
  } catch (e) {
    dispose();
    throw e;
  }
  return { keys, values, [Symbol.dispose]: dispose };
}

/** GPU µs per call: `record` repeated flags.calls times (each then a barrier), median of reps. */
function time(record: (cb: CommandBuffer, call: number) => void): number {
  const cb = pool.allocate().begin().resetQueries(queries).timestamp(queries, 0);
  for (let i = 0; i < flags.calls; i++) {
    record(cb, i);
    cb.barrier("computeToCompute");
  }
  cb.timestamp(queries, 1).end();
  using submission = new Submission(device, [cb], { fence });
  if (!cpu) readBandwidth(device, 1 << 30, 40); // clocks up
  const samples: number[] = [];
  for (let r = 0; r < flags.reps; r++) {
    submission.submit();
    if (!fence.wait()) throw new Error(`${SCRIPT}: the GPU did not finish`);
    fence.reset();
    const [a, b] = queries.results(0, 2);
    samples.push((Number(b! - a!) * device.info.limits.timestampPeriod) / 1000 / flags.calls);
  }
  return samples.sort((p, q) => p - q)[samples.length >> 1]!;
}

console.log(`${device.info.name}, ${device.info.driverName} ${device.info.driverInfo}${bw ? `: read bandwidth ${bw.gbs.toFixed(0)} GB/s` : ""}`);
const shapes = flags.shape === "all" ? (["30b", "3.6"] as const) : [flags.shape];

/** The decode tables (see the header). */
function decodeTables(): void {
  console.log(`decode attention, S = 1, position from a host-written word, ${flags.calls} calls over ${flags.layers} caches, each then a barrier; median of ${flags.reps}; grid cap ${flags.groups} (decode kernel)`);
  console.log("| shape | cache | position | kernel | chunk | µs/call | KV MB read | GB/s | of read BW |");
  console.log("|---|---:|---:|---|---:|---:|---:|---:|---:|");

  const kernels = flags.kernel === "all" ? [true, false] : [flags.kernel === "decode"];
  const gateRows: string[] = [];
  for (const name of shapes) {
    const shape = SHAPES[name];
    const { heads: H, kvHeads: KV, headDim: hd } = shape;
    for (const cacheLen of [...new Set(POINTS.map(([c]) => c))]) {
      const layerBytes = cacheLen * KV * hd * 2;
      using caches = randomCaches(layerBytes);
      const { keys, values } = caches;
      using q = new Buffer(device, { size: BigInt(4 * H * hd), memory: "device" });
      uploadBytes(device, q, 0n, randomHalves(H * hd, 99)); // any finite floats
      using gate = new Buffer(device, { size: BigInt(4 * H * hd), memory: "device" });
      uploadBytes(device, gate, 0n, randomHalves(H * hd, 98));
      using out = new Buffer(device, { size: BigInt(4 * H * hd), memory: "device" });
      using positions = new Buffer(device, { size: 4n * 128n, memory: "upload" });
      const word = new Uint32Array(positions.host(), 0, 1);
      for (const chunk of flags.chunk) {
        for (const decodeKernel of kernels) {
          const gated = shape.gated && decodeKernel;
          using op = new DecoderAttention(device, {
            heads: H, kvHeads: KV, headDim: hd, chunk, workgroupSize: 128, maxBindings: 2 * flags.layers, decodeKernel, maxDecodeGroups: flags.groups,
          });
          using partials = new Buffer(device, { size: BigInt(op.partialBytes(cacheLen, 1)), memory: "device" });
          const bindings = keys.map((k, l) => op.bind({ q, keys: k, values: values[l]!, partials, out, positions }));
          const gatedBindings = gated ? keys.map((k, l) => op.bind({ q, keys: k, values: values[l]!, partials, out, positions, gate })) : [];
          using gating = new GatingKernel(device, { maxSets: 4 });
          for (const [c, position] of POINTS) {
            if (c !== cacheLen) continue;
            word[0] = position; // token at `position` sees position + 1 positions
            const call = { n: 1, S: 1, maxPositions: cacheLen, posIndex: 0 };
            const us = time((cb, i) => op.record(cb, bindings[i % flags.layers]!, call));
            const kvBytes = 2 * (position + 1) * KV * hd * 2;
            const gbs = kvBytes / (us * 1e3);
            console.log(`| ${shape.label} | ${cacheLen} | ${position} | ${decodeKernel ? "decode" : "general"} | ${chunk} | ${us.toFixed(2)} | ${(kvBytes / 1e6).toFixed(2)} | ${gbs.toFixed(0)} | ${bw ? `${((100 * gbs) / bw.gbs).toFixed(1)}%` : "-"} |`);
            if (gated) {
              const folded = time((cb, i) => op.record(cb, gatedBindings[i % flags.layers]!, call));
              const separate = time((cb, i) => {
                op.record(cb, bindings[i % flags.layers]!, call);
                cb.barrier("computeToCompute");
                gating.record(cb, { mode: "sigmoid-gate", x: out, g: gate, y: out, S: 1, n: H * hd });
              });
              gateRows.push(`| ${shape.label} | ${cacheLen} | ${position} | ${chunk} | ${separate.toFixed(2)} | ${folded.toFixed(2)} | ${(separate - folded).toFixed(2)} |`);
            }
          }
        }
      }
    }
  }
  if (gateRows.length > 0) {
    console.log("\noutput gate (decode kernel): attention + the sigmoid-gate dispatch and its barrier, against the gate folded into the combine");
    console.log("| shape | cache | position | chunk | separate µs/call | folded µs/call | saved µs |");
    console.log("|---|---:|---:|---:|---:|---:|---:|");
    for (const r of gateRows) console.log(r);
  }
}

/** --prefill: the prompt chunk's table (see the header). */
function prefillTable(): void {
  const S = PREFILL_S, cacheLen = PREFILL_CACHE;
  const halfTiles = flags.half === "auto" ? undefined : flags.half === "on";
  const variants: (PrefillShapeOptions | undefined)[] = [undefined]; // undefined: the general pass 1
  for (const rows of flags.rows) for (const tile of flags.tile) for (const threads of flags.threads ?? [undefined]) {
    variants.push({ rows, tile, ...(halfTiles !== undefined && { halfTiles }), ...(threads !== undefined && { workgroupSize: threads }) });
  }
  console.log(`prompt-chunk attention, S = ${S} from a host-written position, cache ${cacheLen} (grid and spans sized for it, as the graphs record it), ${flags.calls} calls over ${flags.layers} caches, each then a barrier; median of ${flags.reps}`);
  console.log("| shape | position | chunk | kernel | prefill shape | µs/call | GFLOP | TFLOP/s | general / this |");
  console.log("|---|---:|---:|---|---|---:|---:|---:|---:|");
  for (const name of shapes) {
    const { label, heads: H, kvHeads: KV, headDim: hd } = SHAPES[name];
    const layerBytes = cacheLen * KV * hd * 2;
    using caches = randomCaches(layerBytes);
    const { keys, values } = caches;
    using q = new Buffer(device, { size: BigInt(4 * S * H * hd), memory: "device" });
    uploadBytes(device, q, 0n, randomHalves(S * H * hd, 99)); // any finite floats
    using out = new Buffer(device, { size: BigInt(4 * S * H * hd), memory: "device" });
    using positions = new Buffer(device, { size: 4n * 128n, memory: "upload" });
    const word = new Uint32Array(positions.host(), 0, 1);
    for (const chunk of flags.chunk) {
      const general = new Map<number, number>();
      for (const shape of variants) {
        using op = new DecoderAttention(device, {
          heads: H, kvHeads: KV, headDim: hd, chunk, workgroupSize: 128, maxBindings: flags.layers, prefillKernel: shape !== undefined, ...(shape && { prefillShape: shape }),
        });
        const ran = op.prefillFor(S)?.shape;
        if (shape && !ran) {
          console.log(`| ${label} | - | ${chunk} | prefill | ${JSON.stringify(shape)}: does not fit this device | - | - | - | - |`);
          continue;
        }
        const shapeLabel = ran ? `rows ${ran.rows}, tile ${ran.tile} ${ran.halfTiles ? "halves" : "floats"}, ${ran.workgroupSize} threads (${ran.ra}x${ran.ka}, ${ran.rc}x${ran.qc}), ${(ran.sharedBytes / 1024).toFixed(1)} KiB` : "-";
        using partials = new Buffer(device, { size: BigInt(op.partialBytes(cacheLen, S)), memory: "device" });
        const bindings = keys.map((k, l) => op.bind({ q, keys: k, values: values[l]!, partials, out, positions }));
        for (const position of PREFILL_POSITIONS) {
          word[0] = position; // token t at position + t sees position + t + 1 positions
          const call = { n: 1, S, maxPositions: cacheLen, posIndex: 0 };
          const us = time((cb, i) => op.record(cb, bindings[i % flags.layers]!, call));
          // QK^T and PV: 2 x 2 flops per (row, position, dim)
          let seen = 0;
          for (let t = 0; t < S; t++) seen += position + t + 1;
          const gflop = (4 * H * hd * seen) / 1e9;
          if (!ran) general.set(position, us);
          const ratio = ran && general.has(position) ? `${(general.get(position)! / us).toFixed(2)}x` : "-";
          console.log(`| ${label} | ${position} | ${chunk} | ${ran ? "prefill" : "general"} | ${shapeLabel} | ${us.toFixed(2)} | ${gflop.toFixed(3)} | ${(gflop / (us * 1e-6) / 1e3).toFixed(2)} | ${ratio} |`);
        }
      }
    }
  }
}

/** --long: the long chunk's table (see the header). */
function longTable(): void {
  const cacheLen = LONG_CACHE;
  const cm = device.enabled.cooperativeMatrix;
  const longBase = new Map<string, number>();  // the 64-query calls' µs by shape, tokens and position
  console.log(`long prompt-chunk attention, S from a host-written position, cache ${cacheLen}, ${flags.calls} calls over ${flags.layers} caches, each then a barrier; median of ${flags.reps}${cm ? "" : `; dec_attention_cm not run: cooperative matrices not enabled on ${device.info.name}`}`);
  console.log("| shape | tokens | position | kernel | µs/call | GFLOP | TFLOP/s | 64-query calls / this |");
  console.log("|---|---:|---:|---|---:|---:|---:|---:|");
  for (const name of shapes) {
    const { label, heads: H, kvHeads: KV, headDim: hd } = SHAPES[name];
    using caches = randomCaches(cacheLen * KV * hd * 2);
    const { keys, values } = caches;
    const maxS = Math.max(...flags.tokens);
    using q = new Buffer(device, { size: BigInt(4 * maxS * H * hd), memory: "device" });
    uploadBytes(device, q, 0n, randomHalves(maxS * H * hd, 99)); // any finite floats
    using out = new Buffer(device, { size: BigInt(4 * maxS * H * hd), memory: "device" });
    using positions = new Buffer(device, { size: 4n * 128n, memory: "upload" });
    const word = new Uint32Array(positions.host(), 0, 1);
    for (const onCores of cm ? [false, true] : [false]) {
      using op = new DecoderAttention(device, {
        heads: H, kvHeads: KV, headDim: hd, chunk: 32, workgroupSize: 128, maxBindings: flags.layers, ...(onCores && { promptMatrixCores: { variant: true, fromTokens: 65 } }),
      });
      if (onCores && !op.promptOnMatrixCores(maxS)) {
        console.log(`| ${label} | - | - | dec_attention_cm | not run: its tile or its self-check failed on this device | - | - | - |`);
        continue;
      }
      using partials = new Buffer(device, { size: BigInt(op.partialBytesUpTo(cacheLen)), memory: "device" });
      const bindings = keys.map((k, l) => op.bind({ q, keys: k, values: values[l]!, partials, out, positions }));
      for (const S of flags.tokens) {
        for (const position of LONG_POSITIONS) {
          word[0] = position; // token t at position + t sees position + t + 1 positions
          const call = { S, maxPositions: cacheLen };
          const us = time((cb, i) => (onCores ? op.recordPrompt(cb, bindings[i % flags.layers]!, call) : op.recordLong(cb, bindings[i % flags.layers]!, call)));
          let seen = 0;
          for (let t = 0; t < S; t++) seen += position + t + 1;
          const gflop = (4 * H * hd * seen) / 1e9;
          const key = `${name}/${S}/${position}`;
          if (!onCores) longBase.set(key, us);
          const ratio = onCores && longBase.has(key) ? `${(longBase.get(key)! / us).toFixed(2)}x` : "-";
          console.log(`| ${label} | ${S} | ${position} | ${onCores ? "dec_attention_cm" : "64-query calls"} | ${us.toFixed(1)} | ${gflop.toFixed(2)} | ${(gflop / (us * 1e-6) / 1e3).toFixed(2)} | ${ratio} |`);
        }
      }
    }
  }
}

if (flags.long) longTable();
else if (flags.prefill) prefillTable();
else decodeTables();
