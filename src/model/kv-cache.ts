/** Keys and values of every layer for one sequence, on the CPU path: f32 [ctx, kvHeads, headDim] per layer. */
export class KvCache {
  readonly keys: Float32Array[];
  readonly values: Float32Array[];
  readonly rowSize: number;
  /** Positions filled (the next token goes here). */
  length = 0;

  constructor(readonly layers: number, readonly ctx: number, readonly kvHeads: number, readonly headDim: number) {
    this.rowSize = kvHeads * headDim;
    this.keys = Array.from({ length: layers }, () => new Float32Array(ctx * this.rowSize));
    this.values = Array.from({ length: layers }, () => new Float32Array(ctx * this.rowSize));
  }

  get bytes(): number {
    return 2 * this.layers * this.ctx * this.rowSize * 4;
  }
}
