/** Round-to-nearest group quantization of dense f32/f16/bf16 matrices into q4/q8 (GGUF Q4_0/Q8_0 style scales). */
import { NonFiniteValueError, ScaleRangeError, ShapeMismatchError, UnsupportedFormatError } from "./errors.ts";
import { f16BitsToF32, f16ToF32Table, f32Bits, f32FromBits, f32ToF16Bits } from "./half.ts";
import { createQuantMatrix, colsPerWord, setScaleBits } from "./layout.ts";
import { packRow } from "./pack.ts";
import type { DenseSource, QuantMatrix, QuantizeOptions } from "./types.ts";
import { checkDimension, checkFormat, checkGroupSize } from "./validate.ts";

/** Round half away from zero (C roundf), as llama.cpp does. */
function roundHalfAway(v: number): number {
  return v < 0 ? -Math.floor(-v + 0.5) : Math.floor(v + 0.5);
}

/** Decodes row `row` of the source into out[0..cols) as f32 values, rejecting NaN/Inf. */
function readSourceRow(source: DenseSource, row: number, cols: number, out: Float32Array): void {
  const base = row * cols;
  if (source.dtype === "f32") {
    out.set(source.data.subarray(base, base + cols));
  } else if (source.dtype === "f16") {
    const table = f16ToF32Table();
    for (let c = 0; c < cols; c++) out[c] = table[source.data[base + c]];
  } else {
    for (let c = 0; c < cols; c++) out[c] = f32FromBits(source.data[base + c] << 16);
  }
  for (let c = 0; c < cols; c++) {
    const v = out[c];
    if (v - v !== 0) {
      throw new NonFiniteValueError(`input row ${row}, col ${c} is ${Number.isNaN(v) ? "NaN" : "infinite"}`);
    }
  }
}

/**
 * The stored scale for a group whose quantizer wants `d` (already f32): rounded to f16 first when the
 * scale type is f16, so that quantization uses exactly the scale dequantization will see. Returns raw bits.
 */
function storedScaleBits(d: number, options: QuantizeOptions, row: number, group: number): number {
  if (options.scaleType === "f32") return f32Bits(d);
  const bits = f32ToF16Bits(d);
  if ((bits & 0x7c00) === 0x7c00) {
    throw new ScaleRangeError(
      `scale ${d} of row ${row}, group ${group} overflows f16 (max 65504); use scaleType "f32"`,
    );
  }
  return bits;
}

/** Quantizes a row-major [rows, cols] matrix. Padding columns are q = 0; all-zero groups get scale 0. */
export function quantize(source: DenseSource, rows: number, cols: number, options: QuantizeOptions): QuantMatrix {
  checkFormat(options.format, options.scaleType);
  checkGroupSize(options.groupSize);
  checkDimension("rows", rows);
  checkDimension("cols", cols);
  if (source === null || typeof source !== "object") throw new UnsupportedFormatError("source must be { dtype, data }");
  const expectedArray = source.dtype === "f32" ? Float32Array : source.dtype === "f16" || source.dtype === "bf16" ? Uint16Array : undefined;
  if (expectedArray === undefined) {
    throw new UnsupportedFormatError(`unsupported source dtype "${String((source as { dtype: unknown }).dtype)}"; supported: f32, f16, bf16`);
  }
  if (!(source.data instanceof expectedArray)) {
    throw new UnsupportedFormatError(`source dtype ${source.dtype} needs data as ${expectedArray.name}`);
  }
  if (source.data.length !== rows * cols) {
    throw new ShapeMismatchError(`source data length must be rows*cols = ${rows}*${cols} = ${rows * cols}, got ${source.data.length}`);
  }

  const { format, groupSize } = options;
  const m = createQuantMatrix(format, rows, cols, groupSize, options.scaleType);
  const qmax = format === "q4" ? 7 : 127;
  const qmin = format === "q4" ? -8 : -127;
  const rowValues = new Float32Array(cols);
  const rowQ = new Int8Array(m.rowWords * colsPerWord(format));
  for (let r = 0; r < rows; r++) {
    readSourceRow(source, r, cols, rowValues);
    for (let g = 0; g < m.groupsPerRow; g++) {
      const start = g * groupSize;
      const end = Math.min(start + groupSize, cols);
      // q4: the signed element of largest magnitude maps to -8 (full range); q8: maxabs maps to 127.
      let amax = 0;
      let extreme = 0;
      for (let c = start; c < end; c++) {
        const a = Math.abs(rowValues[c]);
        if (a > amax) {
          amax = a;
          extreme = rowValues[c];
        }
      }
      let d = Math.fround(format === "q4" ? extreme / -8 : amax / 127);
      let bits = storedScaleBits(d, options, r, g);
      if (options.scaleType === "f16") d = f16BitsToF32(bits);
      if (d === 0) bits = 0;
      setScaleBits(m, r * m.groupsPerRow + g, bits);
      for (let c = start; c < end; c++) {
        rowQ[c] = d === 0 ? 0 : Math.min(qmax, Math.max(qmin, roundHalfAway(rowValues[c] / d)));
      }
    }
    packRow(format, rowQ, m.weights, r * m.rowWords, m.rowWords);
  }
  return m;
}
