/** SwiGLU activation of the fused gate+up projection, with the optional gpt-oss style clamp. */
import { InvalidArgumentError } from "../errors.ts";
import { ShapeMismatchError } from "./errors.ts";
import type { QuantMatrix } from "./types.ts";
import { checkGemvOperands, validateQuantMatrix } from "./validate.ts";

/** `limit` must be undefined (no clamp) or a finite number > 0. */
export function checkSwigluLimit(limit: number | undefined): void {
  if (limit === undefined) return;
  if (typeof limit !== "number" || !Number.isFinite(limit) || !(limit > 0)) {
    throw new InvalidArgumentError(`limit must be a finite number > 0 or undefined for no clamp, got ${String(limit)}`);
  }
}

/** Gate and up projections of one expert must have the same geometry and storage format. */
export function checkGateUpShapes(gate: QuantMatrix, up: QuantMatrix): void {
  const fields = ["format", "rows", "cols", "groupSize", "scaleType"] as const;
  for (const field of fields) {
    if (gate[field] !== up[field]) {
      throw new ShapeMismatchError(
        `gate and up must have identical shapes: gate.${field} = ${String(gate[field])}, up.${field} = ${String(up[field])}`,
      );
    }
  }
}

/** All guards of a fused gate+up call: both matrices valid, same shape, x/S/h consistent, limit valid. */
export function checkGateUpArgs(
  gate: QuantMatrix,
  up: QuantMatrix,
  x: Float32Array,
  S: number,
  h: Float32Array | undefined,
  limit: number | undefined,
): void {
  validateQuantMatrix(gate);
  validateQuantMatrix(up);
  checkGateUpShapes(gate, up);
  checkSwigluLimit(limit);
  checkGemvOperands(gate, x, S, h);
}

/** silu(min(g, limit)) * clamp(u, -limit, limit); silu(g) = g / (1 + exp(-g)). No clamp when limit is undefined. */
export function swiglu(g: number, u: number, limit: number | undefined): number {
  if (limit !== undefined) {
    if (g > limit) g = limit;
    if (u > limit) u = limit;
    else if (u < -limit) u = -limit;
  }
  return (g / (1 + Math.exp(-g))) * u;
}
