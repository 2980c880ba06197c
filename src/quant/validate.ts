/** Argument guards run by every quant entry point before any work is done. */
import {
  BufferTooShortError,
  InvalidDimensionError,
  NonFiniteValueError,
  ShapeMismatchError,
  UnsupportedFormatError,
  UnsupportedGroupSizeError,
} from "./errors.ts";
import { groupsPerRowFor, rowWordsFor, scaleWordsFor } from "./layout.ts";
import {
  MAX_TOKENS,
  SUPPORTED_FORMATS,
  SUPPORTED_GROUP_SIZES,
  SUPPORTED_SCALE_TYPES,
  type GroupSize,
  type QuantFormat,
  type QuantMatrix,
  type ScaleType,
} from "./types.ts";

/** `value` must be an integer >= 1. */
export function checkDimension(name: string, value: number): void {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new InvalidDimensionError(`${name} must be an integer, got ${String(value)}`);
  }
  if (value < 1) throw new InvalidDimensionError(`${name} must be >= 1, got ${value}`);
  if (value > 0x7fffffff) throw new InvalidDimensionError(`${name} must be < 2^31, got ${value}`);
}

export function checkGroupSize(groupSize: number): asserts groupSize is GroupSize {
  if (!SUPPORTED_GROUP_SIZES.includes(groupSize as GroupSize)) {
    throw new UnsupportedGroupSizeError(
      `unsupported group size ${String(groupSize)}; supported: ${SUPPORTED_GROUP_SIZES.join(", ")}`,
    );
  }
}

export function checkFormat(format: string, scaleType: string): void {
  if (!SUPPORTED_FORMATS.includes(format as QuantFormat)) {
    throw new UnsupportedFormatError(`unsupported quant format "${format}"; supported: ${SUPPORTED_FORMATS.join(", ")}`);
  }
  if (!SUPPORTED_SCALE_TYPES.includes(scaleType as ScaleType)) {
    throw new UnsupportedFormatError(
      `unsupported scale type "${scaleType}"; supported: ${SUPPORTED_SCALE_TYPES.join(", ")}`,
    );
  }
}

/** S must be an integer in 1..MAX_TOKENS. */
export function checkTokenCount(S: number): void {
  if (typeof S !== "number" || !Number.isInteger(S) || S < 1 || S > MAX_TOKENS) {
    throw new InvalidDimensionError(`token count S must be an integer in 1..${MAX_TOKENS}, got ${String(S)}`);
  }
}

/** Throws NonFiniteValueError naming the row and group of the first NaN/Inf scale. */
function checkScalesFinite(m: QuantMatrix): void {
  const count = m.rows * m.groupsPerRow;
  const scales = m.scales;
  let bad = -1;
  if (m.scaleType === "f32") {
    for (let k = 0; k < count; k++) {
      if ((scales[k] & 0x7f800000) === 0x7f800000) {
        bad = k;
        break;
      }
    }
  } else {
    // Two halves per word: test both exponent fields at once, find which half afterwards.
    const words = count >>> 1;
    for (let w = 0; w < words; w++) {
      const v = scales[w];
      if ((v & 0x7c00) === 0x7c00 || (v & 0x7c000000) === 0x7c000000) {
        bad = (v & 0x7c00) === 0x7c00 ? 2 * w : 2 * w + 1;
        break;
      }
    }
    if (bad < 0 && (count & 1) === 1 && (scales[words] & 0x7c00) === 0x7c00) bad = count - 1;
  }
  if (bad >= 0) {
    const row = Math.floor(bad / m.groupsPerRow);
    const group = bad % m.groupsPerRow;
    throw new NonFiniteValueError(`scale of row ${row}, group ${group} is NaN or infinite`);
  }
}

/**
 * Checks that `m` is a well-formed QuantMatrix: supported format/group size, integer dims >= 1,
 * rowWords/groupsPerRow consistent with cols, arrays long enough, every scale finite.
 */
export function validateQuantMatrix(m: QuantMatrix): void {
  if (m === null || typeof m !== "object") throw new UnsupportedFormatError("quant matrix must be an object");
  checkFormat(m.format, m.scaleType);
  checkGroupSize(m.groupSize);
  checkDimension("rows", m.rows);
  checkDimension("cols", m.cols);
  const rowWords = rowWordsFor(m.format, m.cols);
  if (m.rowWords !== rowWords) {
    throw new ShapeMismatchError(
      `rowWords is ${String(m.rowWords)} but a ${m.format} row of ${m.cols} columns needs ${rowWords} (padded to 16 bytes)`,
    );
  }
  const groupsPerRow = groupsPerRowFor(m.cols, m.groupSize);
  if (m.groupsPerRow !== groupsPerRow) {
    throw new ShapeMismatchError(
      `groupsPerRow is ${String(m.groupsPerRow)} but ${m.cols} columns in groups of ${m.groupSize} make ${groupsPerRow}`,
    );
  }
  if (!(m.weights instanceof Uint32Array)) throw new UnsupportedFormatError("weights must be a Uint32Array");
  if (!(m.scales instanceof Uint32Array)) throw new UnsupportedFormatError("scales must be a Uint32Array");
  const weightWords = m.rows * rowWords;
  if (m.weights.length < weightWords) {
    throw new BufferTooShortError(
      `weights array too short: ${m.rows} rows x ${rowWords} words need ${weightWords} u32 words, got ${m.weights.length}`,
    );
  }
  const scaleWords = scaleWordsFor(m.scaleType, m.rows * groupsPerRow);
  if (m.scales.length < scaleWords) {
    throw new BufferTooShortError(
      `scales array too short: ${m.rows} rows x ${groupsPerRow} groups of ${m.scaleType} need ${scaleWords} u32 words, got ${m.scales.length}`,
    );
  }
  checkScalesFinite(m);
}

/** Throws NonFiniteValueError naming token and column of the first NaN/Inf in x ([S, cols] row-major). */
export function checkFiniteActivations(x: Float32Array, S: number, cols: number): void {
  const n = S * cols;
  for (let i = 0; i < n; i++) {
    const v = x[i];
    if (v - v !== 0) {
      throw new NonFiniteValueError(
        `x[token ${Math.floor(i / cols)}, column ${i % cols}] is ${Number.isNaN(v) ? "NaN" : "infinite"}`,
      );
    }
  }
}

/** Guards for y = x · Wᵀ with S tokens: x is [S, cols] Float32Array, y (if given) is [S, rows] Float32Array. */
export function checkGemvArgs(m: QuantMatrix, x: Float32Array, S: number, y?: Float32Array): void {
  validateQuantMatrix(m);
  checkGemvOperands(m, x, S, y);
}

/** The x/S/y half of checkGemvArgs, for callers that have already validated `m`. */
export function checkGemvOperands(m: QuantMatrix, x: Float32Array, S: number, y?: Float32Array): void {
  checkTokenCount(S);
  if (!(x instanceof Float32Array)) throw new UnsupportedFormatError("x must be a Float32Array");
  if (x.length !== S * m.cols) {
    throw new ShapeMismatchError(`x length must be S*cols = ${S}*${m.cols} = ${S * m.cols}, got ${x.length}`);
  }
  if (y !== undefined) {
    if (!(y instanceof Float32Array)) throw new UnsupportedFormatError("y must be a Float32Array");
    if (y.length !== S * m.rows) {
      throw new ShapeMismatchError(`y length must be S*rows = ${S}*${m.rows} = ${S * m.rows}, got ${y.length}`);
    }
  }
  checkFiniteActivations(x, S, m.cols);
}
