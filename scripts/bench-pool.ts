// Expert pool benchmark on the real device: upload throughput per memory model (direct vs forced
// staged), cache hit and miss service time, and the steady-state hit rate on a Zipf-skewed routing
// trace for budgets of 25%, 50% and 100% of the experts.
//   bun scripts/bench-pool.ts [--layers N] [--tokens N]
import { readConfig } from "../src/config.ts";
import { ExpertPool } from "../src/pool/expert-pool.ts";
import { expertLayout, type ExpertShape } from "../src/pool/expert-layout.ts";
import { VulkanContext } from "../src/vk/context.ts";

const args = (globalThis as any).Deno ? (globalThis as any).Deno.args : process.argv.slice(2);
const arg = (name: string, dflt: number) => (args.indexOf(name) >= 0 ? Number(args[args.indexOf(name) + 1]) : dflt);
const shape: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 2048, intermediate: 768 }; // Qwen3-30B-A3B
const layout = expertLayout(shape);
const MiB = 2 ** 20;
const env = readConfig();

function table(title: string, rows: string[][]): void {
  const w = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  console.log(`\n${title}`);
  for (const r of rows) console.log(`| ${r.map((v, i) => v.padEnd(w[i]!)).join(" | ")} |`);
}

const blob = new Uint8Array(layout.bytes);
for (let i = 0; i < blob.length; i++) blob[i] = (i * 2654435761) >>> 24;

// Upload throughput and service times, per memory model.
const uploadRows = [["memory model", "why", "experts", "MiB", "upload GB/s", "hit µs", "miss µs (evict + upload)"]];
let info = "";
for (const staged of ["auto", "on"] as const) {
  using ctx = new VulkanContext({ staged }, env);
  const device = ctx.device;
  info ||= `${new Date().toISOString().slice(0, 10)} ${device.info.name}, ${device.info.driverName} ${device.info.driverInfo}`;
  const cpu = device.info.type === 4;
  const count = cpu ? 64 : 512;
  using pool = new ExpertPool(device, { shape, budgetBytes: count * layout.bytes, policy: "lru" });
  const t0 = performance.now();
  for (let e = 0; e < count; e++) pool.ensure(0, e, blob);
  pool.flush();
  const seconds = (performance.now() - t0) / 1000;
  const t1 = performance.now();
  for (let rep = 0; rep < 20; rep++) for (let e = 0; e < count; e++) pool.ensure(0, e, blob);
  const hitUs = ((performance.now() - t1) * 1000) / (20 * count);
  const t2 = performance.now();
  for (let e = 0; e < count; e++) pool.ensure(1, e, blob); // every one evicts an expert of layer 0
  pool.flush();
  const missUs = ((performance.now() - t2) * 1000) / count;
  uploadRows.push([device.memory.model, device.memory.why, String(count), ((count * layout.bytes) / MiB).toFixed(0), ((count * layout.bytes) / seconds / 1e9).toFixed(2), hitUs.toFixed(2), missUs.toFixed(1)]);
}

// Steady-state hit rate under a Zipf-skewed routing trace.
using ctx = new VulkanContext({}, env);
const device = ctx.device;
const cpu = device.info.type === 4;
const L = arg("--layers", cpu ? 8 : 48), E = 128, k = 8, T = arg("--tokens", cpu ? 256 : 1024);
let seed = 12345;
const rand = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32);
const zipf = Array.from({ length: E }, (_, i) => 1 / (i + 1) ** 1.1);
const cdf: number[] = [];
zipf.reduce((s, v, i) => (cdf[i] = s + v), 0);
const total = cdf[E - 1]!;
const perms = Array.from({ length: L }, () => [...Array(E).keys()].sort(() => rand() - 0.5));
function route(layer: number): number[] {
  const chosen = new Set<number>();
  while (chosen.size < k) {
    const u = rand() * total;
    let i = cdf.findIndex((c) => c >= u);
    chosen.add(perms[layer]![i < 0 ? E - 1 : i]!);
  }
  return [...chosen];
}
const trace = Array.from({ length: T }, () => Array.from({ length: L }, (_, l) => route(l)));
const hitRows = [["budget", "experts resident", "policy", "hit rate", "misses/token", "upload MiB/token", "µs/token (ensure)"]];
for (const fraction of [0.25, 0.5, 1]) {
  for (const policy of ["lru", "heat"] as const) {
    using pool = new ExpertPool(device, { shape, budgetBytes: Math.ceil(fraction * L * E) * layout.bytes, policy });
    const warm = Math.floor(T / 4);
    let t0 = 0;
    for (let t = 0; t < T; t++) {
      if (t === warm) {
        pool.cache.resetStats();
        t0 = performance.now();
      }
      for (let l = 0; l < L; l++) {
        using batch = pool.beginBatch();
        for (const e of trace[t]![l]!) batch.ensure(l, e, blob);
      }
    }
    pool.flush();
    const s = pool.stats();
    const tokens = T - warm;
    hitRows.push([`${fraction * 100}%`, String(Math.ceil(fraction * L * E)), policy, `${((100 * s.hits) / (s.hits + s.misses)).toFixed(1)}%`, (s.misses / tokens).toFixed(1), (s.bytesUploaded / tokens / MiB).toFixed(1), (((performance.now() - t0) * 1000) / tokens).toFixed(0)]);
  }
}
console.log(info);
console.log(`expert = Qwen3-30B-A3B gate+up+down, q4 group 32 f16 scales: ${(layout.bytes / MiB).toFixed(2)} MiB`);
table("uploads (one expert per ensure; direct = mapped device memory, staged = staging ring + vkCmdCopyBuffer)", uploadRows);
table(`hit rate: ${L} layers x ${E} experts, k=${k}, Zipf s=1.1 per layer, ${T} tokens (first quarter warm-up)`, hitRows);
