/**
 * llama.cpp's `llama-batched-bench` on a model file: for each parallel count it prefills that many
 * prompts of `prompt` tokens and decodes `gen` tokens for each together, the peer's own figure for
 * what a server's continuous batching reaches. Used by `bun run bench:serve` beside its own table.
 */
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { oneLine } from "./cli.ts";

export const DEFAULT_LLAMA_BATCHED = "/tmp/llama/llama-vk/llama-batched-bench";

export interface BatchedRow {
  parallel: number;
  prompt: number;
  gen: number;
  /** Seconds to prefill all `parallel` prompts (the first token of every sequence waits for it). */
  prefillSeconds: number;
  /** Aggregate decode tok/s over the parallel sequences. */
  decodeTps: number;
  /** Prefill and decode together. */
  totalSeconds: number;
  /** Generated tokens of all sequences ÷ the whole time (prefill included): the analogue of a server's completion tok/s. */
  completionTps: number;
}

export interface BatchedResult {
  command: string;
  device: string;
  rows: BatchedRow[];
  error?: string;
}

export function findLlamaBatched(path: string | undefined): string | undefined {
  const p = path ?? DEFAULT_LLAMA_BATCHED;
  return existsSync(p) ? p : undefined;
}

/**
 * Its first pass over the parallel counts compiles pipelines and pages the weights in (measured on
 * the H200, 2026-12-02: 0.8-6.7 s to prefill a few short prompts, against 0.14 s for 64 once warm), so
 * the list runs twice and the second pass's rows are the figures.
 */
export function runLlamaBatched(binary: string, file: string, o: { prompt: number; gen: number; parallel: number[]; log: (line: string) => void }): BatchedResult {
  const ctx = Math.max(...o.parallel) * (o.prompt + o.gen) + 256;
  const argv = ["-m", file, "-ngl", "99", "-fa", "on", "-c", String(ctx), "-b", "2048", "-ub", "512", "-npp", String(o.prompt), "-ntg", String(o.gen), "-npl", [...o.parallel, ...o.parallel].join(","), "--output-format", "jsonl"];
  const command = `${binary} ${argv.join(" ")}`;
  o.log(command);
  const r = spawnSync(binary, argv, { encoding: "utf8", maxBuffer: 64 * 1024 * 1024 });
  const stderr = String(r.stderr ?? "");
  const device = /ggml_vulkan: \d+ = ([^\n]*)/.exec(stderr)?.[1]?.trim() ?? "";
  if (r.error || r.status !== 0) {
    const last = stderr.trim().split("\n").filter((l) => l.trim() !== "").slice(-2).join(" / ");
    return { command, device, rows: [], error: `${r.error ? oneLine(r.error) : `exit ${r.status ?? r.signal}`}${last ? `: ${last}` : ""}` };
  }
  const rows: BatchedRow[] = [];
  for (const line of String(r.stdout).split("\n")) {
    if (!line.trim().startsWith("{")) continue;
    try {
      const e = JSON.parse(line);
      rows.push({ parallel: Number(e.pl), prompt: Number(e.pp), gen: Number(e.tg), prefillSeconds: Number(e.t_pp), decodeTps: Number(e.speed_tg), totalSeconds: Number(e.t), completionTps: (Number(e.pl) * Number(e.tg)) / Number(e.t) });
    } catch {
      // a line of other output that happens to start with "{"
    }
  }
  const warm = rows.slice(rows.length - o.parallel.length);
  return rows.length === 2 * o.parallel.length ? { command, device, rows: warm } : { command, device, rows: warm, error: `${rows.length} jsonl rows in its output, ${2 * o.parallel.length} expected` };
}
