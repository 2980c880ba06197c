/**
 * One routed expert as one resident unit: gate, up and down matrices with their scales in one
 * blob, so a single 64-bit address (or slab index + offset) locates all six arrays; the offsets
 * inside the blob are the same for every expert of a layer shape and travel as push constants.
 *
 *   blob: | gate weights | gate scales | up weights | up scales | down weights | down scales |
 *         each part starts 16-byte aligned (uvec4 loads)
 *
 * gate and up are stored by rows (QuantMatrix order). down is stored by column blocks: for each
 * 16-byte block c of a row (32 q4 or 16 q8 columns), that block of rows 0..D-1 in a row; and its
 * scales by group: scale (o, g) at g * D + o. The kernels that read down give each lane of a
 * subgroup its own row of one column block, so this makes their loads contiguous (a workgroup of
 * the one-dispatch call reads one block of every down row: by rows, 16 bytes every row pitch).
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
  /** "rows": QuantMatrix order; "column-blocks": see the header (down). */
  order: "rows" | "column-blocks";
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
  const part = (rows: number, cols: number, order: MatrixPart["order"] = "rows"): MatrixPart => {
    const rowWords = rowWordsFor(shape.format, cols);
    const groupsPerRow = groupsPerRowFor(cols, shape.groupSize);
    const weightBytes = rows * rowWords * 4;
    const scaleBytes = scaleWordsFor(shape.scaleType, rows * groupsPerRow) * 4;
    const weightOffset = at;
    const scaleOffset = align16(weightOffset + weightBytes);
    at = align16(scaleOffset + scaleBytes);
    return { order, rows, cols, rowWords, groupsPerRow, weightOffset, scaleOffset, weightBytes, scaleBytes };
  };
  const gate = part(shape.intermediate, shape.hidden);
  const up = part(shape.intermediate, shape.hidden);
  const down = part(shape.hidden, shape.intermediate, "column-blocks");
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
  // Zero only the alignment gaps: every other byte is written below, and the destination may be
  // write-combining memory (filling a whole Qwen3.6 file's experts first cost a third of the load).
  let covered = 0;
  for (const [, , p] of parts) {
    dest.fill(0, covered, p.weightOffset);
    dest.fill(0, p.weightOffset + p.weightBytes, p.scaleOffset);
    covered = p.scaleOffset + p.scaleBytes;
  }
  dest.fill(0, covered);
  for (const [, m, p] of parts) {
    if (p.order === "rows") {
      dest.set(new Uint8Array(m.weights.buffer, m.weights.byteOffset, p.weightBytes), p.weightOffset);
      dest.set(new Uint8Array(m.scales.buffer, m.scales.byteOffset, p.scaleBytes), p.scaleOffset);
    } else {
      packColumnBlocks(m, p, dest);
    }
  }
}

/**
 * Weights by 16-byte column blocks, scales by group (see the header). Written in destination order:
 * the destination may be write-combining memory (a mapped slab), where scattered stores are slow.
 */
function packColumnBlocks(m: QuantMatrix, p: MatrixPart, dest: Uint8Array): void {
  if ((dest.byteOffset & 3) !== 0) {
    const tmp = new Uint8Array(dest.byteLength);
    packColumnBlocks(m, p, tmp);
    dest.set(tmp.subarray(p.weightOffset, p.scaleOffset + p.scaleBytes), p.weightOffset);
    return;
  }
  const blocks = p.rowWords / 4;
  const src = new Uint32Array(m.weights.buffer, m.weights.byteOffset, p.rows * p.rowWords);
  const out = new Uint32Array(dest.buffer, dest.byteOffset + p.weightOffset, p.rows * p.rowWords);
  for (let c = 0, to = 0; c < blocks; c++) {
    for (let o = 0, from = 4 * c; o < p.rows; o++, to += 4, from += p.rowWords) {
      out[to] = src[from]!; out[to + 1] = src[from + 1]!; out[to + 2] = src[from + 2]!; out[to + 3] = src[from + 3]!;
    }
  }
  const n = p.rows * p.groupsPerRow;
  const [s, d] = m.scaleType === "f16"
    ? [new Uint16Array(m.scales.buffer, m.scales.byteOffset, n), new Uint16Array(dest.buffer, dest.byteOffset + p.scaleOffset, n)]
    : [new Uint32Array(m.scales.buffer, m.scales.byteOffset, n), new Uint32Array(dest.buffer, dest.byteOffset + p.scaleOffset, n)];
  for (let g = 0, to = 0; g < p.groupsPerRow; g++) for (let o = 0; o < p.rows; o++) d[to++] = s[o * p.groupsPerRow + g]!;
}
