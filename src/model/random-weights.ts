/**
 * Fast, seeded, near-normal random weights for model files of billions of values.
 *
 * xoshiro128** rather than mulberry32: a 30B-weight model draws ~7x more numbers than mulberry32's
 * period (2^32), so its tensors would repeat each other. Each value is the sum of the four bytes of
 * one 32-bit draw (Irwin-Hall, n = 4: within ±3.46σ, near enough to normal for random weights):
 * integer arithmetic only, so the bytes are the same in every runtime, and a few ns a value.
 */

/** splitmix32 step: spreads a seed over the generator's state. */
function splitmix32(x: number): number {
  x = (x + 0x9e3779b9) | 0;
  let z = x;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

/** Standard deviation of the sum of four uniform bytes: sqrt(4 * (256^2 - 1) / 12). */
const BYTE_SUM_STD = Math.sqrt((4 * (256 * 256 - 1)) / 12);
const BYTE_SUM_MEAN = 4 * 127.5;

/**
 * One independent stream of weights, from (seed, tensor, chunk): every chunk of rows of every
 * tensor gets its own, so chunks can be made in any order, or in parallel, with the same bytes.
 */
export class WeightStream {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;

  constructor(seed: number, tensor: number, chunk: number) {
    let x = splitmix32(splitmix32(splitmix32(seed >>> 0) ^ tensor) ^ chunk);
    this.s0 = x = splitmix32(x);
    this.s1 = x = splitmix32(x);
    this.s2 = x = splitmix32(x);
    this.s3 = splitmix32(x);
    if ((this.s0 | this.s1 | this.s2 | this.s3) === 0) this.s0 = 1; // the all-zero state is a fixed point
  }

  /** Fills `out` with values of mean `mean` and standard deviation `std` (f32). */
  fill(out: Float32Array, mean: number, std: number): void {
    const scale = std / BYTE_SUM_STD;
    const offset = mean - BYTE_SUM_MEAN * scale;
    let s0 = this.s0, s1 = this.s1, s2 = this.s2, s3 = this.s3;
    for (let i = 0; i < out.length; i++) {
      // xoshiro128**
      const r = Math.imul(rotl(Math.imul(s1, 5), 7), 9);
      const t = s1 << 9;
      s2 ^= s0;
      s3 ^= s1;
      s1 ^= s2;
      s0 ^= s3;
      s2 ^= t;
      s3 = rotl(s3, 11);
      // Sum of the four bytes, two at a time.
      const pairs = (r & 0x00ff00ff) + ((r >>> 8) & 0x00ff00ff);
      const sum = (pairs & 0xffff) + (pairs >>> 16);
      out[i] = offset + sum * scale;
    }
    this.s0 = s0;
    this.s1 = s1;
    this.s2 = s2;
    this.s3 = s3;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}
