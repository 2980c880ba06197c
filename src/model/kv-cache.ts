import { f16BitsToF32, f32ToF16Bits } from "../quant/half.ts";

/**
 * Keys and values of every layer for one sequence, on the CPU path: f32 [ctx, kvHeads, headDim]
 * per layer. With `precision` "f16" every value is rounded to f16 as it is stored (held in f32):
 * the CPU decoder then computes what the GPU's f16 cache holds (tests compare the two exactly).
 */
export class KvCache {
  readonly keys: Float32Array[];
  readonly values: Float32Array[];
  readonly rowSize: number;
  /** Positions filled (the next token goes here). */
  length = 0;

  constructor(readonly layers: number, readonly ctx: number, readonly kvHeads: number, readonly headDim: number, readonly precision: "f32" | "f16" = "f32") {
    this.rowSize = kvHeads * headDim;
    this.keys = Array.from({ length: layers }, () => new Float32Array(ctx * this.rowSize));
    this.values = Array.from({ length: layers }, () => new Float32Array(ctx * this.rowSize));
  }

  /** Stores one position's row of keys or values of a layer. */
  store(into: Float32Array, row: Float32Array, position: number): void {
    const at = position * this.rowSize;
    if (this.precision === "f32") into.set(row, at);
    else for (let i = 0; i < row.length; i++) into[at + i] = f16BitsToF32(f32ToF16Bits(row[i]!));
  }

  /** Back to an empty sequence (the rows are overwritten as positions fill again). */
  reset(): void {
    this.length = 0;
  }

  get bytes(): number {
    return 2 * this.layers * this.ctx * this.rowSize * 4;
  }
}
