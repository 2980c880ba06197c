/**
 * parseLlamaPerf and runLlamaPerf (scripts/lib/llama-perf.ts): llama.cpp's Vulkan perf-logger output,
 * which `profile:graph --llama-bench` prints beside its own table. The last block's groups (names
 * with ": " inside them too) and total; no block, or a block cut before its total, is no result.
 * Run against stand-in binaries: a block printed before a failing exit stands, with a warning; no
 * device is an error that says how llama.cpp takes a CPU device; a failure with no block is an error.
 */
import { afterAll, expect, test } from "bun:test";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseLlamaPerf, runLlamaPerf } from "../scripts/lib/llama-perf.ts";

const dir = mkdtempSync(join(tmpdir(), "vkmoe-llama-perf-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const capture = `ggml_vulkan: 0 = NVIDIA H100 80GB HBM3 (NVIDIA) | uma: 0 | fp16: 1
----------------
Vulkan Timings:
ADD: 2 x 9.5 us = 19 us
Total time: 19 us.
----------------
Vulkan Timings:
ADD: 1 x 5.12 us = 5.12 us
FLASH_ATTN_EXT dst(128,32,1,1),  q(128,1,32,1),  k(128,768,4,1),  v(128,768,4,1),  m(768,1,1,1): 7 x 13.184 us = 92.288 us (954.408 GFLOPS/s)
MUL_MAT_ID_VEC q4_K m=768 n=8 k=2048 n_expert=128, MUL_MAT_ID_VEC q4_K m=768 n=8 k=2048 n_expert=128: 8 x 17.632 us = 141.056 us (2853.87 GFLOPS/s)
Total time: 238.464 us.
| qwen3moe ?B Q4_K - Medium      |   3.21 GiB |     5.61 B | Vulkan     |  99 |   1 |      tg4 @ d512 |        568.50 ± 0.00 |
`;

test("the last block's groups and total", () => {
  const r = parseLlamaPerf(capture)!;
  expect(r.totalUs).toBe(238.464);
  expect(r.groups.map((g) => [g.count, g.meanUs, g.totalUs])).toEqual([[1, 5.12, 5.12], [7, 13.184, 92.288], [8, 17.632, 141.056]]);
  expect(r.groups[1]!.name).toBe("FLASH_ATTN_EXT dst(128,32,1,1),  q(128,1,32,1),  k(128,768,4,1),  v(128,768,4,1),  m(768,1,1,1)");
  expect(r.groups[2]!.name).toStartWith("MUL_MAT_ID_VEC q4_K m=768 n=8 k=2048 n_expert=128, MUL_MAT_ID_VEC");
});

test("no block, or a block without its total: no result", () => {
  expect(parseLlamaPerf("ggml_vulkan: No devices found.\n| model | size |")).toBeUndefined();
  expect(parseLlamaPerf("Vulkan Timings:\nADD: 1 x 5 us = 5 us\n")).toBeUndefined();
});

/** A stand-in llama-bench: prints `text` to stderr, exits with `code`. */
function standIn(name: string, text: string, code: number): string {
  const path = join(dir, name);
  writeFileSync(path, `#!/bin/sh\ncat >&2 <<'END'\n${text}\nEND\nexit ${code}\n`);
  chmodSync(path, 0o755);
  return path;
}
const run = (binary: string) => runLlamaPerf(binary, "model.gguf", { depth: 8, tokens: 1, log: () => {} });

test("a block printed before a failing exit stands, with a warning", () => {
  const r = run(standIn("crashes-at-exit", capture, 3));
  expect(r.error).toBeUndefined();
  expect(r.totalUs).toBe(238.464);
  expect(r.warning).toContain("exit 3");
});

test("no device: an error saying how llama.cpp takes a CPU device; a failure with no block: its exit and last lines", () => {
  expect(run(standIn("no-device", "ggml_vulkan: No devices found.", 0)).error).toContain("GGML_VK_VISIBLE_DEVICES");
  const failed = run(standIn("fails", "error: failed to load model", 1));
  expect(failed.error).toContain("exit 1");
  expect(failed.error).toContain("failed to load model");
  expect(failed.groups).toEqual([]);
});
