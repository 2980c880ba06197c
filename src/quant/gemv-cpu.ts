/** Fast CPU fallback: y = x · Wᵀ for q4/q8 matrices, f32 in and out, typed arrays only. */
import type { GemvJob } from "./gemv-job.ts";
import { f16ToF32Table } from "./half.ts";
import { LOOKUP_TABLE_SIZE, q4Lookup, q4LookupSingleToken, q4MultiToken, q4SingleToken } from "./kernels-q4.ts";
import { q8MultiToken, q8SingleToken } from "./kernels-q8.ts";
import { colsPerWord } from "./layout.ts";
import { checkGateUpArgs, swiglu } from "./swiglu.ts";
import type { QuantMatrix } from "./types.ts";
import { checkGemvArgs } from "./validate.ts";

/** q4 uses byte lookup tables from this many rows on: below it, building the tables costs more than it saves. */
const LOOKUP_MIN_ROWS = 256;
/** ...and up to this many tokens: beyond it the per-token tables (16 KiB each) crowd L2 and multiplies win (measured crossover: 6-8 in Bun, 8-16 in Deno). */
const LOOKUP_MAX_TOKENS = 8;

const HALF_INDEX_FLIP = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1 ? 0 : 1;
const EMPTY_F32 = new Float32Array(0);
const EMPTY_U16 = new Uint16Array(0);

/** Scratch reused across calls so a GEMV allocates nothing proportional to the matrix. */
const scratch: {
  x: Float64Array;
  groupSums: Float64Array;
  partial: Float64Array;
  total: Float64Array;
  tables: Float32Array;
  gateUp: Float32Array;
} = {
  x: new Float64Array(0),
  groupSums: new Float64Array(0),
  partial: new Float64Array(0),
  total: new Float64Array(0),
  tables: new Float32Array(0),
  gateUp: new Float32Array(0),
};

function atLeastF64(current: Float64Array, length: number): Float64Array {
  return current.length >= length ? current : new Float64Array(Math.max(length, current.length * 2));
}

function atLeastF32(current: Float32Array, length: number): Float32Array {
  return current.length >= length ? current : new Float32Array(Math.max(length, current.length * 2));
}

/** Copies x [S, cols] into zero-padded f64 rows of `stride` and, for q4, sums each group per token. */
function stageActivations(m: QuantMatrix, x: Float32Array, S: number, stride: number): void {
  scratch.x = atLeastF64(scratch.x, S * stride);
  const xs = scratch.x;
  const { cols, groupSize, groupsPerRow } = m;
  for (let s = 0; s < S; s++) {
    const src = s * cols;
    const dst = s * stride;
    for (let c = 0; c < cols; c++) xs[dst + c] = x[src + c];
    xs.fill(0, dst + cols, dst + stride);
  }
  if (m.format !== "q4") return;
  scratch.groupSums = atLeastF64(scratch.groupSums, S * groupsPerRow);
  const sums = scratch.groupSums;
  for (let s = 0; s < S; s++) {
    for (let g = 0; g < groupsPerRow; g++) {
      const start = s * stride + g * groupSize;
      const end = s * stride + Math.min((g + 1) * groupSize, cols);
      let sum = 0;
      for (let c = start; c < end; c++) sum += xs[c];
      sums[s * groupsPerRow + g] = sum;
    }
  }
}

function makeJob(m: QuantMatrix, S: number, stride: number, y: Float32Array): GemvJob {
  const f16Scales = m.scaleType === "f16";
  const s = m.scales;
  return {
    weights: m.weights,
    rows: m.rows,
    rowWords: m.rowWords,
    groupsPerRow: m.groupsPerRow,
    wordsPerGroup: m.groupSize / colsPerWord(m.format),
    f16Scales,
    scalesF32: f16Scales ? EMPTY_F32 : new Float32Array(s.buffer, s.byteOffset, s.length),
    scalesF16: f16Scales ? new Uint16Array(s.buffer, s.byteOffset, s.length * 2) : EMPTY_U16,
    halfTable: f16ToF32Table(),
    halfIndexFlip: HALF_INDEX_FLIP,
    S,
    x: scratch.x,
    xStride: stride,
    groupSums: scratch.groupSums,
    y,
  };
}

/** The kernel dispatch behind gemvCpu and gateUpCpu; arguments already checked. */
function runGemv(m: QuantMatrix, x: Float32Array, S: number, y: Float32Array): void {
  const stride = m.rowWords * colsPerWord(m.format);
  stageActivations(m, x, S, stride);
  const job = makeJob(m, S, stride, y);
  if (m.format === "q4" && m.rows >= LOOKUP_MIN_ROWS && S <= LOOKUP_MAX_TOKENS) {
    scratch.tables = atLeastF32(scratch.tables, S * LOOKUP_TABLE_SIZE);
    scratch.total = atLeastF64(scratch.total, S * m.rows);
    if (S === 1) q4LookupSingleToken(job, scratch.tables, scratch.total);
    else q4Lookup(job, scratch.tables, scratch.total);
    return;
  }
  if (S === 1) {
    if (m.format === "q4") q4SingleToken(job);
    else q8SingleToken(job);
    return;
  }
  scratch.partial = atLeastF64(scratch.partial, S);
  scratch.total = atLeastF64(scratch.total, S);
  if (m.format === "q4") q4MultiToken(job, scratch.partial, scratch.total);
  else q8MultiToken(job, scratch.partial, scratch.total);
}

/**
 * y[s*rows + o] = sum_i x[s*cols + i] * W[o][i] for S tokens (1..64). Accumulates in f64 locals and stores f32.
 * Every weight word is read once per call for all S tokens.
 */
export function gemvCpu(m: QuantMatrix, x: Float32Array, S: number, y: Float32Array): void {
  checkGemvArgs(m, x, S, y);
  runGemv(m, x, S, y);
}

/**
 * Fused gate+up with SwiGLU: h = silu(g) * u, g = x · Wgᵀ, u = x · Wuᵀ; with `limit`, g = min(g, limit) and
 * u = clamp(u, -limit, limit) first. h is [S, rows].
 */
export function gateUpCpu(
  gate: QuantMatrix,
  up: QuantMatrix,
  x: Float32Array,
  S: number,
  h: Float32Array,
  limit?: number,
): void {
  checkGateUpArgs(gate, up, x, S, h, limit);
  const n = S * up.rows;
  scratch.gateUp = atLeastF32(scratch.gateUp, n);
  const u = scratch.gateUp.subarray(0, n);
  runGemv(up, x, S, u);
  runGemv(gate, x, S, h);
  for (let i = 0; i < n; i++) h[i] = swiglu(h[i], u[i], limit);
}
