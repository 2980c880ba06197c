/** The child-process probe for the integer dot-product pipelines, with its verdict cached on disk. */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { runScript } from "../ffi/process.ts";
import type { DriverIdentity, ProbeVerdict } from "./idp-policy.ts";
import { IDP_PROBE_VERSION } from "./shaders.ts";

const CHILD = fileURLToPath(new URL("./idp-probe-child.ts", import.meta.url));

export interface ProbeOptions {
  /** Directory for cached verdicts (VKMOE_CACHE_DIR); undefined = ~/.cache/vkmoe. */
  cacheDir?: string;
  /** Ignore and overwrite a cached verdict. */
  refresh?: boolean;
  /** Test hook: make the child die the way a crashing driver would ("abort") or fail ("fail"). */
  simulate?: "abort" | "fail";
  /** VKMOE_DEVICE selector so the child opens the same device. */
  deviceSelector?: string;
}

export function verdictPath(d: DriverIdentity, cacheDir?: string): string {
  const dir = cacheDir ?? join(homedir(), ".cache", "vkmoe");
  return join(dir, `idp-v${IDP_PROBE_VERSION}-${d.uuid}-${(d.driverVersion >>> 0).toString(16)}.json`);
}

/** Runs the child unless a verdict for this device UUID + driver version is cached. */
export function probeIntegerDot(d: DriverIdentity, options: ProbeOptions = {}): ProbeVerdict & { cached: boolean } {
  const path = verdictPath(d, options.cacheDir);
  if (!options.refresh && !options.simulate) {
    try {
      const cached = JSON.parse(readFileSync(path, "utf8")) as ProbeVerdict;
      if (typeof cached.ok === "boolean") return { ...cached, cached: true };
    } catch {
      // no or unreadable cache: probe
    }
  }
  const args = [d.uuid];
  if (options.simulate) args.push(`--simulate=${options.simulate}`);
  if (options.deviceSelector) args.push(`--device=${options.deviceSelector}`);
  const r = runScript(CHILD, args);
  let verdict: ProbeVerdict;
  if (r.code === 0 && r.stdout.includes("IDP_PROBE_OK")) verdict = { ok: true };
  else if (r.code === null) verdict = { ok: false, why: `child killed by ${r.signal} while creating the pipelines` };
  else {
    const lines = r.stderr.trim().split("\n");
    const line = lines.find((l) => /error/i.test(l)) ?? lines.at(-1) ?? "";
    verdict = { ok: false, why: `child exited ${r.code}: ${line.trim().slice(0, 300)}` };
  }
  if (!options.simulate) {
    try {
      mkdirSync(join(path, ".."), { recursive: true });
      writeFileSync(path, JSON.stringify(verdict));
    } catch {
      // A read-only home must not stop the run; we simply probe again next time.
    }
  }
  return { ...verdict, cached: false };
}
