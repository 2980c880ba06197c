/**
 * The shared reference models (../shared/fixtures next to the repo, or $FIXTURES_DIR). A test that
 * needs them and cannot find them fails when CI is set; elsewhere it is skipped with a printed reason.
 */
import { existsSync } from "node:fs";
import { repoRoot } from "./paths.ts";

const dir = (globalThis as any).process?.env?.FIXTURES_DIR ?? `${repoRoot}../shared/fixtures`;

/** Absolute path of a fixture file or directory, or undefined (after printing why) when it is absent outside CI. */
export function fixture(name: string): string | undefined {
  const path = `${dir}/${name}`;
  if (existsSync(path)) return path;
  if ((globalThis as any).process?.env?.CI) throw new Error(`fixture ${path} is missing (CI must have ../shared/fixtures)`);
  console.warn(`skipping: fixture ${path} not found (tests that need ../shared/fixtures are skipped outside CI)`);
  return undefined;
}

export const fixturesDir = dir;
