/**
 * A declarative C struct layout: fields in declaration order, natural C alignment (x86-64 / arm64
 * LP64 rules), nested structs and fixed arrays. Offsets and sizes follow from the description; the
 * writer checks every value's type and range before a byte reaches C. test/layout.test.ts proves
 * every registered layout against the C compiler's view of vulkan_core.h.
 */
import { VkmoeError } from "../errors.ts";

export class LayoutError extends VkmoeError {
  constructor(message: string) {
    super("LAYOUT", message);
  }
}

export type Scalar = "u8" | "u16" | "u32" | "i32" | "f32" | "u64" | "i64" | "ptr" | "size";

interface ScalarInfo {
  size: number;
  wide: boolean;
}
const SCALARS: Record<Scalar, ScalarInfo> = {
  u8: { size: 1, wide: false },
  u16: { size: 2, wide: false },
  u32: { size: 4, wide: false },
  i32: { size: 4, wide: false },
  f32: { size: 4, wide: false },
  u64: { size: 8, wide: true },
  i64: { size: 8, wide: true },
  ptr: { size: 8, wide: true },
  size: { size: 8, wide: true },
};

export interface ArrayType {
  readonly kind: "array";
  readonly of: Scalar | StructLayout;
  readonly length: number;
}
/** `char name[N]`: written from and read as a string. */
export interface CharsType {
  readonly kind: "chars";
  readonly length: number;
}
export type FieldType = Scalar | ArrayType | CharsType | StructLayout;

export const array = (of: Scalar | StructLayout, length: number): ArrayType => ({ kind: "array", of, length });
export const chars = (length: number): CharsType => ({ kind: "chars", length });

export interface Field {
  readonly name: string;
  readonly type: FieldType;
  readonly offset: number;
  readonly size: number;
}

function sizeAlign(t: FieldType): { size: number; align: number } {
  if (typeof t === "string") return { size: SCALARS[t].size, align: SCALARS[t].size };
  if (t instanceof StructLayout) return { size: t.size, align: t.align };
  if (t.kind === "chars") return { size: t.length, align: 1 };
  const e = sizeAlign(t.of);
  return { size: e.size * t.length, align: e.align };
}

const alignUp = (n: number, a: number) => Math.ceil(n / a) * a;

export type Values = Record<string, unknown>;

export class StructLayout {
  readonly name: string;
  readonly fields: readonly Field[];
  readonly size: number;
  readonly align: number;
  private readonly byName: Map<string, Field>;
  /** Values written whenever the struct is written (sType), unless the caller overrides them. */
  readonly defaults: Values;

  constructor(name: string, spec: Record<string, FieldType>, defaults: Values = {}) {
    this.name = name;
    let offset = 0;
    let align = 1;
    const fields: Field[] = [];
    for (const [fieldName, type] of Object.entries(spec)) {
      const sa = sizeAlign(type);
      offset = alignUp(offset, sa.align);
      fields.push({ name: fieldName, type, offset, size: sa.size });
      offset += sa.size;
      align = Math.max(align, sa.align);
    }
    this.fields = fields;
    this.align = align;
    this.size = alignUp(offset, align);
    this.byName = new Map(fields.map((f) => [f.name, f]));
    this.defaults = defaults;
  }

  field(name: string): Field {
    const f = this.byName.get(name);
    if (!f) throw new LayoutError(`${this.name} has no field '${name}'`);
    return f;
  }

  offsetOf(name: string): number {
    return this.field(name).offset;
  }

  /**
   * Writes `values` (and the defaults) at `offset`. Fields not named keep their bytes, which the
   * arena keeps zeroed, so callers describe only what they set. Throws LayoutError on an unknown
   * field, a wrong type, an out-of-range number or an over-long array, before writing anything.
   */
  write(view: DataView, offset: number, values: Values): void {
    if (offset < 0 || offset + this.size > view.byteLength) {
      throw new LayoutError(`${this.name} (${this.size} bytes) does not fit at offset ${offset} of ${view.byteLength}`);
    }
    const all = { ...this.defaults, ...values };
    for (const [name, value] of Object.entries(all)) this.check(this.field(name), value, `${this.name}.${name}`);
    for (const [name, value] of Object.entries(all)) writeField(view, offset, this.field(name), value);
  }

  read(view: DataView, offset: number): Values {
    const out: Values = {};
    for (const f of this.fields) out[f.name] = readType(view, offset + f.offset, f.type);
    return out;
  }

  private check(f: Field, value: unknown, path: string): void {
    checkType(f.type, value, path);
  }
}

