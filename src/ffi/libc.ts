/** Candidate names of the C runtime that provides calloc/free on each platform. */
export function libcCandidates(): string[] {
  const os: string = globalThis.process?.platform ?? (globalThis as any).Deno?.build?.os;
  switch (os) {
    case "darwin":
      return ["libSystem.B.dylib", "/usr/lib/libSystem.B.dylib"];
    case "win32":
    case "windows":
      return ["ucrtbase.dll", "msvcrt.dll"];
    default:
      return ["libc.so.6", "libc.so"];
  }
}

export const libcSymbols = {
  calloc: { args: ["u64", "u64"], returns: "ptr" },
  free: { args: ["ptr"], returns: "void" },
} as const;
