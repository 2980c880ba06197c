// Compiles every shaders/*.comp to shaders/NAME.spv with glslangValidator, then validates it
// with spirv-val.  The output is byte-identical across machines and checkout paths for a given
// glslang version: debug info is stripped (-g0: no names, no source, no file paths) and the
// compiler is run from the repository root on relative paths.
//
//   bun scripts/build-shaders.ts           build into shaders/
//   bun scripts/build-shaders.ts --check   build into a temp dir; exit 1 listing every .spv in
//                                          shaders/ that is stale, missing or orphaned
//
// Tools come from PATH, or from $GLSLANG_VALIDATOR / $SPIRV_VAL.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { nvToKhrCoopmat } from "./lib/spirv-coopmat-khr.ts";

const repoRoot = fileURLToPath(new URL("../", import.meta.url));
const shaderDir = join(repoRoot, "shaders");

/** glslangValidator target; spirv-val is run with the same environment. */
export const TARGET_ENV = "vulkan1.2";

export interface BuildOptions {
  /** Where the .spv files go (default: shaders/). */
  outDir?: string;
  /** Build into a temporary directory and compare with the .spv files in shaders/. */
  check?: boolean;
  /** check mode: compare against the .spv files here instead of shaders/ (tests). */
  committedDir?: string;
  /** Print progress (default false). */
  verbose?: boolean;
}

export interface BuildResult {
  /** Shader names (file names without .comp), sorted. */
  built: string[];
  /** .spv files written or rewritten (build mode). */
  written: string[];
  /** check mode: .spv in shaders/ whose content differs from a fresh build. */
  stale: string[];
  /** check mode: .comp with no .spv in shaders/. */
  missing: string[];
  /** check mode: .spv in shaders/ with no .comp. */
  orphans: string[];
  /** check mode: true when nothing is stale, missing or orphaned. */
  ok: boolean;
}

export class ShaderBuildError extends Error {
  override name = "ShaderBuildError";
}

function tool(envName: string, fallback: string): string {
  const v = process.env[envName];
  return v && v.length > 0 ? v : fallback;
}

function exec(cmd: string, args: string[], what: string): { stdout: string; stderr: string } {
  const r = spawnSync(cmd, args, { cwd: repoRoot, encoding: "utf8" });
  if (r.error) {
    const code = (r.error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") {
      const pkg = cmd.includes("glslang") ? "glslang-tools" : "spirv-tools";
      throw new ShaderBuildError(
        `${cmd} not found: install ${pkg} (Debian/Ubuntu: apt-get install ${pkg}) or point ` +
          `${cmd.includes("glslang") ? "$GLSLANG_VALIDATOR" : "$SPIRV_VAL"} at it`,
      );
    }
    throw new ShaderBuildError(`${what}: cannot run ${cmd}: ${r.error.message}`);
  }
  if (r.status !== 0) {
    const out = `${r.stdout ?? ""}${r.stderr ?? ""}`.trim();
    throw new ShaderBuildError(`${what} failed (exit ${r.status}):\n${out}`);
  }
  return { stdout: r.stdout ?? "", stderr: r.stderr ?? "" };
}

function listShaders(): string[] {
  return readdirSync(shaderDir)
    .filter((f) => f.endsWith(".comp"))
    .map((f) => f.slice(0, -".comp".length))
    .sort();
}

/**
 * The matrix-core shaders (NAME_cm.comp) are also written as NAME_cmk.spv: the same module with its
 * VK_NV_cooperative_matrix instructions rewritten as VK_KHR_cooperative_matrix ones
 * (lib/spirv-coopmat-khr.ts), which this glslang cannot emit nor this spirv-val check.
 */
const khrVariant = (name: string) => (name.endsWith("_cm") ? `${name}k` : undefined);

