// GGML-block MoE call benchmark (GgmlExpertKernels: moe_ggml gate+up, down, moe_sum) against the
// read bandwidth measured in the same run and the q4 MoE call of the same shape (MoeBackend's GPU
// layer, its own command buffer between timestamps: LayerTimer).
//
// Per model shape (Qwen3-30B-A3B: D 2048, I 768, E 128, top-8; Qwen3.6-35B-A3B-like: D 2048,
// I 512, E 256, top-8), format pair (gate/up, down: Q4_K/Q6_K, Q4_K/Q4_K, Q5_0/Q5_0, Q6_K/Q6_K)
// and S (1, 4, 64), one table row:
//   µs/call    GPU time of one call: a batch of calls in one command buffer (a compute barrier
//              between calls, as in the graph) between two timestamps, best of 3, divided by the
//              calls. The calls rotate over 16 random routings, each with its own work list, so an
//              expert read by a call was last read 15 calls (hundreds of MB) earlier: from DRAM.
//   GB/s       expert bytes the call reads (distinct experts x an expert's bytes) / µs, and its share
//              of the device read bandwidth (stream_read, same run)
//   graph µs   S <= 4: the decode graph's call (dec_route's list, item u = slot u: down sums each
//              token's slots, two dispatches instead of three)
//   q4 µs      the q4 MoE call of the same shape (MoeBackend, one layer, GPU timestamps, median)
//   bun scripts/bench-moe-ggml.ts [--quick] [--no-q4] [--calls N] [--wg N] [--tokens N] [--rows N]
//     --quick    S=1 and 4, the first pair and shape (a CPU Vulkan device: also a small E)
//     --slices   grouped lists (S > 4) on moe_ggml's slice kernel instead of moe_ggml_rows
//     --rows-tokens N  moe_ggml_rows' slots per register chunk (default 8); --rows-lanes N its lanes a row (1, 2, 4);
//     --rows-per-lane N  moe_ggml_rows_idp's rows a lane (1..4, default 1)
//     --prefill  S=64 only (a prompt chunk), the first pair, both shapes: for sweeping the options
//     --idp      grouped lists (S > 4) also on the integer-dot rows kernel (moe_ggml_rows_idp, x and h
//                quantized first), in the same run: "idp µs" and "float/idp" columns; and with
//                rowsPrefetch (a lane's next slice read before the current one is computed): "idp pf µs"
//     --cm       grouped lists (S > 4) also on the matrix cores (moe_ggml_cm), in the same run: "cm µs",
//                "float/cm" and, with --idp, "idp/cm" (needs cooperative matrices: VKMOE_COOPMAT)
//     --sizes A,B,..  the S values (1..512) instead of the default ones
//     --item-slots N  grouped lists' items hold at most N slots (the graph's dec_group_experts maxSlots:
//                8); default: one item an expert
//     --cm-slots A,B,..  with --cm: moe_ggml_cm's slots a tile (8, 16, 32, 64; default 8), a column
//                each; its lists' items hold at most that many slots
//     --calls N  calls per timed batch (default 64; 4 on a CPU device)
//     --wg N, --tokens N, --rows N  GgmlExpertKernelOptions workgroupSize / tokensPerChunk /
//                rowsPerWorkgroup (both modes; default: the kernels', rows from each row length)
import { readConfig } from "../src/config.ts";
import { MoeBackend } from "../src/moe/backend.ts";
import { CM_SLOT_TILES, ExpertQuantScratch, GgmlExpertKernels, GgmlExpertLayer, ggmlExpertBytes, writeWorkList, type GgmlExpertTensors } from "../src/moe/ggml-experts.ts";
import { WorkList, type Routing } from "../src/moe/routing.ts";
import { GGML_BLOCK_LAYOUTS, ggmlBlockTensor, type GgmlBlockType } from "../src/quant/ggml-blocks.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { describeDevice } from "../src/vk/banner.ts";
import { VulkanContext } from "../src/vk/context.ts";
import { Buffer, uploadBytes, type Device } from "../src/vk/index.ts";
import { Args, fail } from "./lib/cli.ts";
import { LayerTimer, readBandwidth, timeOnGpu } from "./lib/gpu-time.ts";
import { preloadExperts } from "./lib/moe-setup.ts";
import { distinctExperts, expertBytes, expertShapeOf, fillRandomWords, QWEN3_30B_A3B, QWEN36_35B_A3B, randomActivations, randomExpert, RoutingGenerator, type ModelShape } from "./lib/synthetic.ts";
import { fmt, formatTable, median } from "./lib/table.ts";

