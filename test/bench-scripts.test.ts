/**
 * The benchmark, profiling and checking scripts the README's and docs/measurements.md's figures come from run
 * to the end on this driver with their smallest options, and print every row they promise: a script
 * broken by a change elsewhere is caught here, not in the next session on a borrowed GPU. Their
 * figures on a CPU device (Lavapipe in CI) mean nothing and are not checked; the K-quant model is
 * the committed test/fixtures/kquant-model file.
 */
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { repoRoot } from "./support/paths.ts";

const BUN = `${repoRoot}node_modules/.bin/bun`;
const KQUANT = "test/fixtures/kquant-model/random-qwen3moe.Q4_K_M.gguf";
/** A test's own bound (a few seconds each on Lavapipe; the child's spawn timeout is below it). */
const SCRIPT_TIMEOUT_MS = 300_000;

function script(args: string[], env: Record<string, string> = {}): { code: number; out: string } {
  const r = Bun.spawnSync({ cmd: [BUN, ...args], cwd: repoRoot, env: { ...(process.env as Record<string, string>), ...env }, stdout: "pipe", stderr: "pipe", timeout: 240_000 });
  return { code: r.exitCode ?? -1, out: `${r.stdout.toString()}${r.stderr.toString()}` };
}

describe("benchmark scripts run to the end", () => {
  test("bench:barrier --steps 2 prints every row, the norm after each dispatch it pairs with", () => {
    const { code, out } = script(["scripts/bench-barrier.ts", "--steps", "2"]);
    expect(code).toBe(0);
    for (const row of ["| dependent (a compute barrier after each)", "the barrier's writes made visible to reads only", "a buffer barrier on the one buffer written", "ordered by an execution-only barrier", "another descriptor set every step", "a dispatch of 2048 workgroups", "a streaming read of 4 MiB",
      "evicts the last-level cache", "the same read with Nontemporal loads", "a 16-byte word read every 64 KiB", "a 16-byte word read every 2 MiB", "the address translations both evicted", "after both",
      "one float of a 2048-float row written by each of 2048 workgroups", "2 floats of a 2048-float row written by each of 1024 workgroups", "8 floats (32 bytes) of a 2048-float row", "the quantizing norm step:"]) {
      expect(out).toContain(row);
    }
    expect(out).not.toContain("NaN");
  }, SCRIPT_TIMEOUT_MS);

  test("bench:spin --steps 4 --groups 1,8: a row per workgroup count, the barrier and spinning forms' final rows equal", () => {
    const { code, out } = script(["scripts/bench-spin.ts", "--steps", "4", "--groups", "1,8"]);
    expect(code).toBe(0);
    expect(out).toContain("| workgroups a step | µs a step, barrier | µs a step, spin |");
    for (const g of [1, 8]) expect(out).toMatch(new RegExp(`\\| ${g} \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+x \\| yes \\|`));
    expect(out).not.toContain("NaN");
  }, SCRIPT_TIMEOUT_MS);

  test("bench:delta-rule --tokens 70: the chunked kernel and the two passes on one row, their results equal within 1e-9", () => {
    const { code, out } = script(["scripts/bench-delta-rule.ts", "--tokens", "70", "--reps", "1"]);
    expect(code).toBe(0);
    const row = out.split("\n").find((l) => l.startsWith("| 70 |"));
    expect(row).toBeDefined();
    const [, , , , , outNmse, stateNmse] = row!.split("|").map((c) => c.trim());
    expect(Number(outNmse)).toBeLessThanOrEqual(1e-9);
    expect(Number(stateNmse)).toBeLessThanOrEqual(1e-9);
  }, SCRIPT_TIMEOUT_MS);

  test("bench:moe-ggml --quick: the decode experts' rows, the graph's call beside them", () => {
    const { code, out } = script(["scripts/bench-moe-ggml.ts", "--quick", "--no-q4", "--calls", "1"]);
    expect(code).toBe(0);
    expect(out).toMatch(/\| Qwen3-30B-A3B D2048 I768 E\d+ +\| Q4_K, Q6_K +\| +1 \|/);
    expect(out).toMatch(/\| Qwen3-30B-A3B D2048 I768 E\d+ +\| Q4_K, Q6_K +\| +4 \|/);
  }, SCRIPT_TIMEOUT_MS);

  test("bench:moe-ggml --rows-per-lane out of range: one usage error, no stack trace", () => {
    const { code, out } = script(["scripts/bench-moe-ggml.ts", "--quick", "--rows-per-lane", "5"]);
    expect(code).not.toBe(0);
    expect(out).toContain("--rows-per-lane");
    expect(out).not.toContain("    at ");
  }, SCRIPT_TIMEOUT_MS);

  test("profile:graph on a K-quant file: a decode token and a prompt chunk split by op", () => {
    for (const extra of [[], ["--tokens", "8"]]) {
      const { code, out } = script(["scripts/profile-graph.ts", "--model", KQUANT, "--context", "16", "--warm", "2", ...extra], { VKMOE_GRAPH: "on" });
      expect(code).toBe(0);
      for (const op of ["| input norm", "| q, k, v", "| o |", "| lm_head", extra.length ? "| experts: gate+up" : "| experts: down + sum"]) expect(out).toContain(op);
    }
  }, SCRIPT_TIMEOUT_MS);

  test("profile:graph --llama-bench: llama.cpp's own GPU time by op on the same file beside the table", () => {
    const llamaBench = `${(process.env.LLAMA_CPP_DIR as string | undefined) ?? "/tmp/llama/llama-vk"}/llama-bench`;
    if (!existsSync(llamaBench)) {
      console.warn(`skipping profile:graph --llama-bench: ${llamaBench} not found (unpack ../shared/tools/peer as its README says)`);
      return;
    }
    // llama.cpp's Vulkan backend takes a CPU device (Lavapipe) only when named
    const { code, out } = script(["scripts/profile-graph.ts", "--model", KQUANT, "--context", "16", "--warm", "2", "--reps", "1", "--llama-bench", llamaBench], { VKMOE_GRAPH: "on", GGML_VK_VISIBLE_DEVICES: "0" });
    expect(code).toBe(0);
    expect(out).toContain("| llama.cpp group | runs | µs each | µs |");
    expect(out).toMatch(/\| MUL_MAT_ID[^|]*\| \d+ \| [\d.]+ \| \d+ \|/);
    expect(out).toMatch(/GPU time, vkmoe \/ llama.cpp: [\d.]+x/);
  }, SCRIPT_TIMEOUT_MS);

  test("profile:graph --llama-bench naming no file: one usage error before the model loads", () => {
    const { code, out } = script(["scripts/profile-graph.ts", "--model", KQUANT, "--llama-bench", "/nonexistent/llama-bench"]);
    expect(code).not.toBe(0);
    expect(out).toContain("--llama-bench: no file /nonexistent/llama-bench");
    expect(out).not.toContain("    at ");
  }, SCRIPT_TIMEOUT_MS);

  test("bench:attention --long: the 64-query calls' rows (dec_attention_cm's where the device has cooperative matrices)", () => {
    const { code, out } = script(["scripts/bench-attention.ts", "--long", "--shape", "30b", "--tokens", "65", "--calls", "1", "--layers", "1", "--reps", "1"]);
    expect(code).toBe(0);
    expect(out).toMatch(/\| Qwen3-30B-A3B \| 65 \| 0 \| 64-query calls \| +[\d.]+ \|/);
    expect(out).toMatch(/\| Qwen3-30B-A3B \| 65 \| 3584 \| 64-query calls \| +[\d.]+ \|/);
    expect(out).toMatch(/dec_attention_cm not run: cooperative matrices not enabled|\| dec_attention_cm \|/);
  }, SCRIPT_TIMEOUT_MS);

  test("check:gpu on a K-quant file: within its bound (exit 0), and exit 1 past a bound no rounding meets", () => {
    const args = ["scripts/check-gpu.ts", "--model", KQUANT, "--prompt", "70", "--steps", "2"];
    const pass = script(args, { VKMOE_GRAPH: "on" });
    expect(pass.code, pass.out).toBe(0);
    expect(pass.out).toMatch(/prompt of 70: NMSE [\d.e+-]+, top id GPU \d+ CPU \d+/);
    expect(pass.out).toMatch(/worst NMSE [\d.e+-]+ \(bound 0\.01\), top ids differ at \d of 3; VKMOE_GRAPH=on/);
    const fail = script([...args, "--bound", "1e-30"], { VKMOE_GRAPH: "on" });
    expect(fail.code).toBe(1);
    expect(fail.out).toContain("(bound 1e-30)");
  }, SCRIPT_TIMEOUT_MS);

  test("bench:generate on a K-quant file without llama.cpp: the prefill and decode rows", () => {
    const { code, out } = script(["scripts/bench-generate.ts", "--model", KQUANT, "--prompt", "8", "--gen", "4", "--depth", "0", "--no-llama"], { VKMOE_GRAPH: "on" });
    expect(code).toBe(0);
    expect(out).toMatch(/\| prefill 8 +\| +[\d.]+ \|/);
    expect(out).toMatch(/\| decode 4 @8 +\| +[\d.]+ \|/);
  }, SCRIPT_TIMEOUT_MS);

  test("bench:switch --set VKMOE_ROUTER_WARM=on,off --rounds 1: a row per run (its dispatches a token show the switch reached it), then each value's means and its ratio to the first value's", () => {
    const { code, out } = script(["scripts/bench-switch.ts", "--model", KQUANT, "--set", "VKMOE_ROUTER_WARM=on,off", "--rounds", "1", "--prompt", "4", "--gen", "2"], { VKMOE_GRAPH: "on" });
    expect(code).toBe(0);
    // each run's row; its dispatches a decode token show the switch reached it (the warm: one more a layer, 2 layers)
    const dispatches = ["on", "off"].map((v) => {
      const m = out.match(new RegExp(`\\| +1 \\| ${v} +\\| +[\\d.]+ \\| +[\\d.]+ \\| +[\\d.]+ \\| +(\\d+) \\|`));
      expect(m, `the run with ${v}`).not.toBeNull();
      return Number(m![1]);
    });
    expect(dispatches[0]! - dispatches[1]!).toBe(2);
    expect(out).toMatch(/\| on +\| +[\d.]+ \| 1\.000x \| +[\d.]+ \| 1\.000x \|/);
    expect(out).toMatch(/\| off +\| +[\d.]+ \| [\d.]+x \| +[\d.]+ \| [\d.]+x \|/);
    expect(out).not.toContain("NaN");
  }, SCRIPT_TIMEOUT_MS);

  test("bench:switch with a switch it does not know, one value, or a value the switch does not take: one line each, exit status 1", () => {
    for (const [set, says] of [["VKMOE_NOPE=a,b", "no switch VKMOE_NOPE"], ["VKMOE_ROUTER_WARM=on", "give two or more distinct values"], ["VKMOE_ROUTER_WARM=on,maybe", "--set VKMOE_ROUTER_WARM=maybe"]] as const) {
      const { code, out } = script(["scripts/bench-switch.ts", "--model", KQUANT, "--set", set]);
      expect(code).toBe(1);
      expect(out).toContain(says);
      expect(out.trim().split("\n")).toHaveLength(1);
    }
  }, SCRIPT_TIMEOUT_MS);
});
