/**
 * Expert-cache benchmark: hit rate of the eviction policies on synthetic MoE routing traces, and
 * the cache's own service time per ensure (bookkeeping only: virtual slabs, no byte copies).
 *
 *   bun scripts/bench-cache.ts [--tokens 4096] [--layers 48] [--experts 128] [--k 8] [--seed 1] [--quick]
 *   deno run scripts/bench-cache.ts ...
 *
 * Trace model: per token and layer, k distinct experts drawn from a Zipf(s) popularity over a
 * per-layer random permutation of the experts. Three traces:
 *   - zipf-1.0 / zipf-1.2: stationary popularity;
 *   - drift-1.1: popularity re-shuffled for a quarter of the ranks every 512 tokens (topic change),
 *     and each routed slot repeats the previous token's expert with probability 0.3 (locality).
 * Each token walks the layers in order; each layer's k experts are ensured through one batch
 * ticket (pinned together) and released, as the engine will. The first 25% of tokens warm up;
 * hit rates are over the rest. "OPT" is Belady's offline optimum (evict the expert used furthest
 * in the future), a bound no online policy reaches.
 */
import { mulberry32 } from "../src/quant/random.ts";
import {
  ExpertCache,
  type ExpertUploader,
  type FillCallback,
  HeatPolicy,
  type HostSlab,
  HostMemorySlabProvider,
  LruPolicy,
  type EvictionPolicy,
  type SlabAllocation,
  SlabAllocator,
} from "../src/pool/index.ts";

// ---- args -----------------------------------------------------------------------------------------

const g = globalThis as unknown as { Deno?: { args: string[] }; process?: { argv: string[] } };
const argv: string[] = g.Deno?.args ?? g.process?.argv.slice(2) ?? [];
function arg(name: string, dflt: number): number {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? Number(argv[i + 1]) : dflt;
}
const quick = argv.includes("--quick");
const TOKENS = arg("tokens", quick ? 1024 : 4096);
const LAYERS = arg("layers", 48);
const EXPERTS = arg("experts", 128);
const K = arg("k", 8);
const SEED = arg("seed", 1);
const WARMUP = Math.floor(TOKENS / 4);
/** Qwen3-30B-A3B expert at int4 + f16 group scales: 3 x 768 x 2048 weights -> ~2.5 MB. */
const EXPERT_BYTES = 2_506_752;
const PER_TOKEN = LAYERS * K;

// ---- trace generation ---------------------------------------------------------------------------

const rng = mulberry32;

function shuffle(a: number[], rand: () => number): void {
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
}

interface TraceSpec {
  name: string;
  s: number;
  driftEvery: number; // 0 = stationary
  repeat: number; // probability a slot repeats the previous token's expert
}

/** Flat trace: token t, layer l, slot j at index (t * LAYERS + l) * K + j; values are expert ids. */
function makeTrace(spec: TraceSpec, seed: number): Uint16Array {
  const rand = rng(seed);
  const cdf = new Float64Array(EXPERTS);
  let acc = 0;
  for (let r = 0; r < EXPERTS; r++) cdf[r] = acc += 1 / (r + 1) ** spec.s;
  for (let r = 0; r < EXPERTS; r++) cdf[r] /= acc;
  const drawRank = () => {
    const u = rand();
    let lo = 0, hi = EXPERTS - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid] < u) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  const perms: number[][] = [];
  for (let l = 0; l < LAYERS; l++) {
    const p = Array.from({ length: EXPERTS }, (_, i) => i);
    shuffle(p, rand);
    perms.push(p);
  }
  const out = new Uint16Array(TOKENS * PER_TOKEN);
  const chosen = new Set<number>();
  for (let t = 0; t < TOKENS; t++) {
    if (spec.driftEvery > 0 && t > 0 && t % spec.driftEvery === 0) {
      // topic change: a random quarter of the ranks trade places
      for (const p of perms) {
        const idx = Array.from({ length: EXPERTS }, (_, i) => i);
        shuffle(idx, rand);
        const sub = idx.slice(0, EXPERTS >> 2);
        const vals = sub.map((i) => p[i]);
        shuffle(vals, rand);
        sub.forEach((i, n) => (p[i] = vals[n]));
      }
    }
    for (let l = 0; l < LAYERS; l++) {
      chosen.clear();
      const base = (t * LAYERS + l) * K;
      for (let j = 0; j < K; j++) {
        let e: number;
        if (t > 0 && rand() < spec.repeat) {
          e = out[base - PER_TOKEN + j];
          if (chosen.has(e)) e = -1;
        } else e = -1;
        while (e < 0 || chosen.has(e)) e = perms[l][drawRank()];
        chosen.add(e);
        out[base + j] = e;
      }
    }
  }
  return out;
}

