/** The committed SPIR-V is exactly what the sources build to, on this machine, now. */
import { expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildShaders } from "../scripts/build-shaders.ts";
import { repoRoot } from "./support/paths.ts";

const shaderDir = join(repoRoot, "shaders");

test("every shaders/*.comp has a committed .spv, byte-identical to a fresh build; no orphans", () => {
  const r = buildShaders({ check: true });
  expect(r.built.length).toBeGreaterThanOrEqual(18);
  expect({ stale: r.stale, missing: r.missing, orphans: r.orphans }).toEqual({ stale: [], missing: [], orphans: [] });
  expect(r.ok).toBe(true);
}, 300_000);

test("negative control: a changed, a missing and an orphaned .spv are each reported", () => {
  const dir = mkdtempSync(join(tmpdir(), "vkmoe-spv-check-"));
  try {
    for (const f of readdirSync(shaderDir).filter((f) => f.endsWith(".spv"))) copyFileSync(join(shaderDir, f), join(dir, f));
    const bytes = readFileSync(join(dir, "saxpy.spv"));
    bytes[bytes.length - 5]! ^= 1;
    writeFileSync(join(dir, "saxpy.spv"), bytes);
    rmSync(join(dir, "moe_sum.spv"));
    writeFileSync(join(dir, "gone.spv"), bytes);
    const r = buildShaders({ check: true, committedDir: dir });
    expect(r).toMatchObject({ ok: false, stale: ["saxpy.spv"], missing: ["moe_sum.spv"], orphans: ["gone.spv"] });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 300_000);
