/** Helpers shared by the MoE demo and benchmark: expert preloading with progress, memory sizing, RMSNorm. */
import type { MoeBackend } from "../../src/moe/backend.ts";
import type { ExpertWeights } from "../../src/moe/reference.ts";
import { packExpert } from "../../src/pool/expert-layout.ts";
import { Progress } from "./progress.ts";

/**
 * Makes experts [0, perLayer) of layers [0, layers) resident on the GPU (a progress bar on
 * stderr) so timed runs measure steady-state work, not uploads. Experts the budget cannot hold
 * stay on the CPU (the backend's hybrid path). Returns how many were made resident.
 */
export function preloadExperts(backend: MoeBackend, layers: number, perLayer: number, weights: (layer: number, expert: number) => ExpertWeights): { resident: number; notResident: number; seconds: number } {
  const pool = backend.pool;
  if (!pool) return { resident: 0, notResident: layers * perLayer, seconds: 0 };
  const layout = pool.layout;
  const bar = new Progress("uploading experts", layers * perLayer, "experts", layout.bytes);
  let resident = 0, notResident = 0;
  for (let l = 0; l < layers; l++) {
    for (let e = 0; e < perLayer; e++) {
      const res = pool.cache.tryEnsure(l, e, {
        byteLength: layout.bytes,
        fill: (dest: Uint8Array) => {
          const m = weights(l, e);
          packExpert(layout, m.gate, m.up, m.down, dest);
        },
      });
      if (res.resident) resident++;
      else notResident++;
      bar.tick();
    }
    pool.flush();
  }
  pool.flush();
  return { resident, notResident, seconds: bar.finish() };
}

/** x = h / rms(h): keeps a residual stream at unit scale between layers, as a model's norm would. */
export function rmsNorm(h: Float32Array, out: Float32Array): void {
  let ss = 0;
  for (let i = 0; i < h.length; i++) ss += h[i]! * h[i]!;
  const inv = 1 / Math.sqrt(ss / h.length + 1e-6);
  for (let i = 0; i < h.length; i++) out[i] = h[i]! * inv;
}

/** Sums of squared error and squared reference, to build an NMSE over many calls. */
export class NmseAccumulator {
  err = 0;
  energy = 0;
  worstCall = 0;
  add(ref: ArrayLike<number>, got: ArrayLike<number>): void {
    let err = 0, energy = 0;
    for (let i = 0; i < ref.length; i++) {
      const d = ref[i]! - got[i]!;
      err += d * d;
      energy += ref[i]! * ref[i]!;
    }
    this.err += err;
    this.energy += energy;
    const one = energy === 0 ? (err === 0 ? 0 : Infinity) : err / energy;
    if (!(one <= this.worstCall)) this.worstCall = one;
  }
  get value(): number {
    return this.energy === 0 ? (this.err === 0 ? 0 : Infinity) : this.err / this.energy;
  }
}