// ---- runs ---------------------------------------------------------------------------------------

class NullUploader implements ExpertUploader<HostSlab> {
  upload(_a: SlabAllocation<HostSlab>, _d: Uint8Array | FillCallback): void {}
}

interface RunResult {
  hitRate: number;
  hitNs: number;
  missNs: number;
  evictionsPerToken: number;
  gbPerToken: number;
}

const noop: FillCallback = () => {};
const source = { byteLength: EXPERT_BYTES, fill: noop };

/** Cost of the two performance.now() calls around each ensure, subtracted from the per-call times. */
function timerOverheadNs(): number {
  const n = 200_000;
  let sink = 0;
  for (let i = 0; i < n; i++) {
    const a = performance.now();
    sink += performance.now() - a;
  }
  return (sink / n) * 1e6;
}

function runPolicy(trace: Uint16Array, budgetExperts: number, policy: EvictionPolicy, timerNs: number): RunResult {
  const provider = new HostMemorySlabProvider({ backed: false });
  const allocator = new SlabAllocator(provider, { maxSlabBytes: 2 ** 31, slabBytes: 256 * 2 ** 20, alignment: 256 });
  const cache = new ExpertCache({
    allocator,
    uploader: new NullUploader(),
    budgetBytes: budgetExperts * EXPERT_BYTES,
    policy,
    ownsAllocator: true,
  });
  let hitTime = 0, missTime = 0, hits = 0, misses = 0;
  for (let t = 0; t < TOKENS; t++) {
    if (t === WARMUP) {
      cache.resetStats();
      hitTime = missTime = hits = misses = 0;
    }
    for (let l = 0; l < LAYERS; l++) {
      const batch = cache.beginBatch();
      const base = (t * LAYERS + l) * K;
      for (let j = 0; j < K; j++) {
        const t0 = performance.now();
        const r = batch.tryEnsure(l, trace[base + j], source);
        const dt = performance.now() - t0;
        if (!r.resident) throw new Error("bench: expert not resident");
        if (r.hit) {
          hitTime += dt;
          hits++;
        } else {
          missTime += dt;
          misses++;
        }
      }
      batch.release();
    }
    cache.tick(1);
  }
  const st = cache.stats();
  if (st.hits !== hits || st.misses !== misses) throw new Error("bench: stats disagree with the harness");
  const measured = TOKENS - WARMUP;
  cache.dispose();
  if (provider.liveSlabs !== 0) throw new Error("bench: slabs leaked");
  return {
    hitRate: hits / (hits + misses),
    hitNs: hits > 0 ? Math.max(0, (hitTime / hits) * 1e6 - timerNs) : NaN,
    missNs: misses > 0 ? Math.max(0, (missTime / misses) * 1e6 - timerNs) : NaN,
    evictionsPerToken: st.evictions / measured,
    gbPerToken: st.bytesUploaded / measured / 1e9,
  };
}

/** Belady's optimum with per-layer-batch pinning (the k experts of the current layer stay). */
function runOpt(trace: Uint16Array, budgetExperts: number): number {
  const n = trace.length;
  const key = (i: number) => Math.floor(i / K) % LAYERS * EXPERTS + trace[i];
  const next = new Int32Array(n);
  const last = new Map<number, number>();
  for (let i = n - 1; i >= 0; i--) {
    const k = key(i);
    next[i] = last.get(k) ?? 0x7fffffff;
    last.set(k, i);
  }
  // max-heap of [nextUse, key] with lazy invalidation
  const heapNext: number[] = [], heapKey: number[] = [];
  const push = (nu: number, k: number) => {
    let i = heapNext.length;
    heapNext.push(nu);
    heapKey.push(k);
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (heapNext[p] >= nu) break;
      heapNext[i] = heapNext[p];
      heapKey[i] = heapKey[p];
      i = p;
    }
    heapNext[i] = nu;
    heapKey[i] = k;
  };
  const pop = () => {
    const nu = heapNext[0], k = heapKey[0];
    const ln = heapNext.pop()!, lk = heapKey.pop()!;
    if (heapNext.length > 0) {
      let i = 0;
      const m = heapNext.length;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= m) break;
        const c = l + 1 < m && heapNext[l + 1] > heapNext[l] ? l + 1 : l;
        if (heapNext[c] <= ln) break;
        heapNext[i] = heapNext[c];
        heapKey[i] = heapKey[c];
        i = c;
      }
      heapNext[i] = ln;
      heapKey[i] = lk;
    }
    return [nu, k] as const;
  };
  const resident = new Map<number, number>(); // key -> current next use
  let hits = 0, total = 0;
  const warmStart = WARMUP * PER_TOKEN;
  for (let b = 0; b < n; b += K) {
    const batchKeys = new Set<number>();
    for (let j = 0; j < K; j++) batchKeys.add(key(b + j));
    for (let j = 0; j < K; j++) {
      const i = b + j, k = key(i);
      const hit = resident.has(k);
      if (i >= warmStart) {
        total++;
        if (hit) hits++;
      }
      if (!hit && resident.size >= budgetExperts) {
        // evict the resident with the furthest next use that is not in the current batch
        const deferred: [number, number][] = [];
        for (;;) {
          const [nu, vk] = pop();
          if (resident.get(vk) !== nu) continue; // stale
          if (batchKeys.has(vk)) {
            deferred.push([nu, vk]);
            continue;
          }
          resident.delete(vk);
          break;
        }
        for (const [nu, vk] of deferred) push(nu, vk);
      }
      resident.set(k, next[i]);
      push(next[i], k);
    }
  }
  return hits / total;
}

