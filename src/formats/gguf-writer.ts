/**
 * A streaming GGUF v3 writer. The header (metadata and tensor infos) is built in memory, since it
 * must precede the data and name every tensor's offset; tensor data is then appended tensor by
 * tensor to a file descriptor, so a file of many GB never sits in memory.
 */
import { closeSync, openSync, writeSync } from "node:fs";
import { readableGgmlType } from "./ggml-types.ts";

/** GGML tensor types this writer takes, by ggml.h's ids (the block types' bytes come encoded, e.g. copied from llama-quantize's output). */
export const GgmlType = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 8, Q4_1: 3, Q5_0: 6, Q5_1: 7, Q4_K: 12, Q5_K: 13, Q6_K: 14 } as const;
export type GgmlTypeName = keyof typeof GgmlType;

/** Bytes of a tensor of `type` with GGUF dims `ne` (innermost first). Rows must hold whole blocks. */
export function ggmlTensorBytes(type: GgmlTypeName, ne: readonly number[]): number {
  const { blockElements, blockBytes } = readableGgmlType(GgmlType[type])!;
  const rowLength = ne[0] ?? 1;
  if (rowLength % blockElements !== 0) throw new RangeError(`${type} needs rows of a multiple of ${blockElements} elements, got ${rowLength}`);
  const rows = ne.slice(1).reduce((a, b) => a * b, 1);
  return (rowLength / blockElements) * blockBytes * rows;
}

/** GGUF metadata value types (GGUF spec numbering). */
export const GgufValueTypeId = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9, u64: 10, i64: 11, f64: 12 } as const;
export type GgufScalarType = Exclude<keyof typeof GgufValueTypeId, "array">;

/** One metadata value with its GGUF type; arrays are of one scalar type. */
export type GgufValue =
  | { type: Exclude<GgufScalarType, "string" | "bool" | "u64" | "i64">; value: number }
  | { type: "u64" | "i64"; value: bigint }
  | { type: "bool"; value: boolean }
  | { type: "string"; value: string }
  | { type: "array"; of: "string"; value: readonly string[] }
  | { type: "array"; of: Exclude<GgufScalarType, "string" | "bool" | "u64" | "i64">; value: ArrayLike<number> }
  | { type: "array"; of: "bool"; value: readonly boolean[] };

export type GgufMetadata = ReadonlyArray<readonly [key: string, value: GgufValue]>;

export interface GgufTensorSpec {
  name: string;
  /** GGUF dims, innermost (contiguous) first: a matrix of R rows of C values is [C, R]. */
  ne: readonly number[];
  type: GgmlTypeName;
}

/** A little-endian byte buffer that grows as it is written. */
class ByteBuilder {
  private buf = new Uint8Array(1 << 16);
  private view = new DataView(this.buf.buffer);
  length = 0;
  private readonly encoder = new TextEncoder();

  private reserve(n: number): void {
    if (this.length + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.length + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.length));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  scalar(type: GgufScalarType, value: number | bigint | boolean | string): void {
    switch (type) {
      case "u8": case "i8": case "bool":
        this.reserve(1);
        this.view.setUint8(this.length, type === "bool" ? (value ? 1 : 0) : Number(value) & 0xff);
        this.length += 1;
        return;
      case "u16": this.reserve(2); this.view.setUint16(this.length, Number(value), true); this.length += 2; return;
      case "i16": this.reserve(2); this.view.setInt16(this.length, Number(value), true); this.length += 2; return;
      case "u32": this.reserve(4); this.view.setUint32(this.length, Number(value), true); this.length += 4; return;
      case "i32": this.reserve(4); this.view.setInt32(this.length, Number(value), true); this.length += 4; return;
      case "f32": this.reserve(4); this.view.setFloat32(this.length, Number(value), true); this.length += 4; return;
      case "f64": this.reserve(8); this.view.setFloat64(this.length, Number(value), true); this.length += 8; return;
      case "u64": this.reserve(8); this.view.setBigUint64(this.length, BigInt(value), true); this.length += 8; return;
      case "i64": this.reserve(8); this.view.setBigInt64(this.length, BigInt(value), true); this.length += 8; return;
      case "string": {
        const text = String(value);
        // UTF-8 takes at most 3 bytes per UTF-16 unit.
        this.reserve(8 + text.length * 3);
        const { written } = this.encoder.encodeInto(text, this.buf.subarray(this.length + 8));
        this.view.setBigUint64(this.length, BigInt(written), true);
        this.length += 8 + written;
        return;
      }
    }
  }

  zeros(n: number): void {
    this.reserve(n);
    this.buf.fill(0, this.length, this.length + n);
    this.length += n;
  }

  bytes(): Uint8Array {
    return this.buf.subarray(0, this.length);
  }
}

function checkValue(key: string, v: GgufValue): void {
  const integer = (n: number, lo: number, hi: number) => Number.isInteger(n) && n >= lo && n <= hi;
  const ranges: Partial<Record<GgufScalarType, [number, number]>> = {
    u8: [0, 0xff], i8: [-0x80, 0x7f], u16: [0, 0xffff], i16: [-0x8000, 0x7fff], u32: [0, 0xffffffff], i32: [-0x80000000, 0x7fffffff],
  };
  const scalarType = v.type === "array" ? v.of : v.type;
  const range = ranges[scalarType];
  if (!range) return;
  const values: ArrayLike<unknown> = v.type === "array" ? v.value : [v.value];
  for (let i = 0; i < values.length; i++) {
    if (!integer(values[i] as number, range[0], range[1])) throw new RangeError(`GGUF key ${key}: ${String(values[i])} is not a ${scalarType}`);
  }
}

