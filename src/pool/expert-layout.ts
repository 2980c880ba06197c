/**
 * One routed expert as one resident unit: gate, up and down matrices with their scales in one
 * blob, so a single 64-bit address (or slab index + offset) locates all six arrays; the offsets
 * inside the blob are the same for every expert of a layer shape and travel as push constants.
 *
 *   blob: | gate weights | gate scales | up weights | up scales | down weights | down scales |
 *         each part starts 16-byte aligned (uvec4 loads)
 */
import { InvalidArgumentError } from "../errors.ts";
import { groupsPerRowFor, rowWordsFor, scaleWordsFor } from "../quant/layout.ts";
import type { GroupSize, QuantFormat, QuantMatrix, ScaleType } from "../quant/types.ts";
import { validateQuantMatrix } from "../quant/validate.ts";

export interface ExpertShape {
  format: QuantFormat;
  groupSize: GroupSize;
  scaleType: ScaleType;
  /** Model dimension D: gate/up map D -> I, down maps I -> D. */
  hidden: number;
  /** Expert intermediate size I. */
  intermediate: number;
}

export interface MatrixPart {
  rows: number;
  cols: number;
  rowWords: number;
  groupsPerRow: number;
  /** Byte offsets inside the blob. */
  weightOffset: number;
  scaleOffset: number;
  weightBytes: number;
  scaleBytes: number;
}

export interface ExpertLayout {
  shape: ExpertShape;
  gate: MatrixPart;
  up: MatrixPart;
  down: MatrixPart;
  bytes: number;
}

const align16 = (n: number) => Math.ceil(n / 16) * 16;

export function expertLayout(shape: ExpertShape): ExpertLayout {
  let at = 0;
  const part = (rows: number, cols: number): MatrixPart => {
    const rowWords = rowWordsFor(shape.format, cols);
    const groupsPerRow = groupsPerRowFor(cols, shape.groupSize);
    const weightBytes = rows * rowWords * 4;
    const scaleBytes = scaleWordsFor(shape.scaleType, rows * groupsPerRow) * 4;
    const weightOffset = at;
    const scaleOffset = align16(weightOffset + weightBytes);
    at = align16(scaleOffset + scaleBytes);
    return { rows, cols, rowWords, groupsPerRow, weightOffset, scaleOffset, weightBytes, scaleBytes };
  };
  const gate = part(shape.intermediate, shape.hidden);
  const up = part(shape.intermediate, shape.hidden);
  const down = part(shape.hidden, shape.intermediate);
  return { shape, gate, up, down, bytes: at };
}

function checkPart(name: string, m: QuantMatrix, p: MatrixPart, shape: ExpertShape): void {
  validateQuantMatrix(m);
  if (m.rows !== p.rows || m.cols !== p.cols || m.format !== shape.format || m.groupSize !== shape.groupSize || m.scaleType !== shape.scaleType) {
    throw new InvalidArgumentError(`${name} is ${m.rows}x${m.cols} ${m.format}/${m.groupSize}/${m.scaleType}, the expert shape needs ${p.rows}x${p.cols} ${shape.format}/${shape.groupSize}/${shape.scaleType}`);
  }
}

/** Writes gate, up and down into `dest` (layout.bytes long) in blob order. */
export function packExpert(layout: ExpertLayout, gate: QuantMatrix, up: QuantMatrix, down: QuantMatrix, dest: Uint8Array): void {
  if (dest.byteLength !== layout.bytes) throw new InvalidArgumentError(`expert blob is ${layout.bytes} bytes, destination ${dest.byteLength}`);
  const parts: [string, QuantMatrix, MatrixPart][] = [["gate", gate, layout.gate], ["up", up, layout.up], ["down", down, layout.down]];
  for (const [name, m, p] of parts) checkPart(name, m, p, layout.shape);
  dest.fill(0);
  for (const [, m, p] of parts) {
    dest.set(new Uint8Array(m.weights.buffer, m.weights.byteOffset, p.weightBytes), p.weightOffset);
    dest.set(new Uint8Array(m.scales.buffer, m.scales.byteOffset, p.scaleBytes), p.scaleOffset);
  }
}