const SCRIPT = "bench-moe-ggml";
const opts = new Args(SCRIPT, { flags: ["--quick", "--prefill", "--slices", "--no-q4", "--idp", "--cm"], ints: ["--calls", "--wg", "--tokens", "--rows", "--rows-tokens", "--rows-lanes", "--rows-per-lane", "--sizes", "--item-slots", "--cm-slots"] });
const quick = opts.flag("--quick");
const prefillOnly = opts.flag("--prefill");
const withQ4 = !opts.flag("--no-q4");
const wgArg = opts.int("--wg", 1, 1024);
const tokensArg = opts.int("--tokens", 1, 8);
const rowsArg = opts.int("--rows", 1, 8);
const rowsTokensArg = opts.int("--rows-tokens", 1, 8);
const slices = opts.flag("--slices");
const rowsLanesArg = opts.int("--rows-lanes", 1, 4);
const rowsPerLaneArg = opts.int("--rows-per-lane", 1, 4);
const withIdp = opts.flag("--idp");
const withCm = opts.flag("--cm");

const env = readConfig();
using ctx = new VulkanContext(withIdp ? { integerDotProduct: "on" } : {}, env);
const device = ctx.device;
if (withIdp && (!device.enabled.integerDotProduct || !device.info.subgroup.shuffle)) fail(SCRIPT, `--idp: ${device.info.name} lacks shaderIntegerDotProduct or subgroup shuffles`);
if (withCm && !device.enabled.cooperativeMatrix) fail(SCRIPT, `--cm: cooperative matrices are not enabled on ${device.info.name} (${device.decisions.find((d) => d.name === "cooperativeMatrix")?.reason ?? "no decision"})`);
const cpuDevice = device.info.type === 4;
const calls = opts.int("--calls", 1, 4096) ?? (cpuDevice ? 4 : 64);
const ROUTINGS = 16;
const SIZES = opts.ints("--sizes", 1, 512) ?? (quick ? [1, 4] : prefillOnly ? [64] : [1, 4, 64]);
const itemSlots = opts.int("--item-slots", 1, 512) ?? 0;
const cmSlots = opts.ints("--cm-slots", 8, 64) ?? [8];
for (const n of cmSlots) if (!(CM_SLOT_TILES as readonly number[]).includes(n)) fail(SCRIPT, `--cm-slots: ${n} is not one of ${CM_SLOT_TILES.join(", ")}`);
const PAIRS: [GgmlBlockType, GgmlBlockType][] = quick || prefillOnly ? [["Q4_K", "Q6_K"]] : [["Q4_K", "Q6_K"], ["Q4_K", "Q4_K"], ["Q5_0", "Q5_0"], ["Q6_K", "Q6_K"]];
const SHAPES: ModelShape[] = quick ? [QWEN3_30B_A3B] : [QWEN3_30B_A3B, QWEN36_35B_A3B];
// Routed experts only here (the GGML call has no shared expert): the Qwen3.6 shape without it.
const routedOnly = (m: ModelShape): ModelShape => ({ ...m, shared: false, ...(cpuDevice && quick ? { experts: 16 } : {}) });

console.log(describeDevice(device.info).slice(0, 2).join("\n"));
if (!cpuDevice) readBandwidth(device, 1024 * 2 ** 20, 150); // ~0.5 s of reads: clocks up
const bw = readBandwidth(device, cpuDevice ? 64 * 2 ** 20 : 1024 * 2 ** 20, cpuDevice ? 2 : 7);
console.log(`read bandwidth ${fmt(bw.gbs)} GB/s (stream_read over ${(bw.bytes / 2 ** 20).toFixed(0)} MiB x${bw.passes})`);

