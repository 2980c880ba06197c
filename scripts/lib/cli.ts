/** Runtime seams for scripts that run under Bun and Deno: arguments, stderr, exit, one-line failures. */
const deno = (globalThis as any).Deno;
const proc = (globalThis as any).process;

export const runtimeName: string = deno ? `Deno ${deno.version.deno}` : `Bun ${(globalThis as any).Bun?.version ?? "?"}`;

export function args(): string[] {
  return deno ? [...deno.args] : proc.argv.slice(2);
}

const encoder = new TextEncoder();
export function writeStderr(text: string): void {
  if (deno) deno.stderr.writeSync(encoder.encode(text));
  else proc.stderr.write(text);
}

export function stderrIsTTY(): boolean {
  try {
    return deno ? deno.stderr.isTerminal() : Boolean(proc.stderr.isTTY);
  } catch {
    return false;
  }
}

export function exit(code: number): never {
  if (deno) deno.exit(code);
  proc.exit(code);
  throw new Error("unreachable");
}

/** Folds a multi-line message into one line. */
export function fold(message: string): string {
  return message.split("\n").map((l) => l.trim()).filter((l) => l !== "").join(" ").replace(/: ✖ /g, ": ");
}

/** One line on stderr, exit status 1. */
export function fail(script: string, message: string): never {
  writeStderr(`${script}: ${fold(message)}\n`);
  exit(1);
}

/** An error as one line, with its class name when that says more than "Error". */
export function oneLine(e: unknown): string {
  if (e instanceof Error) {
    const text = fold(e.message);
    return e.name && e.name !== "Error" ? `${e.name}: ${text}` : text;
  }
  return String(e);
}

/** A tiny parser: boolean flags and integer options (`--name N` or `--name=N`); unknown options fail. */
export class Args {
  private readonly list: string[];
  constructor(private readonly script: string, known: { flags: string[]; ints: string[] }, list = args()) {
    this.list = list;
    for (let i = 0; i < list.length; i++) {
      const a = list[i]!;
      const name = a.split("=")[0]!;
      if (known.flags.includes(name)) continue;
      if (known.ints.includes(name)) {
        if (!a.includes("=")) i++;
        continue;
      }
      fail(script, `unknown argument ${a} (options: ${[...known.flags, ...known.ints.map((n) => `${n} N`)].join(", ")})`);
    }
  }

  flag(name: string): boolean {
    return this.list.includes(name);
  }

  /** An option's value (`--name V` or `--name=V`): undefined when absent, null when given without one. */
  private value(name: string): string | null | undefined {
    for (let i = 0; i < this.list.length; i++) {
      const a = this.list[i]!;
      if (a === name) return this.list[i + 1] ?? null;
      if (a.startsWith(`${name}=`)) return a.slice(name.length + 1);
    }
    return undefined;
  }

  /** A positive integer option, or undefined when absent. */
  int(name: string, min = 1, max = Number.MAX_SAFE_INTEGER): number | undefined {
    const raw = this.value(name);
    if (raw === undefined) return undefined;
    const n = Number(raw);
    if (raw === null || !Number.isInteger(n) || n < min || n > max) fail(this.script, `${name} needs an integer in ${min}..${max}, got ${raw ?? "nothing"}`);
    return n;
  }

  /** A comma-separated list of integers (`--name 1,2,3`), or undefined when absent. */
  ints(name: string, min = 1, max = Number.MAX_SAFE_INTEGER): number[] | undefined {
    const raw = this.value(name);
    if (raw === undefined) return undefined;
    const ns = (raw ?? "").split(",").map(Number);
    if (raw === null || raw === "" || ns.some((n) => !Number.isInteger(n) || n < min || n > max)) fail(this.script, `${name} needs integers in ${min}..${max}, comma-separated, got ${raw ?? "nothing"}`);
    return ns;
  }
}
