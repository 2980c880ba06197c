/** Run a child process in Bun or Deno and collect its output. Test-time only. */
export interface ProcResult {
  code: number;
  signal: string | null;
  stdout: string;
  stderr: string;
}

export function runProcess(cmd: string[], options: { env?: Record<string, string>; cwd?: string; stdin?: string } = {}): ProcResult {
  const deno = (globalThis as any).Deno;
  const env = { ...(globalThis as any).process?.env, ...options.env };
  if ("Bun" in globalThis) {
    const r = (globalThis as any).Bun.spawnSync({ cmd, env, cwd: options.cwd, stdin: options.stdin ? new TextEncoder().encode(options.stdin) : undefined });
    return { code: r.exitCode ?? -1, signal: r.signalCode ?? null, stdout: r.stdout.toString(), stderr: r.stderr.toString() };
  }
  const r = new deno.Command(cmd[0], { args: cmd.slice(1), env: options.env, cwd: options.cwd, stdout: "piped", stderr: "piped" }).outputSync();
  const dec = new TextDecoder();
  return { code: r.code, signal: r.signal, stdout: dec.decode(r.stdout), stderr: dec.decode(r.stderr) };
}

/** The running runtime's own executable, to start a child of the same kind. */
export function runtimeExecutable(): string {
  const deno = (globalThis as any).Deno;
  return deno ? deno.execPath() : (globalThis as any).process.execPath;
}
