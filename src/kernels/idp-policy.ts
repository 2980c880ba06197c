/**
 * Whether the integer dot-product path may run on a device. It must never take the process down:
 * some drivers segfault while *creating* an int8 dot-product pipeline, which no error code can
 * catch. So: a blocklist by vendor, driver ID and driver-version range; the VKMOE_IDP override;
 * and a pipeline-creation probe in a child process whose verdict is cached per device UUID +
 * driver version.
 */

export interface BlocklistEntry {
  vendorId: number;
  /** VkDriverId values this applies to; empty = any driver of the vendor. */
  driverIds: number[];
  /** Inclusive range of VkPhysicalDeviceProperties.driverVersion. */
  minDriverVersion: number;
  maxDriverVersion: number;
  reason: string;
}

export const IDP_BLOCKLIST: readonly BlocklistEntry[] = [
  {
    // Radeon 780M, AMD proprietary / AMDVLK 2.0.388 (driverVersion 0x800184): segfaults creating any
    // int8 dot-product pipeline. Earlier 2.0.x builds are blocked too: nobody has shown them safe.
    vendorId: 0x1002,
    driverIds: [1, 2],
    minDriverVersion: 0x800000,
    maxDriverVersion: 0x800184,
    reason: "AMD driver 2.0.x up to 2.0.388 (0x800184) segfaults creating int8 dot-product pipelines (Radeon 780M)",
  },
];

export interface DriverIdentity {
  vendorId: number;
  driverId: number;
  driverVersion: number;
  uuid: string;
}

export function blocklisted(d: DriverIdentity, list: readonly BlocklistEntry[] = IDP_BLOCKLIST): BlocklistEntry | undefined {
  return list.find((e) =>
    e.vendorId === d.vendorId &&
    (e.driverIds.length === 0 || e.driverIds.includes(d.driverId)) &&
    d.driverVersion >>> 0 >= e.minDriverVersion && d.driverVersion >>> 0 <= e.maxDriverVersion);
}

export type ProbeVerdict = { ok: true } | { ok: false; why: string };

export interface IdpDecision {
  on: boolean;
  reason: string;
}

export interface IdpInputs {
  mode: "auto" | "on" | "off";
  /** shaderIntegerDotProduct reported and enabled on the device. */
  featureEnabled: boolean;
  /** The driver reports packed 4x8 signed dot products as accelerated. */
  accelerated: boolean;
  driver: DriverIdentity;
  /** Runs (or reads the cached result of) the child-process probe. Only called when needed. */
  probe: () => ProbeVerdict;
  blocklist?: readonly BlocklistEntry[];
}

/**
 * The decision, in order: off by request; off without the feature; off when blocklisted (even
 * with VKMOE_IDP=on: the crash cannot be caught); "auto" only where the driver reports the 4x8
 * dot product as accelerated; then the child-process probe, for "on" too.
 */
export function decideIntegerDot(inputs: IdpInputs): IdpDecision {
  if (inputs.mode === "off") return { on: false, reason: "VKMOE_IDP=off" };
  if (!inputs.featureEnabled) return { on: false, reason: "shaderIntegerDotProduct not available" };
  const blocked = blocklisted(inputs.driver, inputs.blocklist);
  if (blocked) return { on: false, reason: `blocklisted: ${blocked.reason}` };
  if (inputs.mode === "auto" && !inputs.accelerated) return { on: false, reason: "not accelerated by this driver (VKMOE_IDP=on to use it anyway)" };
  const verdict = inputs.probe();
  if (!verdict.ok) return { on: false, reason: `pipeline probe failed in a child process: ${verdict.why}` };
  return { on: true, reason: inputs.mode === "on" ? "VKMOE_IDP=on, probe passed" : "probe passed" };
}
