/**
 * A weight matrix the decoder multiplies by on the CPU path: y[S, rows] = x[S, cols] · Wᵀ. Float
 * weights are read in place from the mapped file (f32/f16/bf16, one row converted at a time and
 * reused for all S tokens); quantized ones are QuantMatrix (q4/q8, lossless from GGUF Q4_0/Q8_0), or
 * GGML blocks (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) read in place from the file by a CPU GEMV.
 */
import { gemvCpu } from "../quant/gemv-cpu.ts";
import { checkGgmlScalesFinite, ggmlBlockTensor, type GgmlBlockTensor, type GgmlBlockType } from "../quant/ggml-blocks.ts";
import { gemvGgmlBlocks } from "../quant/ggml-gemv.ts";
import { f16ToF32Table } from "../quant/half.ts";
import type { QuantMatrix } from "../quant/types.ts";
import type { TensorDType } from "../formats/tensor.ts";

export interface Linear {
  readonly rows: number;
  readonly cols: number;
  /** "f32", "bf16", "f16", "q8", "q4", or a GGML block type in lower case ("q4_k"): what the weights are held as. */
  readonly kind: string;
  /** Bytes the weights take where they are held. */
  readonly bytes: number;
  apply(x: Float32Array, S: number, y: Float32Array): void;
}

export type FloatDType = "F32" | "F16" | "BF16";

/** Typed view of a float tensor's bytes: in place when aligned, else one copy (safetensors allows odd offsets). */
export function floatElements(dtype: FloatDType, bytes: Uint8Array): Float32Array | Uint16Array {
  const size = dtype === "F32" ? 4 : 2;
  const aligned = bytes.byteOffset % size === 0 ? bytes : bytes.slice();
  const buffer = aligned.buffer as ArrayBuffer;
  return dtype === "F32"
    ? new Float32Array(buffer, aligned.byteOffset, aligned.byteLength / 4)
    : new Uint16Array(buffer, aligned.byteOffset, aligned.byteLength / 2);
}

/** Writes row r of a float tensor [rows, cols] as f32 into out. */
export function readFloatRow(dtype: FloatDType, data: Float32Array | Uint16Array, r: number, cols: number, out: Float32Array): void {
  const base = r * cols;
  if (dtype === "F32") {
    out.set((data as Float32Array).subarray(base, base + cols));
  } else if (dtype === "BF16") {
    const bits = new Uint32Array(out.buffer, out.byteOffset, cols);
    for (let c = 0; c < cols; c++) bits[c] = data[base + c]! << 16;
  } else {
    const table = f16ToF32Table();
    for (let c = 0; c < cols; c++) out[c] = table[data[base + c]!]!;
  }
}

export class FloatLinear implements Linear {
  readonly kind: string;
  readonly bytes: number;
  private readonly row: Float32Array;
  constructor(readonly dtype: FloatDType, readonly data: Float32Array | Uint16Array, readonly rows: number, readonly cols: number) {
    this.kind = dtype.toLowerCase();
    this.bytes = data.byteLength;
    this.row = new Float32Array(cols);
  }

  apply(x: Float32Array, S: number, y: Float32Array): void {
    const { rows, cols, row } = this;
    for (let r = 0; r < rows; r++) {
      readFloatRow(this.dtype, this.data, r, cols, row);
      for (let s = 0; s < S; s++) {
        const xo = s * cols;
        // Four partial sums: shorter dependency chains, f64 accumulation.
        let a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        let c = 0;
        for (; c + 3 < cols; c += 4) {
          a0 += row[c]! * x[xo + c]!;
          a1 += row[c + 1]! * x[xo + c + 1]!;
          a2 += row[c + 2]! * x[xo + c + 2]!;
          a3 += row[c + 3]! * x[xo + c + 3]!;
        }
        for (; c < cols; c++) a0 += row[c]! * x[xo + c]!;
        y[s * rows + r] = a0 + a1 + a2 + a3;
      }
    }
  }
}

export class QuantLinear implements Linear {
  readonly rows: number;
  readonly cols: number;
  readonly kind: string;
  readonly bytes: number;
  constructor(readonly matrix: QuantMatrix) {
    this.rows = matrix.rows;
    this.cols = matrix.cols;
    this.kind = matrix.format;
    this.bytes = matrix.weights.byteLength + matrix.scales.byteLength;
  }

  apply(x: Float32Array, S: number, y: Float32Array): void {
    // gemvCpu takes at most 64 tokens a call.
    const { rows, cols } = this;
    for (let s0 = 0; s0 < S; s0 += 64) {
      const n = Math.min(64, S - s0);
      gemvCpu(this.matrix, x.subarray(s0 * cols, (s0 + n) * cols), n, y.subarray(s0 * rows, (s0 + n) * rows));
    }
  }
}

/** A GGML block tensor used in place (CPU GEMV here; the GPU graph runs it through GgmlGemvKernel, src/graph/device-linear.ts). */
export class GgmlBlockLinear implements Linear {
  readonly rows: number;
  readonly cols: number;
  readonly kind: string;
  readonly bytes: number;
  readonly tensor: GgmlBlockTensor;
  /** Checks the byte length and that every block scale is finite (GgufLayoutError / NonFiniteValueError naming `name`). */
  constructor(type: GgmlBlockType, bytes: Uint8Array, rows: number, cols: number, name?: string) {
    this.tensor = ggmlBlockTensor(type, bytes, rows, cols, name);
    checkGgmlScalesFinite(this.tensor, name);
    this.rows = rows;
    this.cols = cols;
    this.kind = type.toLowerCase();
    this.bytes = bytes.byteLength;
  }

  apply(x: Float32Array, S: number, y: Float32Array): void {
    // Callers may pass longer buffers (as for the other kinds); the GEMV checks exact lengths.
    gemvGgmlBlocks(this.tensor, x.subarray(0, S * this.cols), S, y.subarray(0, S * this.rows));
  }
}

export const isFloatDType = (d: TensorDType): d is FloatDType => d === "F32" || d === "F16" || d === "BF16";