function checkScalar(t: Scalar, v: unknown, path: string): void {
  if (SCALARS[t].wide) {
    if (typeof v !== "bigint") throw new LayoutError(`${path}: expected a bigint (${t}), got ${typeof v}`);
    const signed = t === "i64";
    const lo = signed ? -(1n << 63n) : 0n;
    const hi = signed ? (1n << 63n) - 1n : (1n << 64n) - 1n;
    if (v < lo || v > hi) throw new LayoutError(`${path}: ${v} out of range for ${t}`);
    return;
  }
  if (typeof v !== "number") throw new LayoutError(`${path}: expected a number (${t}), got ${typeof v}`);
  if (t === "f32") {
    return;
  }
  if (!Number.isInteger(v)) throw new LayoutError(`${path}: expected an integer (${t}), got ${v}`);
  const ranges: Record<string, [number, number]> = {
    u8: [0, 0xff],
    u16: [0, 0xffff],
    u32: [0, 0xffffffff],
    i32: [-0x80000000, 0x7fffffff],
  };
  const [lo, hi] = ranges[t]!;
  if (v < lo || v > hi) throw new LayoutError(`${path}: ${v} out of range for ${t}`);
}

function checkType(t: FieldType, v: unknown, path: string): void {
  if (typeof t === "string") return checkScalar(t, v, path);
  if (t instanceof StructLayout) {
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new LayoutError(`${path}: expected an object (${t.name})`);
    for (const [k, x] of Object.entries({ ...t.defaults, ...(v as Values) })) checkType(t.field(k).type, x, `${path}.${k}`);
    return;
  }
  if (t.kind === "chars") {
    if (typeof v !== "string") throw new LayoutError(`${path}: expected a string`);
    if (new TextEncoder().encode(v).length >= t.length) throw new LayoutError(`${path}: string longer than ${t.length - 1} bytes`);
    return;
  }
  if (!Array.isArray(v) && !ArrayBuffer.isView(v)) throw new LayoutError(`${path}: expected an array of ${t.length}`);
  const items = v as ArrayLike<unknown>;
  if (items.length > t.length) throw new LayoutError(`${path}: ${items.length} elements exceed the array length ${t.length}`);
  for (let i = 0; i < items.length; i++) checkType(t.of, items[i], `${path}[${i}]`);
}

function writeScalar(view: DataView, at: number, t: Scalar, v: any): void {
  switch (t) {
    case "u8": return view.setUint8(at, v);
    case "u16": return view.setUint16(at, v, true);
    case "u32": return view.setUint32(at, v, true);
    case "i32": return view.setInt32(at, v, true);
    case "f32": return view.setFloat32(at, v, true);
    case "i64": return view.setBigInt64(at, v, true);
    default: return view.setBigUint64(at, v, true);
  }
}

function writeType(view: DataView, at: number, t: FieldType, v: any): void {
  if (typeof t === "string") return writeScalar(view, at, t, v);
  if (t instanceof StructLayout) {
    for (const [k, x] of Object.entries({ ...t.defaults, ...v })) writeField(view, at, t.field(k), x);
    return;
  }
  if (t.kind === "chars") {
    const bytes = new TextEncoder().encode(v);
    new Uint8Array(view.buffer, view.byteOffset + at, t.length).fill(0).set(bytes);
    return;
  }
  const step = sizeAlign(t.of).size;
  for (let i = 0; i < v.length; i++) writeType(view, at + i * step, t.of, v[i]);
}

function writeField(view: DataView, base: number, f: Field, v: unknown): void {
  writeType(view, base + f.offset, f.type, v);
}

function readType(view: DataView, at: number, t: FieldType): unknown {
  if (typeof t === "string") {
    switch (t) {
      case "u8": return view.getUint8(at);
      case "u16": return view.getUint16(at, true);
      case "u32": return view.getUint32(at, true);
      case "i32": return view.getInt32(at, true);
      case "f32": return view.getFloat32(at, true);
      case "i64": return view.getBigInt64(at, true);
      default: return view.getBigUint64(at, true);
    }
  }
  if (t instanceof StructLayout) return t.read(view, at);
  if (t.kind === "chars") {
    const bytes = new Uint8Array(view.buffer, view.byteOffset + at, t.length);
    const end = bytes.indexOf(0);
    return new TextDecoder().decode(bytes.subarray(0, end < 0 ? t.length : end));
  }
  const step = sizeAlign(t.of).size;
  return Array.from({ length: t.length }, (_, i) => readType(view, at + i * step, t.of));
}

/** Every layout declared through `struct()`, so the layout test checks new ones automatically. */
export const registry = new Map<string, StructLayout>();

export function struct(name: string, spec: Record<string, FieldType>, defaults: Values = {}): StructLayout {
  const layout = new StructLayout(name, spec, defaults);
  if (registry.has(name)) throw new LayoutError(`struct ${name} declared twice`);
  registry.set(name, layout);
  return layout;
}
