/**
 * Hugging Face safetensors checkpoints: a directory holding `model.safetensors`, or
 * `model.safetensors.index.json` and the shards it names, or a single .safetensors file. The
 * format is an 8-byte little-endian header length, a JSON header `{name: {dtype, shape,
 * data_offsets: [begin, end]}, __metadata__?}` and the data (offsets relative to its start); that
 * is simple enough to parse here over the mapped file, with every field checked.
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import type { MappedFile } from "../ffi/index.ts";
import { ModelFileError, ModelFileNotFoundError, TruncatedFileError, UnsupportedTensorTypeError } from "./errors.ts";
import { headerView, mapModelFile } from "./map.ts";
import type { SafetensorsFile, TensorDType, TensorView } from "./tensor.ts";

export const SINGLE_FILE = "model.safetensors";
export const INDEX_FILE = "model.safetensors.index.json";

/** The safetensors reference implementation refuses headers over 100 MB; a longer length means this is not a safetensors file. */
const MAX_HEADER_BYTES = 100_000_000;

const READABLE: Partial<Record<string, { dtype: TensorDType; bytes: number }>> = {
  F32: { dtype: "F32", bytes: 4 },
  F16: { dtype: "F16", bytes: 2 },
  BF16: { dtype: "BF16", bytes: 2 },
};
const READABLE_NAMES = Object.keys(READABLE).join(", ");

/**
 * Opens a checkpoint directory (or one .safetensors file) and maps every file of it. Throws
 * ModelFileError (or a subclass) naming the file, and the tensor where one is at fault.
 */
export function openSafetensors(path: string): SafetensorsFile {
  if (!existsSync(path)) throw new ModelFileNotFoundError(path, "does not exist");
  const files = statSync(path).isDirectory() ? shardsOf(path) : { paths: [path], weightMap: undefined, index: undefined };
  const mapped: Shard[] = [];
  try {
    for (const file of files.paths) mapped.push(parseShard(mapModelFile(file, "a .safetensors file")));
    return new Safetensors(mapped, mergeTensors(mapped, files.weightMap, files.index));
  } catch (e) {
    for (const shard of mapped) shard.file[Symbol.dispose]();
    throw e;
  }
}

interface ShardList {
  paths: string[];
  /** The index's tensor → shard file name, to check against what the shards hold. */
  weightMap: Record<string, string> | undefined;
  index: string | undefined;
}

function shardsOf(dir: string): ShardList {
  const single = join(dir, SINGLE_FILE);
  // transformers loads model.safetensors when both are present; so do we.
  if (existsSync(single)) return { paths: [single], weightMap: undefined, index: undefined };
  const index = join(dir, INDEX_FILE);
  if (!existsSync(index)) throw new ModelFileNotFoundError(dir, `no ${SINGLE_FILE} or ${INDEX_FILE} in this directory`);
  const weightMap = readWeightMap(index);
  const names = [...new Set(Object.values(weightMap))];
  for (const name of names) {
    if (!existsSync(join(dir, name))) throw new ModelFileNotFoundError(index, `names shard "${name}", which is missing from ${dir}`);
  }
  return { paths: names.map((n) => join(dir, n)), weightMap, index };
}

function readWeightMap(index: string): Record<string, string> {
  let json: unknown;
  try {
    json = JSON.parse(readFileSync(index, "utf8"));
  } catch (e) {
    throw new ModelFileError(index, `is not valid JSON: ${(e as Error).message}`, { cause: e });
  }
  const weightMap = (json as { weight_map?: unknown } | null)?.weight_map;
  const valid = typeof weightMap === "object" && weightMap !== null && Object.values(weightMap).every((v) => typeof v === "string" && v === basename(v) && v !== "");
  if (!valid) throw new ModelFileError(index, 'has no "weight_map" of tensor names to shard file names in this directory');
  return weightMap as Record<string, string>;
}

interface Shard {
  file: MappedFile;
  tensors: Map<string, TensorView>;
  metadata: Record<string, string>;
}

interface HeaderEntry {
  dtype?: unknown;
  shape?: unknown;
  data_offsets?: unknown;
}

function parseShard(file: MappedFile): Shard {
  const path = file.path;
  if (file.byteLength < 8) throw new TruncatedFileError(path, `is ${file.byteLength} bytes, shorter than the 8-byte header length that starts a safetensors file`);
  const bytes = headerView(file);
  const headerLength = new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true);
  if (headerLength > BigInt(MAX_HEADER_BYTES)) {
    throw new ModelFileError(path, `is not a safetensors file: its first 8 bytes give a header length of ${headerLength}, beyond the format's ${MAX_HEADER_BYTES}-byte limit`);
  }
  const dataStart = 8 + Number(headerLength);
  if (dataStart > file.byteLength) {
    throw new TruncatedFileError(path, `the header is ${headerLength} bytes but the file has only ${file.byteLength - 8} after the length: the file is truncated (an interrupted download?)`);
  }
  const header = parseHeaderJson(bytes.subarray(8, dataStart), path);
  const { __metadata__: rawMetadata, ...entries } = header;
  const dataLength = file.byteLength - dataStart;

  const named = Object.entries(entries).map(([name, entry]) => ({ name, entry: checkEntry(entry, name, path) }));
  rejectUnreadableTypes(named, path);

  const tensors = new Map<string, TensorView>();
  for (const { name, entry } of named) {
    const { dtype, bytes: itemBytes } = READABLE[entry.dtype]!;
    const [begin, end] = entry.offsets;
    const where = `tensor "${name}" (${entry.dtype} [${entry.shape.join(", ")}])`;
    if (end > dataLength) {
      throw new TruncatedFileError(path, `${where} needs data bytes ${begin}..${end} but the file holds ${dataLength}: the file is truncated (an interrupted download?)`, { tensor: name });
    }
    const expected = entry.shape.reduce((a, b) => a * b, 1) * itemBytes;
    if (end - begin !== expected) {
      throw new ModelFileError(path, `${where} has data_offsets [${begin}, ${end}], ${end - begin} bytes, but its shape and dtype make ${expected}`, { tensor: name });
    }
    tensors.set(name, { name, dtype, shape: entry.shape, bytes: file.view(dataStart + begin, end - begin), release: () => file.release(dataStart + begin, end - begin) });
  }
  return { file, tensors, metadata: checkMetadata(rawMetadata, path) };
}