/** One expert's tensors, random quants with finite f16 scales (every expert of the layer shares them: the device copies are distinct). */
function randomTensors(D: number, I: number, gu: GgmlBlockType, dn: GgmlBlockType, seed: number): GgmlExpertTensors {
  const make = (type: GgmlBlockType, rows: number, cols: number, s: number) => {
    const { blockElements, blockBytes, halfOffsets } = GGML_BLOCK_LAYOUTS[type];
    const bytes = new Uint8Array(Math.ceil((rows * (cols / blockElements) * blockBytes) / 4) * 4);
    fillRandomWords(new Uint32Array(bytes.buffer), s);
    const half = f32ToF16Bits(2 ** -8);
    for (let p = 0; p + blockBytes <= bytes.length; p += blockBytes) for (const h of halfOffsets) { bytes[p + h] = half & 0xff; bytes[p + h + 1] = half >> 8; }
    return ggmlBlockTensor(type, bytes.subarray(0, rows * (cols / blockElements) * blockBytes), rows, cols);
  };
  return { gate: make(gu, I, D, seed), up: make(gu, I, D, seed + 1), down: make(dn, D, I, seed + 2) };
}

interface CallSet extends Disposable {
  items: number[];
  bytes: number;
  record(k: GgmlExpertKernels, cb: Parameters<GgmlExpertKernels["record"]>[0], i: number): void;
}

