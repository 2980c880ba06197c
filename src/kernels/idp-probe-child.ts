// Child process: creates every integer dot-product pipeline on the device given by UUID, then says so.
// A driver that segfaults here kills this process only; the parent reads the signal as "off".
import { Instance } from "../vk/instance.ts";
import { Device } from "../vk/device.ts";
import { ComputePipeline } from "../vk/pipeline.ts";
import { IDP_BDA_PIPELINES, IDP_PIPELINES, IDP_SHUFFLE_PIPELINES, idpFusedPipelines } from "./shaders.ts";

const [uuid, ...flags] = (globalThis as any).Deno ? (globalThis as any).Deno.args : process.argv.slice(2);
const simulate = flags.find((f: string) => f.startsWith("--simulate="))?.slice(11);
if (simulate === "abort") process.abort();
if (simulate === "fail") throw new Error("simulated pipeline failure");

using instance = new Instance();
const info = instance.physicalDevices().find((d) => d.uuid === uuid);
if (!info) throw new Error(`no device with uuid ${uuid}`);
using device = new Device(instance, info, { integerDotProduct: "on" });
if (!device.enabled.integerDotProduct) throw new Error("shaderIntegerDotProduct could not be enabled");
const bda = device.enabled.bufferDeviceAddress;
for (const spec of [...IDP_PIPELINES, ...(bda ? IDP_BDA_PIPELINES : []), ...(device.info.subgroup.shuffle ? IDP_SHUFFLE_PIPELINES : []), ...(device.enabled.bufferFloat32AtomicAdd ? idpFusedPipelines(bda) : [])]) {
  using _ = new ComputePipeline(device, spec);
}
console.log("IDP_PROBE_OK");
