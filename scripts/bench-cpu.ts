/**
 * CPU GEMV throughput vs a plain memory-read baseline. Runs in Bun and Deno:
 *   bun scripts/bench-cpu.ts        deno run scripts/bench-cpu.ts
 * Matrices are views into one large pool and are rotated, so every call streams its weights from DRAM.
 */
import { gemvCpu } from "../src/quant/gemv-cpu.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { groupsPerRowFor, rowWordsFor, scaleWordsFor } from "../src/quant/layout.ts";
import { randomGaussianF32 } from "../src/quant/random.ts";
import type { QuantFormat, QuantMatrix } from "../src/quant/types.ts";

const POOL_BYTES = 768 * 2 ** 20; // above the largest L3 we expect (and the 508 MiB some VMs report)
const SECONDS_PER_CASE = 1;
const SHAPES: [number, number][] = [
  [2048, 768], // I -> O
  [768, 2048],
  [4096, 14336],
];
const FORMATS: QuantFormat[] = ["q4", "q8"];
const GROUP_SIZE = 32;

/** Fills with xorshift32 words: every q4/q8 bit pattern is a valid weight. */
function fillRandom(words: Uint32Array, seed: number): void {
  let s = seed | 0 || 1;
  for (let i = 0; i < words.length; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    words[i] = s;
  }
}

/**
 * Sum (mod 2^32) of the pool's words, read through an Int32Array view of the same bytes: with a Uint32Array,
 * JSC does the adds in doubles once values reach 2^31 and the loop measures that (~3 GB/s) instead of memory.
 */
function sumWords(a: Int32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s = (s + a[i]) | 0;
  return s;
}

/** Best of 3 passes of a plain sum over the whole pool, after warming the JIT up to its top tier. */
function readBaselineGBs(pool: Uint32Array): number {
  const words = new Int32Array(pool.buffer, pool.byteOffset, pool.length);
  let sink = 0;
  for (let i = 0; i < 20; i++) sink ^= sumWords(words.subarray(0, 2 ** 20));
  let best = 0;
  for (let rep = 0; rep < 3; rep++) {
    const t0 = performance.now();
    sink ^= sumWords(words);
    const seconds = (performance.now() - t0) / 1000;
    best = Math.max(best, pool.byteLength / seconds / 1e9);
  }
  if (sink === 0x12345678) console.log(""); // keeps the sums observable
  return best;
}

/** Views over the pool: weights back to back, f16 scales from a shared block of finite values. */
function matricesInPool(pool: Uint32Array, scales: Uint32Array, format: QuantFormat, I: number, O: number): QuantMatrix[] {
  const rowWords = rowWordsFor(format, I);
  const groupsPerRow = groupsPerRowFor(I, GROUP_SIZE);
  const weightWords = O * rowWords;
  const scaleWords = scaleWordsFor("f16", O * groupsPerRow);
  const count = Math.floor(pool.length / weightWords);
  const out: QuantMatrix[] = [];
  for (let i = 0; i < count; i++) {
    out.push({
      format,
      rows: O,
      cols: I,
      groupSize: GROUP_SIZE,
      scaleType: "f16",
      rowWords,
      groupsPerRow,
      weights: pool.subarray(i * weightWords, (i + 1) * weightWords),
      scales: scales.subarray(0, scaleWords),
    });
  }
  return out;
}

function runtimeName(): string {
  const g = globalThis as { Bun?: { version: string }; Deno?: { version: { deno: string } } };
  if (g.Bun) return `Bun ${g.Bun.version}`;
  if (g.Deno) return `Deno ${g.Deno.version.deno}`;
  return "unknown runtime";
}

const pool = new Uint32Array(POOL_BYTES / 4);
fillRandom(pool, 0x9e3779b9);
const maxScales = Math.max(...SHAPES.map(([I, O]) => O * groupsPerRowFor(I, GROUP_SIZE)));
const scales = new Uint32Array(scaleWordsFor("f16", maxScales));
for (let k = 0; k < scales.length; k++) scales[k] = f32ToF16Bits(0.01 + (k % 97) * 1e-4) * 0x10001;

const baseline = readBaselineGBs(pool);
const lines: string[] = [];
const pad = (s: string, n: number) => s.padStart(n);
lines.push(`${runtimeName()}, S=1, group ${GROUP_SIZE}, f16 scales; pool ${POOL_BYTES / 2 ** 20} MiB rotated`);
lines.push(`${"I->O".padEnd(12)}${pad("fmt", 4)}${pad("MiB/mat", 9)}${pad("mats", 6)}${pad("ms/call", 9)}${pad("GB/s", 7)}${pad("x read", 8)}`);
for (const [I, O] of SHAPES) {
  const x = randomGaussianF32(I, I + O);
  const y = new Float32Array(O);
  for (const format of FORMATS) {
    const mats = matricesInPool(pool, scales, format, I, O);
    const bytes = mats[0].rows * mats[0].rowWords * 4 + scaleWordsFor("f16", O * mats[0].groupsPerRow) * 4;
    for (let i = 0; i < 3; i++) gemvCpu(mats[i % mats.length], x, 1, y); // JIT warm-up
    let calls = 0;
    const t0 = performance.now();
    let elapsed = 0;
    while (elapsed < SECONDS_PER_CASE * 1000) {
      gemvCpu(mats[calls % mats.length], x, 1, y);
      calls++;
      elapsed = performance.now() - t0;
    }
    const gbs = (bytes * calls) / (elapsed / 1000) / 1e9;
    lines.push(
      `${`${I}->${O}`.padEnd(12)}${pad(format, 4)}${pad((bytes / 2 ** 20).toFixed(2), 9)}${pad(String(mats.length), 6)}` +
        `${pad((elapsed / calls).toFixed(2), 9)}${pad(gbs.toFixed(2), 7)}${pad((gbs / baseline).toFixed(3), 8)}`,
    );
  }
}
lines.push(`baseline: plain read loop summing the ${POOL_BYTES / 2 ** 20} MiB pool (Int32Array view) = ${baseline.toFixed(2)} GB/s`);
console.log(lines.join("\n"));