/** ROUTINGS work lists of S tokens on `layer`, each in its own device buffers; x, h, ypair, y shared. */
function callSet(dev: Device, layer: GgmlExpertLayer, model: ModelShape, S: number, slotOrder = false, maxSlots = itemSlots): CallSet {
  const k = model.topK, D = layer.D, I = layer.I, slots = S * k;
  const owned = new DisposableStack();
  const buf = (bytes: number) => owned.use(new Buffer(dev, { size: BigInt(Math.max(16, bytes)), memory: "device" }));
  const upload = (b: Buffer, a: ArrayBufferView) => uploadBytes(dev, b, 0n, new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
  const x = buf(4 * S * D), h = buf(4 * slots * I), ypair = buf(4 * slots * D), y = buf(4 * S * D), done = buf(16);
  const quantized = withIdp ? owned.use(new ExpertQuantScratch(dev, D, I, S, k)) : undefined;
  upload(x, randomActivations(S, D, 7 + S));
  const router = new RoutingGenerator(model, 0x6e11 + S);
  const lists: { work: Buffer; pairs: Buffer; slotWeight: Buffer; items: number; r: Routing }[] = [];
  for (let i = 0; i < ROUTINGS; i++) {
    const r = router.next(S);
    const list = new WorkList(model.experts, slots);
    list.build(r, model.experts, false);
    let work: Uint32Array = new Uint32Array(4 * (1 + (slotOrder ? slots : list.items)));
    const pairs = new Uint32Array(slots), sw = new Float32Array(slots);
    writeWorkList(list, S, i, work, pairs, sw);
    let items = list.items;
    if (!slotOrder && maxSlots > 0) {
      work = splitItems(work, maxSlots);
      items = work[2]!;
    }
    if (slotOrder) {
      // dec_route's list in the decode graph: item u = slot u, one slot each
      work.set([S, k, slots, i]);
      for (let u = 0; u < slots; u++) {
        work.set([r.ids[u]!, u, u, 1], 4 * (1 + u));
        pairs[u] = u;
        sw[u] = r.weights[u]!;
      }
    }
    const l = { work: buf(work.byteLength), pairs: buf(pairs.byteLength), slotWeight: buf(sw.byteLength), items: slotOrder ? slots : items, r };
    upload(l.work, work);
    upload(l.pairs, pairs);
    upload(l.slotWeight, sw);
    lists.push(l);
  }
  const per = ggmlExpertBytes(D, I, layer.gateUpType, layer.downType);
  return {
    items: lists.map((l) => l.items),
    bytes: (lists.reduce((n, l) => n + distinctExperts(l.r, false), 0) / lists.length) * per,
    record(kernels, cb, i) {
      const l = lists[i % lists.length]!;
      kernels.record(cb, { layer, S, items: l.items, slotsPerToken: k, x, work: l.work, pairs: l.pairs, slotWeight: l.slotWeight, h, ypair, y, done, quantized, ...(slotOrder && { singleSlotItems: true, itemPerSlot: true }) });
    },
    [Symbol.dispose]: () => owned.dispose(),
  };
}

/** A work list whose items hold at most `max` slots each (as dec_group_experts' maxSlots splits them). */
function splitItems(work: Uint32Array, max: number): Uint32Array {
  const out: number[] = [...work.subarray(0, 4)];
  for (let u = 0; u < work[2]!; u++) {
    const [e, , start, count] = work.subarray(4 * (1 + u), 4 * (2 + u));
    for (let j = 0; j < count!; j += max) out.push(e!, 0, start! + j, Math.min(max, count! - j));
  }
  out[2] = out.length / 4 - 1;
  return Uint32Array.from(out);
}

function timeCalls(kernels: GgmlExpertKernels, set: CallSet): number {
  const body = (cb: Parameters<GgmlExpertKernels["record"]>[0]) => {
    for (let i = 0; i < calls; i++) {
      set.record(kernels, cb, i);
      cb.barrier("computeToCompute");
    }
  };
  timeOnGpu(device, body, 1); // pipelines, first touch
  // The layer's upload and the pipelines leave the GPU idle long enough for its clocks to drop
  // (an H200 idles at ~345 MHz).
  if (!cpuDevice) readBandwidth(device, 256 * 2 ** 20, 60);
  return timeOnGpu(device, body, cpuDevice ? 1 : 3) / calls / 1e3;
}

/** The q4 MoE call (MoeBackend's GPU layer) of the model's routed shape: GPU µs per S, median. */
function q4Us(model: ModelShape): Map<number, number> {
  const out = new Map<number, number>();
  const shape = expertShapeOf(model);
  const host = randomExpert(shape, 1);
  using gpu = MoeBackend.open({ shape, experts: model.experts, topK: model.topK, layers: 1, shared: false, weights: () => host, log: () => {} }, env);
  if (!gpu.context) return out;
  preloadExperts(gpu, 1, model.experts, () => host);
  using timer = new LayerTimer(gpu);
  const router = new RoutingGenerator(model, 0x4444);
  for (const S of SIZES) {
    const x = randomActivations(S, model.hidden, 3), y = new Float32Array(S * model.hidden);
    for (let i = 0; i < 4; i++) gpu.forward(0, x, router.next(S), y);
    timer.on();
    const us: number[] = [];
    for (let i = 0; i < (cpuDevice ? 2 : 32); i++) {
      gpu.forward(0, x, router.next(S), y);
      us.push(timer.lastNs() / 1e3);
    }
    timer.off();
    out.set(S, median(us));
  }
  console.log(`q4 call: ${model.name}, ${(expertBytes(model) / 1e6).toFixed(2)} MB an expert`);
  return out;
}

const table: string[][] = [["shape", "gate/up, down", "S", "items", "MB read", "µs/call", "GB/s", "of read BW", "graph µs", ...(withIdp ? ["idp µs", "float/idp", "idp pf µs", "float/idp pf"] : []), ...(withCm ? cmSlots.flatMap((n) => [`cm${n} µs`, `float/cm${n}`, ...(withIdp ? [`idp/cm${n}`] : [])]) : []), ...(withQ4 ? ["q4 µs", "ggml/q4"] : [])]];
const options = { maxSets: 256, ...(wgArg !== undefined && { workgroupSize: wgArg }), ...(tokensArg !== undefined && { tokensPerChunk: tokensArg }), ...(rowsArg !== undefined && { rowsPerWorkgroup: rowsArg }), ...(rowsTokensArg !== undefined && { rowsTokensPerChunk: rowsTokensArg }), ...(rowsLanesArg !== undefined && { rowsLanes: rowsLanesArg }), ...(rowsPerLaneArg !== undefined && { rowsPerLane: rowsPerLaneArg }), ...(slices && { rowsForGrouped: false }) };
let shapeLine = "";
for (const full of SHAPES) {
  const model = routedOnly(full);
  const q4 = withQ4 ? q4Us(model) : new Map<number, number>();
  for (const [gu, dn] of PAIRS) {
    const t = randomTensors(model.hidden, model.intermediate, gu, dn, 11);
    using layer = new GgmlExpertLayer(device, Array.from({ length: model.experts }, () => t));
    using kernels = new GgmlExpertKernels(device, { gateUp: gu, down: dn }, options);
    using idpKernels = withIdp ? new GgmlExpertKernels(device, { gateUp: gu, down: dn }, { ...options, integerDot: true }) : undefined;
    using idpPrefetch = withIdp ? new GgmlExpertKernels(device, { gateUp: gu, down: dn }, { ...options, integerDot: true, rowsPrefetch: true }) : undefined;
    using cmKernels = new DisposableStack();
    const cmBy = withCm ? cmSlots.map((n) => cmKernels.use(new GgmlExpertKernels(device, { gateUp: gu, down: dn }, { ...options, matrixCores: true, cmSlots: n }))) : [];
    shapeLine = `kernel: ${kernels.workgroupSize} lanes, ${kernels.tokensPerChunk} slots a chunk; rows per workgroup gate+up ${kernels.rowsPerWorkgroup(model.hidden)}, down ${kernels.rowsPerWorkgroup(model.intermediate)}; grouped lists on ${kernels.rowsForGrouped ? `moe_ggml_rows (lanes a row gate+up ${kernels.rowsLanesFor(model.hidden)}, down ${kernels.rowsLanesFor(model.intermediate)}; ${kernels.rowsTokens} slots a chunk)` : "the slice kernel"} (${model.name})`;
    console.log(shapeLine);
    for (const S of SIZES) {
      using set = callSet(device, layer, model, S);
      const us = timeCalls(kernels, set);
      const gbs = set.bytes / us / 1e3;
      // the decode graph's call (S <= 4: dec_route's list, down summing each token's slots)
      let graphUs = "-";
      if (S <= 4) {
        using bySlot = callSet(device, layer, model, S, true);
        graphUs = fmt(timeCalls(kernels, bySlot));
      }
      const row = [`${model.name} D${model.hidden} I${model.intermediate} E${model.experts}`, `${gu}, ${dn}`, String(S), fmt(median(set.items)), fmt(set.bytes / 1e6), fmt(us), fmt(gbs), `${((100 * gbs) / bw.gbs).toFixed(0)}%`, graphUs];
      // the per-slot lists of S <= 4 stay on the float kernels: only grouped lists take the idp and cm ones
      const idpUs = idpKernels && S > 4 ? timeCalls(idpKernels, set) : undefined;
      if (idpKernels) {
        row.push(idpUs === undefined ? "-" : fmt(idpUs), idpUs === undefined ? "-" : `${(us / idpUs).toFixed(2)}x`);
        const pfUs = S > 4 && idpPrefetch ? timeCalls(idpPrefetch, set) : undefined;
        row.push(pfUs === undefined ? "-" : fmt(pfUs), pfUs === undefined ? "-" : `${(us / pfUs).toFixed(2)}x`);
      }
      for (const cm of cmBy) {
        let cmUs: number | undefined;
        if (S > 4) {
          using cmSet = callSet(device, layer, model, S, false, cm.cmSlots);
          cmUs = timeCalls(cm, cmSet);
        }
        row.push(cmUs === undefined ? "-" : fmt(cmUs), cmUs === undefined ? "-" : `${(us / cmUs).toFixed(2)}x`);
        if (withIdp) row.push(cmUs === undefined || idpUs === undefined ? "-" : `${(idpUs / cmUs).toFixed(2)}x`);
      }
      if (withQ4) {
        const q = q4.get(S);
        row.push(q === undefined ? "-" : fmt(q), q === undefined ? "-" : `${(us / q).toFixed(2)}x`);
      }
      table.push(row);
      console.log(`  ${row.join(" | ")}`);
    }
  }
}
console.log(`\n${new Date().toISOString().slice(0, 10)}; ${calls} calls a batch over ${ROUTINGS} routings; µs/call from GPU timestamps (best of batches); MB read = distinct experts x an expert's bytes; ggml/q4 = ggml µs / q4 µs`);
console.log(formatTable(table));
