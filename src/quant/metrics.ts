/** Error metrics for comparing a result against a reference. */
import { ShapeMismatchError } from "./errors.ts";

/** Normalized mean squared error: sum((ref-got)^2) / sum(ref^2). 0 when both are all zero; Infinity when only ref is. */
export function nmse(ref: ArrayLike<number>, got: ArrayLike<number>): number {
  if (ref.length !== got.length) throw new ShapeMismatchError(`nmse: length mismatch, ref ${ref.length} vs got ${got.length}`);
  let err = 0;
  let energy = 0;
  for (let i = 0; i < ref.length; i++) {
    const a = ref[i];
    const d = a - got[i];
    err += d * d;
    energy += a * a;
  }
  if (energy === 0) return err === 0 ? 0 : Infinity;
  return err / energy;
}

/** Largest |ref - got|. */
export function maxAbsDiff(ref: ArrayLike<number>, got: ArrayLike<number>): number {
  if (ref.length !== got.length) throw new ShapeMismatchError(`maxAbsDiff: length mismatch, ref ${ref.length} vs got ${got.length}`);
  let worst = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = Math.abs(ref[i] - got[i]);
    if (Number.isNaN(d)) return NaN;
    if (d > worst) worst = d;
  }
  return worst;
}

/** NMSE over every output of a set of cases together (each case's ref and got of one length). */
export function pooledNmse(results: { ref: ArrayLike<number>; got: ArrayLike<number> }[]): number {
  let err = 0, energy = 0;
  for (const r of results) {
    if (r.ref.length !== r.got.length) throw new ShapeMismatchError(`pooledNmse: length mismatch, ref ${r.ref.length} vs got ${r.got.length}`);
    for (let i = 0; i < r.ref.length; i++) {
      err += (r.got[i]! - r.ref[i]!) ** 2;
      energy += r.ref[i]! ** 2;
    }
  }
  return err / energy;
}
