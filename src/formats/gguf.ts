/**
 * GGUF files (llama.cpp's format, v3 and v2): the header parsed from the mapped file, each tensor
 * a view into its data. Types vkmoe reads: TENSOR_DTYPES (floats, Q8_0, Q4_0 and GGML's Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K, Q6_K blocks); a file holding any other is refused at open, naming its first such tensor.
 */
import type { MappedFile } from "../ffi/index.ts";
import { ModelFileError, TruncatedFileError, UnsupportedTensorTypeError } from "./errors.ts";
import { ggmlTypeName, readableGgmlType } from "./ggml-types.ts";
import { parseGgufHeader, type GgufHeader, type GgufTensorInfo, type GgufValue } from "./gguf-header.ts";
import { headerView, mapModelFile } from "./map.ts";
import { TENSOR_DTYPES, type GgufFile, type TensorView } from "./tensor.ts";

/** Opens and maps a GGUF file. Throws ModelFileError (or a subclass) naming the file, and the tensor where one is at fault. */
export async function openGguf(path: string): Promise<GgufFile> {
  const file = mapModelFile(path, "a .gguf file");
  try {
    const header = parseGgufHeader(headerView(file), path);
    rejectUnreadableTypes(header.tensors, path);
    return new Gguf(file, header, tensorViews(file, header));
  } catch (e) {
    file[Symbol.dispose]();
    throw e;
  }
}

function rejectUnreadableTypes(tensors: readonly GgufTensorInfo[], path: string): void {
  const unreadable = tensors.filter((t) => !readableGgmlType(t.type));
  if (unreadable.length === 0) return;
  const first = unreadable[0]!;
  const counts = new Map<string, number>();
  for (const t of unreadable) counts.set(ggmlTypeName(t.type), (counts.get(ggmlTypeName(t.type)) ?? 0) + 1);
  const all = [...counts].map(([name, n]) => `${n} ${name}`).join(", ");
  const name = ggmlTypeName(first.type);
  throw new UnsupportedTensorTypeError(path, first.name, name,
    `tensor "${first.name}" is ${name} (unreadable tensors: ${all}); vkmoe reads ${TENSOR_DTYPES.join(", ")}: requantize with llama-quantize to Q8_0 or Q4_0`);
}

function tensorViews(file: MappedFile, header: GgufHeader): Map<string, TensorView> {
  const path = file.path;
  const views = new Map<string, TensorView>();
  for (const info of header.tensors) {
    const encoding = readableGgmlType(info.type)!;
    const shape = [...info.ne].reverse();
    const where = `tensor "${info.name}" (${encoding.dtype} [${shape.join(", ")}])`;
    if (views.has(info.name)) throw new ModelFileError(path, `tensor "${info.name}" appears twice in the header`, { tensor: info.name });
    const rowLength = info.ne[0] ?? 1;
    if (rowLength % encoding.blockElements !== 0) {
      throw new ModelFileError(path, `${where} has rows of ${rowLength} elements, not a multiple of the ${encoding.blockElements}-element ${encoding.dtype} block`, { tensor: info.name });
    }
    const elements = info.ne.reduce((a, b) => a * b, 1);
    const byteLength = (elements / encoding.blockElements) * encoding.blockBytes;
    const start = header.dataOffset + info.offset;
    if (!Number.isSafeInteger(byteLength) || !Number.isSafeInteger(start + byteLength)) {
      throw new ModelFileError(path, `${where} is too large to address: the header is corrupt`, { tensor: info.name });
    }
    if (start + byteLength > file.byteLength) {
      throw new TruncatedFileError(path,
        `${where} needs bytes ${start}..${start + byteLength} but the file ends at ${file.byteLength}: the file is truncated (an interrupted download?)`, { tensor: info.name });
    }
    views.set(info.name, { name: info.name, dtype: encoding.dtype, shape, bytes: file.view(start, byteLength), release: () => file.release(start, byteLength) });
  }
  return views;
}

/** u64/i64 values as numbers where they are exact (counts, ids); larger ones stay bigint. */
function friendly(value: GgufValue): unknown {
  if (typeof value === "bigint") return Number.isSafeInteger(Number(value)) ? Number(value) : value;
  if (Array.isArray(value)) return value.length > 0 && typeof value[0] === "bigint" ? value.map(friendly) : value;
  return value;
}

class Gguf implements GgufFile {
  readonly format = "gguf" as const;
  readonly version: number;
  readonly metadata: Readonly<Record<string, unknown>>;
  readonly mappedBytes: number;
  private readonly views: Map<string, TensorView>;

  constructor(private readonly file: MappedFile, header: GgufHeader, views: Map<string, TensorView>) {
    this.version = header.version;
    this.metadata = Object.freeze(Object.fromEntries(Object.entries(header.metadata).map(([k, v]) => [k, friendly(v)])));
    this.mappedBytes = file.byteLength;
    this.views = views;
  }

  get tensors(): ReadonlyMap<string, TensorView> {
    return this.views;
  }

  [Symbol.dispose](): void {
    // Emptied so that a lookup after dispose finds nothing rather than a view of unmapped pages.
    this.views.clear();
    this.file[Symbol.dispose]();
  }
}
