/** Reads an environment variable in Bun or Deno; undefined when unset or not permitted. */
export function readEnv(name: string): string | undefined {
  const deno = (globalThis as any).Deno;
  if (deno?.env) {
    try {
      return deno.env.get(name) ?? undefined;
    } catch {
      return undefined;
    }
  }
  return (globalThis as any).process?.env?.[name];
}
