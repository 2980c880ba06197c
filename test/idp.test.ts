import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { blocklisted, decideIntegerDot, IDP_BLOCKLIST } from "../src/kernels/idp-policy.ts";
import { probeIntegerDot, verdictPath } from "../src/kernels/idp-probe.ts";
import { finish, openTestContext } from "./support/gpu.ts";

const radeon780m = { vendorId: 0x1002, driverId: 1, driverVersion: 0x800184, uuid: "0".repeat(32) };

describe("integer dot-product policy", () => {
  test("the known crashing AMD driver is blocklisted, by range", () => {
    expect(blocklisted(radeon780m)).toBe(IDP_BLOCKLIST[0]);
    expect(blocklisted({ ...radeon780m, driverVersion: 0x800100 })).toBeDefined();
    expect(blocklisted({ ...radeon780m, driverVersion: 0x800185 })).toBeUndefined();
    expect(blocklisted({ ...radeon780m, driverId: 3 /* RADV */ })).toBeUndefined();
    expect(blocklisted({ ...radeon780m, vendorId: 0x10de })).toBeUndefined();
  });

  test("blocklisted: off without running the probe, even with VKMOE_IDP=on", () => {
    let probed = 0;
    const d = decideIntegerDot({ mode: "on", featureEnabled: true, accelerated: true, driver: radeon780m, probe: () => (probed++, { ok: true }) });
    expect(d.on).toBe(false);
    expect(d.reason).toContain("blocklisted");
    expect(probed).toBe(0);
  });

  test("off by request, off without the feature, on only after the probe passes", () => {
    const ok = { vendorId: 0x10de, driverId: 4, driverVersion: 1, uuid: "1".repeat(32) };
    expect(decideIntegerDot({ mode: "off", featureEnabled: true, accelerated: true, driver: ok, probe: () => ({ ok: true }) })).toEqual({ on: false, reason: "VKMOE_IDP=off" });
    expect(decideIntegerDot({ mode: "auto", featureEnabled: false, accelerated: true, driver: ok, probe: () => ({ ok: true }) }).on).toBe(false);
    expect(decideIntegerDot({ mode: "auto", featureEnabled: true, accelerated: true, driver: ok, probe: () => ({ ok: true }) })).toEqual({ on: true, reason: "probe passed" });
    const slow = decideIntegerDot({ mode: "auto", featureEnabled: true, accelerated: false, driver: ok, probe: () => ({ ok: true }) });
    expect(slow).toMatchObject({ on: false });
    expect(slow.reason).toContain("not accelerated");
    expect(decideIntegerDot({ mode: "on", featureEnabled: true, accelerated: false, driver: ok, probe: () => ({ ok: true }) }).on).toBe(true);
    const failed = decideIntegerDot({ mode: "auto", featureEnabled: true, accelerated: true, driver: ok, probe: () => ({ ok: false, why: "child killed by SIGSEGV" }) });
    expect(failed.on).toBe(false);
    expect(failed.reason).toContain("SIGSEGV");
  });
});

describe("child-process probe on the real driver", () => {
  const ctx = openTestContext();
  afterAll(() => finish(ctx));
  const info = ctx.device.info;
  const driver = { vendorId: info.vendorId, driverId: info.driverId, driverVersion: info.driverVersion, uuid: info.uuid };
  const cacheDir = mkdtempSync(join(tmpdir(), "vkmoe-idp-"));

  test("a child that aborts (a driver crashing in pipeline creation) turns the path off; the parent carries on", () => {
    const v = probeIntegerDot(driver, { cacheDir, simulate: "abort" });
    expect(v.ok).toBe(false);
    if (!v.ok) expect(v.why).toMatch(/killed by SIGABRT|SIGABRT/);
    // The parent still works: the float path decision follows.
    const d = decideIntegerDot({ mode: "auto", featureEnabled: true, accelerated: true, driver, probe: () => v });
    expect(d.on).toBe(false);
    expect(ctx.device.handle).not.toBe(0n);
  });

  test("a child whose pipeline creation fails turns the path off with its reason", () => {
    const v = probeIntegerDot(driver, { cacheDir, simulate: "fail" });
    expect(v.ok).toBe(false);
    if (!v.ok) expect(v.why).toContain("simulated pipeline failure");
  });

  test("the real probe creates every integer-dot pipeline on Lavapipe, and its verdict is cached per UUID + driver version", () => {
    const first = probeIntegerDot(driver, { cacheDir, refresh: true });
    expect(first).toEqual({ ok: true, cached: false });
    expect(JSON.parse(readFileSync(verdictPath(driver, cacheDir), "utf8"))).toEqual({ ok: true });
    expect(probeIntegerDot(driver, { cacheDir })).toEqual({ ok: true, cached: true });
    // A different driver version is a different cache entry.
    expect(verdictPath({ ...driver, driverVersion: driver.driverVersion + 1 }, cacheDir)).not.toBe(verdictPath(driver, cacheDir));
  });
});