function compile(name: string, outDir: string): string[] {
  const glslang = tool("GLSLANG_VALIDATOR", "glslangValidator");
  const spirvVal = tool("SPIRV_VAL", "spirv-val");
  const out = join(outDir, `${name}.spv`);
  // relative source and include paths: nothing path-dependent can reach the binary
  exec(glslang, ["-V", "--target-env", TARGET_ENV, "-g0", "--quiet", "-I" + "shaders", "-o", out, `shaders/${name}.comp`], `glslangValidator ${name}.comp`);
  exec(spirvVal, ["--target-env", TARGET_ENV, out], `spirv-val ${name}.spv`);
  const khr = khrVariant(name);
  if (!khr) return [out];
  const nv = readFileSync(out);
  const khrOut = join(outDir, `${khr}.spv`);
  writeFileSync(khrOut, nvToKhrCoopmat(new Uint32Array(nv.buffer, nv.byteOffset, nv.byteLength / 4)));
  return [out, khrOut];
}

function sameBytes(a: string, b: string): boolean {
  if (!existsSync(a) || !existsSync(b)) return false;
  return Buffer.compare(readFileSync(a), readFileSync(b)) === 0;
}

/** Builds (or checks) every shaders/*.comp.  Throws ShaderBuildError on a compile/validation error or a missing tool. */
export function buildShaders(opts: BuildOptions = {}): BuildResult {
  const names = listShaders();
  const result: BuildResult = { built: names, written: [], stale: [], missing: [], orphans: [], ok: true };
  const committedDir = opts.committedDir ?? shaderDir;
  if (opts.check) {
    const tmp = mkdtempSync(join(tmpdir(), "vkmoe-shaders-"));
    try {
      for (const n of names) {
        for (const fresh of compile(n, tmp)) {
          const file = basename(fresh);
          const committed = join(committedDir, file);
          if (!existsSync(committed)) result.missing.push(file);
          else if (!sameBytes(committed, fresh)) result.stale.push(file);
        }
        if (opts.verbose) console.log(`checked ${n}`);
      }
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
    const sources = new Set(names.flatMap((n) => [n, khrVariant(n) ?? n]));
    for (const f of readdirSync(committedDir).filter((f) => f.endsWith(".spv")).sort()) {
      if (!sources.has(f.slice(0, -".spv".length))) result.orphans.push(f);
    }
    result.ok = result.stale.length + result.missing.length + result.orphans.length === 0;
    return result;
  }
  const outDir = opts.outDir ?? shaderDir;
  mkdirSync(outDir, { recursive: true });
  const tmp = mkdtempSync(join(tmpdir(), "vkmoe-shaders-"));
  try {
    for (const n of names) {
      for (const fresh of compile(n, tmp)) {
        const file = basename(fresh);
        const dest = join(outDir, file);
        if (!sameBytes(fresh, dest)) {
          writeFileSync(dest, readFileSync(fresh));
          result.written.push(file);
        }
        if (opts.verbose) console.log(`${file}${result.written.includes(file) ? " (written)" : ""}`);
      }
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return result;
}

function glslangVersion(): string {
  try {
    const { stdout } = exec(tool("GLSLANG_VALIDATOR", "glslangValidator"), ["--version"], "glslangValidator --version");
    return stdout.split("\n")[0]?.trim() ?? "?";
  } catch {
    return "?";
  }
}

if (import.meta.main) {
  const args = process.argv.slice(2);
  const check = args.includes("--check");
  const unknown = args.filter((a) => a !== "--check" && a !== "--verbose");
  if (unknown.length > 0) {
    console.error(`build-shaders: unknown argument ${unknown.join(" ")} (usage: bun scripts/build-shaders.ts [--check] [--verbose])`);
    process.exit(2);
  }
  try {
    const r = buildShaders({ check, verbose: args.includes("--verbose") });
    if (check) {
      if (r.ok) {
        console.log(`build-shaders --check: ${r.built.length} shaders up to date`);
      } else {
        for (const f of r.stale) console.error(`stale:   shaders/${f}`);
        for (const f of r.missing) console.error(`missing: shaders/${f}`);
        for (const f of r.orphans) console.error(`orphan:  shaders/${f} (no .comp source)`);
        console.error(`build-shaders --check: run \`bun scripts/build-shaders.ts\` and commit the .spv files (${glslangVersion()})`);
        process.exit(1);
      }
    } else {
      const where = relative(process.cwd(), shaderDir) || ".";
      console.log(`build-shaders: ${r.built.length} shaders built and validated (${TARGET_ENV}); ${r.written.length} written to ${where}`);
    }
  } catch (e) {
    console.error(`build-shaders: ${(e as Error).message}`);
    process.exit(1);
  }
}
