/** Starting a child of the same runtime (Bun or Deno), synchronously. Part of the runtime seam. */
declare const Deno: any;

export interface ChildResult {
  /** Exit code, or null when a signal ended the child. */
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
}

/** Runs `script` with the current runtime (Deno gets --allow-all) and waits for it. */
export function runScript(script: string, args: readonly string[], timeoutMs = 60_000): ChildResult {
  if ("Bun" in globalThis) {
    const Bun = (globalThis as any).Bun;
    const r = Bun.spawnSync({ cmd: [process.execPath, script, ...args], timeout: timeoutMs, stdout: "pipe", stderr: "pipe" });
    return { code: r.signalCode ? null : r.exitCode, signal: r.signalCode ?? null, stdout: r.stdout.toString(), stderr: r.stderr.toString() };
  }
  const r = new Deno.Command(Deno.execPath(), { args: ["run", "--allow-all", "--no-check", script, ...args], stdout: "piped", stderr: "piped" }).outputSync();
  const dec = new TextDecoder();
  return { code: r.signal ? null : r.code, signal: r.signal ?? null, stdout: dec.decode(r.stdout), stderr: dec.decode(r.stderr) };
}
