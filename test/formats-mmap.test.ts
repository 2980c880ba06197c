/** mapFile: read-only maps through libc, for empty files, ordinary ones and ones past 4 GiB, and its errors. */
import { afterAll, describe, expect, test } from "bun:test";
import { chmodSync, closeSync, existsSync, ftruncateSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FileMapError, mapFile } from "../src/ffi/index.ts";
import { fixture } from "./support/fixtures.ts";
import { repoRoot } from "./support/paths.ts";

const scratch = mkdtempSync(join(tmpdir(), "vkmoe-mmap-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

describe("mapFile", () => {
  test("a fixture maps byte for byte as node:fs reads it, views share the mapping", () => {
    const path = fixture("qwen3-moe-tiny.Q4_0.gguf");
    if (!path) return;
    using file = mapFile(path);
    const disk = readFileSync(path);
    expect(file.path).toBe(path);
    expect(file.byteLength).toBe(disk.byteLength);
    expect(Buffer.from(file.bytes).equals(disk)).toBe(true);
    const middle = file.view(1_000_003, 77);
    expect(middle.buffer).toBe(file.bytes.buffer);
    expect(Array.from(middle)).toEqual(Array.from(disk.subarray(1_000_003, 1_000_080)));
    expect(() => file.view(disk.byteLength - 1, 2)).toThrow(RangeError);
  });

  test("release() drops read pages from the process (RssFile) and the view still reads the same bytes", () => {
    const rssFileKb = () => Number(/RssFile:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))?.[1] ?? NaN);
    if (Number.isNaN(rssFileKb())) return console.warn("skipping: no /proc/self/status RssFile (not Linux)");
    const path = join(scratch, "release");
    const data = new Uint8Array(64 << 20).map((_, i) => (i * 2654435761) >>> 24);
    writeFileSync(path, data);
    using file = mapFile(path);
    const sum = (b: Uint8Array) => {
      let s = 0;
      for (let i = 0; i < b.length; i += 512) s += b[i]!;
      return s;
    };
    const before = rssFileKb();
    const first = sum(file.bytes);
    const touched = rssFileKb();
    expect(touched - before).toBeGreaterThan(60 << 10);
    file.release(0, file.byteLength);
    expect(touched - rssFileKb()).toBeGreaterThan(60 << 10);
    expect(sum(file.bytes)).toBe(first);
    expect(sum(file.bytes)).toBe(sum(data));
  });

  test("a 0-byte file is an empty view", () => {
    const path = join(scratch, "empty");
    writeFileSync(path, "");
    using file = mapFile(path);
    expect(file.byteLength).toBe(0);
    expect(file.bytes.byteLength).toBe(0);
    expect(file.view(0, 0).byteLength).toBe(0);
  });

  test("past 4 GiB: views at any offset; the whole-file view is refused (Bun's ArrayBuffer limit)", () => {
    const path = join(scratch, "sparse-5g");
    const size = 5 * 2 ** 30;
    const fd = openSync(path, "w");
    ftruncateSync(fd, size); // sparse: no disk space used
    const put = (text: string, at: number) => writeSync(fd, new TextEncoder().encode(text), 0, text.length, at);
    put("head", 0);
    put("past4G", 2 ** 32 + 10);
    put("tail", size - 4);
    closeSync(fd);
    using file = mapFile(path);
    expect(file.byteLength).toBe(size);
    const text = (offset: number, n: number) => new TextDecoder().decode(file.view(offset, n));
    expect(text(0, 4)).toBe("head");
    expect(text(2 ** 32 + 10, 6)).toBe("past4G");
    expect(text(size - 4, 4)).toBe("tail");
    expect(() => file.bytes).toThrow(`${path} is ${size} bytes: one ArrayBuffer holds at most 4 GiB under Bun; use view(offset, length)`);
  });

  test("dispose unmaps once; views are refused afterwards", () => {
    const path = join(scratch, "small");
    writeFileSync(path, "abc");
    const file = mapFile(path);
    expect(new TextDecoder().decode(file.bytes)).toBe("abc");
    file[Symbol.dispose]();
    file[Symbol.dispose]();
    expect(() => file.view(0, 1)).toThrow(`${path} was unmapped`);
  });

  test("a missing file: FileMapError naming the path and ENOENT", () => {
    const path = join(scratch, "missing");
    let error: FileMapError | undefined;
    try {
      mapFile(path);
    } catch (e) {
      error = e as FileMapError;
    }
    expect(error).toBeInstanceOf(FileMapError);
    expect(error!.code).toBe("FILE_MAP");
    expect(error!.errnoName).toBe("ENOENT");
    expect(error!.message).toBe(`cannot map ${path}: No such file or directory (ENOENT) in open()`);
  });

  test("a directory: FileMapError saying so", () => {
    const dir = join(scratch, "dir");
    mkdirSync(dir);
    expect(() => mapFile(dir)).toThrow(FileMapError);
    expect(() => mapFile(dir)).toThrow(`cannot map ${dir}: it is a directory, not a file`);
  });

  test("no permission: FileMapError naming the path and EACCES", () => {
    const path = join(scratch, "secret");
    writeFileSync(path, "x");
    chmodSync(path, 0o000);
    const expected = `cannot map ${path}: Permission denied (EACCES) in open()`;
    if (process.getuid?.() !== 0) {
      expect(() => mapFile(path)).toThrow(expected);
      return;
    }
    // root reads any file: try as nobody instead, where setpriv can drop to it
    if (!existsSync("/usr/bin/setpriv")) return void console.warn("skipping: running as root without setpriv to drop privileges");
    chmodSync(scratch, 0o755);
    const script = `import { mapFile } from ${JSON.stringify(join(repoRoot, "src/ffi/index.ts"))};
      try { mapFile(${JSON.stringify(path)}); console.log("mapped"); } catch (e) { console.log(e.name + ": " + e.message); }`;
    const child = Bun.spawnSync(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", process.execPath, "-e", script]);
    const out = child.stdout.toString().trim();
    if (out === "" && child.stderr.toString().includes("ermission")) return void console.warn(`skipping: nobody cannot run ${process.execPath} or read the repo`);
    expect(out).toBe(`FileMapError: ${expected}`);
  });
});
