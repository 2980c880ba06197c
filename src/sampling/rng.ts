/**
 * The sampler's random numbers: xoshiro128** (128-bit state, period 2^128 - 1), seeded through splitmix64 so
 * that nearby seeds give unrelated streams. Uniforms carry 53 random bits, so token probabilities far below
 * 2^-32 are still drawn at the right rate (mulberry32 would round them to 0 or 2^-32).
 */

const MASK64 = (1n << 64n) - 1n;

/** A seeded source of uniform floats in [0, 1); same seed, same stream. */
export class SeededRandom {
  readonly seed: number;
  private s0 = 0;
  private s1 = 0;
  private s2 = 0;
  private s3 = 0;

  constructor(seed: number) {
    this.seed = seed;
    this.reset();
  }

  /** Rewinds to the start of this seed's stream. */
  reset(): void {
    // splitmix64 of the seed: BigInt is slow, but this runs once per seed, not per draw.
    let state = BigInt(this.seed);
    const words: number[] = [];
    for (let i = 0; i < 2; i++) {
      state = (state + 0x9e3779b97f4a7c15n) & MASK64;
      let z = state;
      z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
      z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
      z ^= z >> 31n;
      words.push(Number(z & 0xffffffffn), Number(z >> 32n));
    }
    [this.s0, this.s1, this.s2, this.s3] = words;
    if ((this.s0 | this.s1 | this.s2 | this.s3) === 0) this.s0 = 1; // the all-zero state never leaves zero
  }

  /** The next 32 random bits, as an unsigned integer. */
  nextUint32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5), 7), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    return result;
  }

  /** A float uniform in [0, 1) with 53 random bits. */
  nextFloat(): number {
    const high = this.nextUint32() >>> 5; // 27 bits
    const low = this.nextUint32() >>> 6; // 26 bits
    return (high * 67108864 + low) / 9007199254740992;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/** A fresh seed from the platform's CSPRNG (Bun and Deno both have Web Crypto); 32 bits, easy to log and retype. */
export function randomSeed(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0];
}
