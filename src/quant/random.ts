/** Small seeded PRNGs so tests and benchmarks are reproducible in Bun and Deno alike. */

/** mulberry32: a fast 32-bit PRNG; returns a function giving floats uniform in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Standard normal samples (Box-Muller) driven by a uniform PRNG. */
export function gaussian(uniform: () => number): () => number {
  let spare: number | undefined;
  return () => {
    if (spare !== undefined) {
      const v = spare;
      spare = undefined;
      return v;
    }
    const u1 = 1 - uniform(); // (0, 1]: log stays finite
    const u2 = uniform();
    const radius = Math.sqrt(-2 * Math.log(u1));
    spare = radius * Math.sin(2 * Math.PI * u2);
    return radius * Math.cos(2 * Math.PI * u2);
  };
}

/** A Float32Array of n normal samples times `std`, from `seed`. */
export function randomGaussianF32(n: number, seed: number, std = 1): Float32Array {
  const next = gaussian(mulberry32(seed));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = next() * std;
  return out;
}

/** A Uint32Array of n uniformly random words from `seed`. */
export function randomWords(n: number, seed: number): Uint32Array {
  const next = mulberry32(seed);
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = (next() * 4294967296) >>> 0;
  return out;
}