/** GGUF's default alignment of the data section and of each tensor in it (no general.alignment key needed). */
const ALIGNMENT = 32;

function encodeHeader(metadata: GgufMetadata, tensors: readonly GgufTensorSpec[], offsets: readonly number[]): Uint8Array {
  const b = new ByteBuilder();
  b.scalar("u32", 0x46554747); // "GGUF" read as a little-endian u32
  b.scalar("u32", 3);
  b.scalar("u64", BigInt(tensors.length));
  b.scalar("u64", BigInt(metadata.length));
  for (const [key, v] of metadata) {
    checkValue(key, v);
    b.scalar("string", key);
    b.scalar("u32", GgufValueTypeId[v.type]);
    if (v.type === "array") {
      b.scalar("u32", GgufValueTypeId[v.of]);
      b.scalar("u64", BigInt(v.value.length));
      for (let i = 0; i < v.value.length; i++) b.scalar(v.of, v.value[i]!);
    } else b.scalar(v.type, v.value);
  }
  tensors.forEach((t, i) => {
    b.scalar("string", t.name);
    b.scalar("u32", t.ne.length);
    for (const n of t.ne) b.scalar("u64", BigInt(n));
    b.scalar("u32", GgmlType[t.type]);
    b.scalar("u64", BigInt(offsets[i]!));
  });
  b.zeros(padding(b.length));
  return b.bytes();
}

function padding(length: number): number {
  return (ALIGNMENT - (length % ALIGNMENT)) % ALIGNMENT;
}

/**
 * Writes one GGUF file: `open` writes the header, then `write` appends each tensor's bytes in the
 * order the tensors were declared (in as many pieces as the caller likes), and `close` checks that
 * every tensor got exactly its size.
 */
export class GgufWriter implements Disposable {
  private readonly sizes: number[];
  private readonly offsets: number[];
  private current = 0;
  private writtenInCurrent = 0;
  private filePosition: number;
  private fd: number | undefined;

  private constructor(readonly path: string, readonly tensors: readonly GgufTensorSpec[], metadata: GgufMetadata) {
    const names = new Set<string>();
    for (const t of tensors) {
      if (names.has(t.name)) throw new Error(`GGUF: tensor ${t.name} is declared twice`);
      names.add(t.name);
    }
    this.sizes = tensors.map((t) => ggmlTensorBytes(t.type, t.ne));
    this.offsets = [];
    let offset = 0;
    for (const size of this.sizes) {
      this.offsets.push(offset);
      offset += size + padding(size);
    }
    const header = encodeHeader(metadata, tensors, this.offsets);
    this.fd = openSync(path, "w");
    this.filePosition = 0;
    this.writeRaw(header);
    this.skipEmptyTensors();
  }

  /** Creates `path` (replacing it) and writes the header. */
  static open(path: string, metadata: GgufMetadata, tensors: readonly GgufTensorSpec[]): GgufWriter {
    return new GgufWriter(path, tensors, metadata);
  }

  /** Bytes written so far (the file's size once every tensor is written). */
  get bytesWritten(): number {
    return this.filePosition;
  }

  /** Appends bytes of the current tensor; a piece may not run past the tensor's end. */
  write(bytes: Uint8Array): void {
    const spec = this.tensors[this.current];
    if (!spec) throw new Error(`GGUF: ${bytes.length} bytes written after the last tensor`);
    const left = this.sizes[this.current]! - this.writtenInCurrent;
    if (bytes.length > left) throw new Error(`GGUF: tensor ${spec.name} takes ${this.sizes[this.current]} bytes; a write of ${bytes.length} runs ${bytes.length - left} past its end`);
    this.writeRaw(bytes);
    this.writtenInCurrent += bytes.length;
    if (this.writtenInCurrent === this.sizes[this.current]) {
      this.writeRaw(new Uint8Array(padding(this.writtenInCurrent)));
      this.current++;
      this.writtenInCurrent = 0;
      this.skipEmptyTensors();
    }
  }

  /** Closes the file; throws (after closing) when a tensor is still short of data. */
  close(): void {
    if (this.fd === undefined) return;
    closeSync(this.fd);
    this.fd = undefined;
    const spec = this.tensors[this.current];
    if (spec) throw new Error(`GGUF: closed with tensor ${spec.name} at ${this.writtenInCurrent} of ${this.sizes[this.current]} bytes (and ${this.tensors.length - this.current - 1} tensors after it unwritten)`);
  }

  [Symbol.dispose](): void {
    if (this.fd === undefined) return;
    closeSync(this.fd);
    this.fd = undefined;
  }

  private skipEmptyTensors(): void {
    while (this.current < this.tensors.length && this.sizes[this.current] === 0) this.current++;
  }

  private writeRaw(bytes: Uint8Array): void {
    if (this.fd === undefined) throw new Error("GGUF: write after close");
    let done = 0;
    while (done < bytes.length) done += writeSync(this.fd, bytes, done, bytes.length - done);
    this.filePosition += bytes.length;
  }
}