function parseHeaderJson(bytes: Uint8Array, path: string): Record<string, unknown> {
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    throw new ModelFileError(path, `the header is not valid JSON (${(e as Error).message}): the file is corrupt or not safetensors`, { cause: e });
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    throw new ModelFileError(path, "the header is JSON but not an object of tensors: the file is corrupt or not safetensors");
  }
  return header as Record<string, unknown>;
}

interface CheckedEntry {
  dtype: string;
  shape: number[];
  offsets: [number, number];
}

const isCount = (v: unknown): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= 0;

function checkEntry(raw: unknown, name: string, path: string): CheckedEntry {
  const entry = (typeof raw === "object" && raw !== null ? raw : {}) as HeaderEntry;
  const { dtype, shape, data_offsets: offsets } = entry;
  const bad = (what: string) => new ModelFileError(path, `tensor "${name}" has ${what} in the header: the file is corrupt`, { tensor: name });
  if (typeof dtype !== "string") throw bad("no dtype string");
  if (!Array.isArray(shape) || !shape.every(isCount)) throw bad(`shape ${JSON.stringify(shape)}, not a list of sizes`);
  if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isCount) || offsets[0] > offsets[1]) {
    throw bad(`data_offsets ${JSON.stringify(offsets)}, not [begin, end] with begin <= end`);
  }
  return { dtype, shape, offsets: [offsets[0], offsets[1]] };
}

function rejectUnreadableTypes(named: readonly { name: string; entry: CheckedEntry }[], path: string): void {
  const unreadable = named.filter(({ entry }) => !READABLE[entry.dtype]);
  if (unreadable.length === 0) return;
  const first = unreadable[0]!;
  const counts = new Map<string, number>();
  for (const { entry } of unreadable) counts.set(entry.dtype, (counts.get(entry.dtype) ?? 0) + 1);
  const all = [...counts].map(([dtype, n]) => `${n} ${dtype}`).join(", ");
  throw new UnsupportedTensorTypeError(path, first.name, first.entry.dtype,
    `tensor "${first.name}" has dtype ${first.entry.dtype} (unreadable tensors: ${all}); vkmoe reads ${READABLE_NAMES} from safetensors`);
}

function checkMetadata(raw: unknown, path: string): Record<string, string> {
  if (raw === undefined) return {};
  const valid = typeof raw === "object" && raw !== null && !Array.isArray(raw) && Object.values(raw).every((v) => typeof v === "string");
  if (!valid) throw new ModelFileError(path, 'the header\'s "__metadata__" is not a map of strings: the file is corrupt');
  return raw as Record<string, string>;
}

/** Every shard's tensors in one map, checked against the index when there is one. */
function mergeTensors(shards: readonly Shard[], weightMap: Record<string, string> | undefined, index: string | undefined): Map<string, TensorView> {
  const all = new Map<string, TensorView>();
  const home = new Map<string, string>();
  for (const shard of shards) {
    for (const [name, view] of shard.tensors) {
      const other = home.get(name);
      if (other) throw new ModelFileError(shard.file.path, `tensor "${name}" is also in ${other}: a checkpoint holds each tensor once`, { tensor: name });
      all.set(name, view);
      home.set(name, shard.file.path);
    }
  }
  if (weightMap && index) {
    for (const [name, shardName] of Object.entries(weightMap)) {
      const found = home.get(name);
      if (!found || basename(found) !== shardName) {
        throw new ModelFileError(index, `says tensor "${name}" is in ${shardName}, but ${found ? `it is in ${basename(found)}` : "no shard holds it"}`, { tensor: name });
      }
    }
  }
  return all;
}

class Safetensors implements SafetensorsFile {
  readonly format = "safetensors" as const;
  readonly files: readonly string[];
  readonly metadata: Readonly<Record<string, string>>;
  readonly mappedBytes: number;

  constructor(private readonly shards: Shard[], private readonly views: Map<string, TensorView>) {
    this.files = shards.map((s) => s.file.path);
    this.metadata = Object.freeze(Object.assign({}, ...shards.map((s) => s.metadata)));
    this.mappedBytes = shards.reduce((sum, s) => sum + s.file.byteLength, 0);
  }

  get tensors(): ReadonlyMap<string, TensorView> {
    return this.views;
  }

  [Symbol.dispose](): void {
    // Emptied so that a lookup after dispose finds nothing rather than a view of unmapped pages.
    this.views.clear();
    for (const shard of this.shards) shard.file[Symbol.dispose]();
  }
}