// ---- main ---------------------------------------------------------------------------------------

const traces: TraceSpec[] = [
  { name: "zipf-1.0", s: 1.0, driftEvery: 0, repeat: 0 },
  { name: "zipf-1.2", s: 1.2, driftEvery: 0, repeat: 0 },
  { name: "drift-1.1", s: 1.1, driftEvery: 512, repeat: 0.3 },
];
const budgets = [0.25, 0.5, 1.0];
const total = LAYERS * EXPERTS;
const tok = (n: number) => n * PER_TOKEN; // half-lives below, in accesses
const policies: { name: string; make: () => EvictionPolicy }[] = [
  { name: "LRU", make: () => new LruPolicy() },
  ...[16, 64, 128, 256, 1024].map((hl) => ({ name: `heat hl=${hl}tok`, make: () => new HeatPolicy({ halfLife: tok(hl) }) })),
  { name: "heat hl=128tok no-hist", make: () => new HeatPolicy({ halfLife: tok(128), rememberEvicted: false }) },
];

const timerNs = timerOverheadNs();
console.log(
  `vkmoe expert-cache bench: ${LAYERS} layers x ${EXPERTS} experts, k=${K}, ${TOKENS} tokens (${WARMUP} warm-up), ` +
    `expert ${(EXPERT_BYTES / 1e6).toFixed(2)} MB, all experts ${(total * EXPERT_BYTES / 1e9).toFixed(1)} GB; ` +
    `heat half-lives in tokens (x ${PER_TOKEN} accesses); timer overhead ${timerNs.toFixed(0)} ns subtracted`,
);

// perspective for the miss cost: one host memcpy of an expert
{
  const a = new Uint8Array(EXPERT_BYTES), b = new Uint8Array(EXPERT_BYTES);
  b.set(a);
  const t0 = performance.now();
  for (let i = 0; i < 50; i++) b.set(a);
  console.log(`(for scale: one ${(EXPERT_BYTES / 1e6).toFixed(1)} MB host memcpy takes ${(((performance.now() - t0) / 50) * 1000).toFixed(0)} us)`);
}

console.log("");
console.log("| trace | budget | policy | hit rate | OPT | evict/token | GB up/token | ns/hit | ns/miss |");
console.log("|---|---|---|---|---|---|---|---|---|");
const summary = new Map<string, number[]>();
for (const spec of traces) {
  const trace = makeTrace(spec, SEED * 1000 + spec.name.length);
  for (const frac of budgets) {
    const cap = Math.round(total * frac);
    const opt = runOpt(trace, cap);
    for (const p of policies) {
      const r = runPolicy(trace, cap, p.make(), timerNs);
      const list = summary.get(p.name) ?? [];
      if (frac < 1) list.push(r.hitRate);
      summary.set(p.name, list);
      console.log(
        `| ${spec.name} | ${(frac * 100).toFixed(0)}% | ${p.name} | ${(r.hitRate * 100).toFixed(2)}% | ${(opt * 100).toFixed(2)}% | ` +
          `${r.evictionsPerToken.toFixed(1)} | ${r.gbPerToken.toFixed(3)} | ${r.hitNs.toFixed(0)} | ${Number.isNaN(r.missNs) ? "-" : r.missNs.toFixed(0)} |`,
      );
    }
  }
}

console.log("");
console.log("Mean hit rate over the 25% and 50% budgets of all traces:");
let best = "", bestRate = -1;
for (const [name, rates] of summary) {
  const mean = rates.reduce((a, b) => a + b, 0) / rates.length;
  console.log(`  ${name.padEnd(24)} ${(mean * 100).toFixed(2)}%`);
  if (mean > bestRate) {
    bestRate = mean;
    best = name;
  }
}
console.log(`Recommended default by this measurement: ${best}`);
