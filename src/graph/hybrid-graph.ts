/**
 * The whole Qwen3.5 MoE token on the GPU (the hybrid Gated DeltaNet / gated attention family, as
 * src/model/hybrid-decoder.ts computes it on the CPU): recorded once per token count and replayed,
 * one submit and one wait per token or prompt chunk. Per layer
 *   RMSNorm (+ the residual; the (1 + w) weights are stored as the multiplier at load) →
 *   linear layers: qkv, z, a, b → dec_conv1d (its rolling state) → dec_delta_rule (q/k L2 norms,
 *     the gates, the recurrent state, the gated RMSNorm with z fused) → out_proj (the recurrent
 *     path: the conv run by the delta rule itself, its state moved on beside out_proj, CONV_FOLD);
 *   full layers: q, gate (q_proj's rows split per head at load), k, v → q/k norms + partial RoPE +
 *     f16 KV append (dec_rope_kv) → split attention (+ combine) → × sigmoid(gate) → o_proj (decode
 *     tokens: the rope step folded into the attention's pass 1, ROPE_FOLD);
 *   → RMSNorm (+ residual) → router, the shared expert's gate/up/scale → dec_route, SwiGLU →
 *   the MoE call, the shared expert's down → += sigmoid(scale) · shared. Decode calls of the fused
 *   experts' kernel whose shared expert has the routed experts' shape (VKMOE_SHARED_SLOT): the
 *   shared expert is one more slot a token of that call, and the router GEMV does the post norm in
 *   each workgroup and the route in its last (VKMOE_ROUTE_FOLD): RMSNorm + router + route → the MoE
 *   call. (VKMOE_ROUTE_FOLD=route also folds the route beside the shared expert's own GEMVs, its
 *   gate/up fused with the SwiGLU: slower on the H100, so not by default.)
 * then the final norm, lm_head and nothing / the logits / the greedy argmax, as DecodeGraph.
 *
 * Split mode (no stage: the experts are not all resident), as DecodeGraph's: one recording per
 * layer, each ending with the normalised hidden state and the router logits copied to host memory
 * and the shared expert computed (it is dense); the host routes and runs the layer's experts
 * (HostExperts: the MoE layer's per-layer call) and writes their sum to `ffnHost`, which the next
 * layer's recording (or the head's) copies in and adds sigmoid(scale) · shared to before its input
 * norm takes it. The sequence's KV cache and states stay on the device as in resident mode.
 *
 * llama.cpp's GGUF holds the linear layers' value heads tiled ([g0v0, g1v0, g0v1, ...], see
 * qwen35-weights.ts): the graph keeps its matrices in the file's order (no requantization, no
 * gather) and runs the delta rule once per value head of each key head (r = valueHeads / keyHeads
 * dispatches of keyHeads heads each, contiguous in that order); conv1d, A and dt_bias are put back
 * in the file's order at load.
 *
 * `HybridGraph` holds what a model needs once; `HybridSequence` one sequence's state (the full
 * layers' KV cache, the linear layers' conv and recurrent states) and its recordings; a
 * `HybridBatch` (hybrid-batch.ts) several sequences' states, run together by `recordBatch`.
 * Sequences and batches run one at a time (each call waits), so they share the scratch.
 */
import { readConfig } from "../config.ts";
import { InvalidArgumentError } from "../errors.ts";
import { ArgmaxKernel, ARGMAX_NONE } from "../kernels/decoder/argmax.ts";
import { ATTENTION_GQA, ATTENTION_HEAD_DIMS, DecoderAttention, MAX_ATTENTION_TOKENS, type AttentionBinding } from "../kernels/decoder/attention.ts";
import { CONV1D_MAX_KERNEL, Conv1dKernel } from "../kernels/decoder/conv1d.ts";
import { DELTA_RULE_CHUNKED_MIN_S, DELTA_RULE_MAX_S, DeltaRuleChunkedKernel, DeltaRuleKernel, type DeltaRuleArgs } from "../kernels/decoder/delta-rule.ts";
import { DeltaRuleSplitKernel, DeltaRuleSplitScratch } from "../kernels/decoder/delta-rule-split.ts";
import { GatingKernel } from "../kernels/decoder/gating.ts";
import { GemvHalfKernel } from "../kernels/decoder/gemv-half.ts";
import { ROUTER_ROUTE_MAX_S, routerNormTokens, RouterRouteKernel } from "../kernels/decoder/router-route.ts";
import { BATCH_WORDS, RopeKvKernel } from "../kernels/decoder/rope-kv.ts";
import { RouteKernel } from "../kernels/decoder/route.ts";
import { RUN_WORDS, writeRuns, type RunsBinding } from "../kernels/decoder/runs.ts";
import type { MoeGraphStage } from "../moe/graph-stage.ts";
import type { Linear } from "../model/linear.ts";
import { ropeInverseFrequencies } from "../model/ops.ts";
import type { Qwen35MoeConfig } from "../model/qwen35-config.ts";
import { ColumnPermutedLinear, RowPermutedLinear, valueHeadMap, type HybridWeights } from "../model/qwen35-weights.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import type { Device } from "../vk/device.ts";
import { DeviceLostError } from "../vk/errors.ts";
import { Buffer } from "../vk/memory.ts";
import { Fence, QueryPool, Submission } from "../vk/sync.ts";
import { uploadBytes } from "../vk/transfer.ts";
import { GRAPH_MAX_TOKENS, type BatchOutputs, type GraphOutput, type HostExperts } from "./decode-graph.ts";
import { attentionOnMatrixCores } from "../moe/prefill-plan.ts";
import { DeviceLinear, LinearKernels } from "./device-linear.ts";
import { GgmlIdpScratch } from "../kernels/decoder/ggml-gemv.ts";
import { NormFeed } from "./norm-feed.ts";
import { RouterWarm } from "./router-warm.ts";
import { GraphUnsupportedError } from "./errors.ts";
import { selectRows } from "./linear-rows.ts";
import { fenceWaitMode, ReplayWaiter } from "./replay-wait.ts";

const OUTPUTS: readonly GraphOutput[] = ["none", "logits", "argmax"];

interface DeltaNetOnDevice {
  kind: "linear";
  /** Index among the linear layers (its conv and recurrent states). */
  slot: number;
  qkv: DeviceLinear;
  z: DeviceLinear;
  a: DeviceLinear;
  b: DeviceLinear;
  out: DeviceLinear;
  /** Offsets (floats) in the params buffer. */
  conv: number;
  negA: number;
  dtBias: number;
  norm: number;
  /** Delta-rule dispatches: 1 (the Hub's grouped value heads), or valueHeads / keyHeads (llama.cpp's tiled order). */
  groups: number;
}

interface GatedAttentionOnDevice {
  kind: "full";
  /** Index among the full layers (its KV cache). */
  slot: number;
  q: DeviceLinear;
  gate: DeviceLinear;
  k: DeviceLinear;
  v: DeviceLinear;
  o: DeviceLinear;
  qNorm: number;
  kNorm: number;
}

interface LayerOnDevice {
  mixer: DeltaNetOnDevice | GatedAttentionOnDevice;
  inputNorm: number;
  postNorm: number;
  router: DeviceLinear;
  sharedGate: DeviceLinear;
  sharedUp: DeviceLinear;
  sharedDown: DeviceLinear;
  sharedScale: DeviceLinear;
}

/** The matrices that read a layer's input norm (they take its quantized rows on the integer-dot path). */
function normReaders(L: LayerOnDevice): DeviceLinear[] {
  const m = L.mixer;
  return m.kind === "linear" ? [m.qkv, m.z, m.a, m.b] : [m.q, m.gate, m.k, m.v];
}

/** The file's matrix where the weights wrap it in a permutation (llama.cpp's tiled value heads), and whether they did. */
function fileOrder(m: Linear): { linear: Linear; tiled: boolean } {
  if (m instanceof RowPermutedLinear || m instanceof ColumnPermutedLinear) return { linear: m.inner, tiled: true };
  return { linear: m, tiled: false };
}

/** Blocks of `size` back in the file's order: file[map[i]] = hub[i] (map[hub] = file). */
function toFileOrder(hub: Float32Array, map: Int32Array, size: number): Float32Array {
  const out = new Float32Array(hub.length);
  for (let i = 0; i < map.length; i++) out.set(hub.subarray(i * size, (i + 1) * size), map[i]! * size);
  return out;
}

export class HybridGraph implements Disposable {
  readonly device: Device;
  readonly cfg: Qwen35MoeConfig;
  /** undefined: the experts are not all resident, and sequences run split, layer by layer (the host runs the experts). */
  readonly stage: MoeGraphStage | undefined;
  private readonly linears: LinearKernels;
  private readonly layers: LayerOnDevice[] = [];
  private readonly lmHead: DeviceLinear;
  /** Norm weights, conv taps, negA, dt_bias, gated-norm weights: one buffer (the attention's folded head norms read it). */
  readonly params: Buffer;
  private readonly finalNorm: number;
  readonly invFreq: Buffer;
  /** The RMSNorms, and the quantized rows they write for integer-dot readers. */
  private readonly norm: NormFeed;
  /** o_proj's input quantized by the attention's combine, where the o matrices take the integer-dot path. */
  readonly attnQuant: GgmlIdpScratch | undefined;
  /** The recurrent delta rule's output quantized for out_proj, where out_proj reads quantized rows (no quantize step of its own). */
  readonly coreQuant: GgmlIdpScratch | undefined;
  private readonly conv1d: Conv1dKernel;
  private readonly deltaRule: DeltaRuleKernel;
  /** Prompt chunks of DELTA_RULE_CHUNKED_MIN_S tokens or more (not batches); absent where the device's shared memory is too small for it. */
  private readonly deltaRuleChunked: DeltaRuleChunkedKernel | undefined;
  /**
   * Prompt chunks of more than DELTA_RULE_MAX_S tokens: the two-pass delta rule and its scratch (a stage made for such
   * chunks, where the device fits it; VKMOE_DELTA_SPLIT=off: the chunked kernel DELTA_RULE_MAX_S tokens a dispatch).
   */
  private readonly deltaRuleSplit: { kernel: DeltaRuleSplitKernel; scratch: DeltaRuleSplitScratch } | undefined;
  /** The recurrent delta rule runs the conv1d itself (one dependent step fewer a linear layer); VKMOE_CONV_FOLD=off: the separate conv1d step. */
  readonly convFold: boolean;
  private readonly gating: GatingKernel;
  private readonly route: RouteKernel;
  /** The float routers' GEMV, in the shape of `route` and `routerRoute` (not LinearKernels' CPU shape), so that folded and separate steps give the same bits. */
  private readonly routerGemv: GemvHalfKernel;
  /**
   * Decode calls (S <= ROUTER_ROUTE_MAX_S) of a float router: the router GEMV routes the tokens in
   * its last workgroup, so the route step goes (one dependent step fewer a layer). Where the layer's
   * shared expert runs in the experts' call (VKMOE_ROUTE_FOLD auto or route), or, with `route`, where
   * its gate and up fuse (DeviceLinear.fusesGateUp: the SwiGLU in that GEMV's epilogue); undefined
   * with `off` (read from the process env when the graph is made).
   */
  private readonly routerRoute: RouterRouteKernel | undefined;
  /** VKMOE_ROUTE_FOLD as the graph was made with. */
  private readonly routeFoldMode: "auto" | "route" | "off";
  /**
   * The same with the post-attention norm folded in too (VKMOE_ROUTE_FOLD=auto, calls of up to its
   * normTokens tokens, layers whose shared expert runs in the experts' call): one more dependent
   * step fewer a layer.
   */
  private readonly routerRouteNorm: RouterRouteKernel | undefined;
  /** routerRoute's arrival word (0 between calls; the layers' calls are separated by barriers). */
  private readonly routeArrived: Buffer;
  /** The next norm's pipeline run on stand-ins beside each layer's experts, or its router's step where the experts are one step (VKMOE_NORM_WARM, read when the graph is made). */
  private readonly warmNorms: boolean;
  /** The post norm + router + route step run on stand-ins beside each layer's delta rule or attention (VKMOE_ROUTER_WARM, read when the graph is made; where that step folds the norm in). */
  private readonly routerWarm: RouterWarm | undefined;
  private readonly argmax: ArgmaxKernel;
  readonly fullLayers: number;
  readonly linearLayers: number;
  /** Floats of one linear layer's conv state and recurrent state. */
  readonly convStateFloats: number;
  readonly deltaStateFloats: number;
  private readonly owned = new DisposableStack();
  readonly s: Record<
    "embed" | "positions" | "h" | "xn" | "o" | "ffn" | "mixed" | "conv" | "z" | "a" | "b" | "core" | "q" | "gate" | "k" | "v" | "attn" |
    "routerLogits" | "sharedG" | "sharedU" | "sharedOut" | "sharedScale" | "logits" | "logitsHost" | "result" | "chosen" | "runs" |
    "xnHost" | "routerHost" | "ffnHost",
    Buffer
  >;
  readonly views: {
    embed: Float32Array; positions: Uint32Array; logits: Float32Array; result: Uint32Array; resultValue: Float32Array; chosen: Int32Array; runs: Uint32Array;
    /** Split runs: the host's copies of xn and the router logits, and the routed experts' sum it writes back. */
    xn: Float32Array; router: Float32Array; ffn: Float32Array;
  };
  /** Fault hook for tests: the next replay reports a lost device (after really running). */
  injectDeviceLost = false;
  readonly live = new Set<HybridSequence>();
  /** Batches not yet disposed (likewise: their recordings use the scratch). */
  readonly liveBatches = new Set<Disposable>();

  /** Tokens one replay runs at most: the stage's maxTokens (GRAPH_MAX_TOKENS, or the prefill plan's longer prompt chunks). */
  readonly maxTokens: number;

  /** `maxTokens`: what the stage was made for (past MAX_ATTENTION_TOKENS a multiple of it: the attention and the delta rule run that many tokens at a time). */
  constructor(device: Device, cfg: Qwen35MoeConfig, private readonly weights: HybridWeights, stage: MoeGraphStage | undefined, maxTokens = GRAPH_MAX_TOKENS) {
    this.device = device;
    this.cfg = cfg;
    this.stage = stage;
    if (!Number.isInteger(maxTokens) || maxTokens < 1 || (maxTokens > MAX_ATTENTION_TOKENS && maxTokens % MAX_ATTENTION_TOKENS !== 0)) {
      throw new InvalidArgumentError(`maxTokens must be 1..${MAX_ATTENTION_TOKENS} or a multiple of it, got ${maxTokens}`);
    }
    this.maxTokens = maxTokens;
    const { hidden: D, heads: H, kvHeads: KV, headDim: hd, vocab: V, experts: E, topK: K, sharedIntermediate: F } = cfg;
    const { keyHeads: KH, valueHeads: VH, keyDim: kd, valueDim: vd, convKernel } = cfg.linear;
    const Kd = KH * kd, Vd = VH * vd, C = 2 * Kd + Vd;
    if (!(ATTENTION_HEAD_DIMS as readonly number[]).includes(hd)) throw new GraphUnsupportedError(`head_dim ${hd}: the GPU attention takes ${ATTENTION_HEAD_DIMS.join(", ")}`);
    if (!(ATTENTION_GQA as readonly number[]).includes(H / KV)) throw new GraphUnsupportedError(`${H / KV} query heads per KV head: the GPU attention takes ${ATTENTION_GQA.join(", ")}`);
    if (cfg.rotaryDim % 4 !== 0 || cfg.rotaryDim > hd) throw new GraphUnsupportedError(`a rotary dim of ${cfg.rotaryDim}: the GPU RoPE takes multiples of 4 up to head_dim`);
    if (convKernel > CONV1D_MAX_KERNEL) throw new GraphUnsupportedError(`a conv kernel of ${convKernel}: the GPU conv1d takes up to ${CONV1D_MAX_KERNEL}`);
    this.fullLayers = cfg.layerTypes.filter((t) => t === "full").length;
    this.linearLayers = cfg.layers - this.fullLayers;
    this.linears = this.owned.use(new LinearKernels(device));
    try {
      const up = (name: string, l: Linear, floatKernel?: GemvHalfKernel) => this.own(new DeviceLinear(this.linears, name, l, floatKernel));
      const routeShape = { workgroupSize: 128, rowsPerWorkgroup: 4, useSubgroup: device.info.subgroup.arithmetic };
      this.routerGemv = this.own(new GemvHalfKernel(device, { ...routeShape, maxSets: 256 }));
      const parts: Float32Array[] = [];
      let at = 0;
      const place = (w: Float32Array) => {
        parts.push(w);
        const o = at;
        at += w.length;
        return o;
      };
      const seen = { linear: 0, full: 0 };
      weights.layers.forEach((lw, l) => {
        let mixer: LayerOnDevice["mixer"];
        if (lw.type === "linear") {
          const w = lw.linear!;
          const qkv = fileOrder(w.qkv);
          const tiled = qkv.tiled && VH !== KH;
          // the small float tensors are held in the Hub's order: back to the file's where its matrices are
          const conv = tiled ? toFileOrder(w.conv, valueHeadMap(KH, VH, vd, 2 * Kd), convKernel) : w.conv;
          const heads = tiled ? valueHeadMap(KH, VH, 1) : undefined;
          mixer = {
            kind: "linear", slot: seen.linear++,
            qkv: up(`layer ${l} in_proj_qkv`, qkv.linear), z: up(`layer ${l} in_proj_z`, fileOrder(w.z).linear),
            a: up(`layer ${l} in_proj_a`, fileOrder(w.a).linear), b: up(`layer ${l} in_proj_b`, fileOrder(w.b).linear),
            out: up(`layer ${l} out_proj`, fileOrder(w.out).linear),
            conv: place(conv), negA: place(heads ? toFileOrder(w.negA, heads, 1) : w.negA), dtBias: place(heads ? toFileOrder(w.dtBias, heads, 1) : w.dtBias),
            norm: place(w.norm), groups: tiled ? VH / KH : 1,
          };
        } else {
          const w = lw.attention!;
          // q_proj's rows per head: its query's hd, then its gate's: two matrices of the same bytes
          const rows = (gate: boolean) => Array.from({ length: H * hd }, (_, i) => Math.floor(i / hd) * 2 * hd + (gate ? hd : 0) + (i % hd));
          mixer = {
            kind: "full", slot: seen.full++,
            q: up(`layer ${l} q_proj (query)`, selectRows(w.q, rows(false), `layer ${l} q_proj`)),
            gate: up(`layer ${l} q_proj (gate)`, selectRows(w.q, rows(true), `layer ${l} q_proj`)),
            k: up(`layer ${l} k_proj`, w.k), v: up(`layer ${l} v_proj`, w.v), o: up(`layer ${l} o_proj`, w.o),
            qNorm: place(w.qNorm), kNorm: place(w.kNorm),
          };
        }
        const sh = lw.shared;
        this.layers.push({
          mixer, inputNorm: place(lw.inputNorm), postNorm: place(lw.postNorm),
          router: up(`layer ${l} router`, lw.router, this.routerGemv),
          sharedGate: up(`layer ${l} shared gate_proj`, sh.gate), sharedUp: up(`layer ${l} shared up_proj`, sh.up),
          sharedDown: up(`layer ${l} shared down_proj`, sh.down), sharedScale: up(`layer ${l} shared_expert_gate`, sh.scale),
        });
      });
      this.finalNorm = place(weights.finalNorm);
      this.lmHead = up("lm_head", weights.lmHead);
      if (this.layers.some((L) => L.mixer.kind === "full" && L.mixer.o.takesQuantized(1))) {
        this.attnQuant = this.own(new GgmlIdpScratch(device, cfg.heads * cfg.headDim, this.linears.quantizedTokens));
      }
      if (this.layers.some((L) => L.mixer.kind === "linear" && L.mixer.out.takesQuantized(1))) {
        this.coreQuant = this.own(new GgmlIdpScratch(device, Vd, this.linears.quantizedTokens));
      }
      const data = new Float32Array(at);
      let o = 0;
      for (const p of parts) data.set(p, (o += p.length) - p.length);
      this.params = this.buffer(4 * at);
      uploadBytes(device, this.params, 0n, new Uint8Array(data.buffer));
      const inv = ropeInverseFrequencies(cfg.rotaryDim, cfg.ropeTheta, cfg.ropeFrequencies);
      this.invFreq = this.buffer(4 * inv.length);
      uploadBytes(device, this.invFreq, 0n, new Uint8Array(inv.buffer, inv.byteOffset, inv.byteLength));
      this.norm = this.own(new NormFeed(this.linears, cfg.hidden));
      this.conv1d = this.own(new Conv1dKernel(device, convKernel));
      this.deltaRule = this.own(new DeltaRuleKernel(device, { keyDim: kd, valueDim: vd }, { convKernel }));
      // from the process env when the graph is made, as the RoPE fold's switch
      this.convFold = readConfig().VKMOE_CONV_FOLD !== "off";
      const chunkedFits = DeltaRuleChunkedKernel.sharedBytes(16) <= device.info.limits.maxComputeSharedMemorySize && device.info.limits.maxComputeWorkGroupInvocations >= 256;
      this.deltaRuleChunked = chunkedFits ? this.own(new DeltaRuleChunkedKernel(device, { keyDim: kd, valueDim: vd })) : undefined;
      const splitFits = DeltaRuleSplitKernel.sharedBytes(kd) <= device.info.limits.maxComputeSharedMemorySize && device.info.limits.maxComputeWorkGroupInvocations >= 256;
      if (chunkedFits && splitFits && maxTokens > DELTA_RULE_MAX_S && readConfig().VKMOE_DELTA_SPLIT !== "off") {
        const kernel = this.own(new DeltaRuleSplitKernel(device, { keyDim: kd, valueDim: vd }));
        this.deltaRuleSplit = { kernel, scratch: this.own(kernel.scratch(maxTokens, VH)) };
      }
      this.gating = this.own(new GatingKernel(device, { maxSets: 64 }));
      this.route = this.own(new RouteKernel(device, { workgroupSize: routeShape.workgroupSize, useSubgroup: routeShape.useSubgroup }));
      // the route fold where the shared expert runs in the experts' call (auto, route); beside its own GEMVs (its
      // gate/up fused) only when asked (route): slower there on the H100 (docs/measurements.md, 2026-12-07)
      this.routeFoldMode = readConfig().VKMOE_ROUTE_FOLD;
      const slot = (l: number) => stage?.runsShared?.(l, 1) === true;
      const foldable = (L: LayerOnDevice, l: number) => L.router.floatWeights !== undefined && (slot(l) || (this.routeFoldMode === "route" && L.sharedGate.fusesGateUp(L.sharedUp, 1)));
      this.routerRoute = this.routeFoldMode !== "off" && this.layers.some(foldable) ? this.own(new RouterRouteKernel(device, { ...routeShape, maxSets: cfg.layers })) : undefined;
      this.routerRouteNorm = this.routerRoute && this.routeFoldMode === "auto" && this.layers.some((_, l) => slot(l)) && routerNormTokens(device, D, routeShape.workgroupSize, routeShape.rowsPerWorkgroup) > 0
        ? this.own(new RouterRouteKernel(device, { ...routeShape, normCols: D, maxSets: 2 * cfg.layers })) // each layer's call and its warm
        : undefined;
      this.warmNorms = readConfig().VKMOE_NORM_WARM === "on";
      this.routerWarm = this.routerRouteNorm && readConfig().VKMOE_ROUTER_WARM === "on" ? this.own(new RouterWarm(device, D, cfg.experts, cfg.topK)) : undefined;
      this.routeArrived = this.buffer(16);
      uploadBytes(device, this.routeArrived, 0n, new Uint8Array(16));
      this.argmax = this.own(new ArgmaxKernel(device, { maxV: V }));
      this.convStateFloats = C * (convKernel - 1);
      this.deltaStateFloats = this.deltaRule.stateFloats(VH);
      const T = maxTokens, b = (floats: number) => this.buffer(4 * floats);
      this.s = {
        embed: this.buffer(4 * T * D, "upload"), positions: this.buffer(4 * (BATCH_WORDS + T), "upload"),
        h: b(T * D), xn: b(T * D), o: b(T * D), ffn: b(T * D),
        mixed: b(T * C), conv: b(T * C), z: b(T * Vd), a: b(T * VH), b: b(T * VH), core: b(T * Vd),
        q: b(T * H * hd), gate: b(T * H * hd), k: b(T * KV * hd), v: b(T * KV * hd), attn: b(T * H * hd),
        routerLogits: b(T * E), sharedG: b(T * F), sharedU: b(T * F), sharedOut: b(T * D), sharedScale: b(T),
        logits: b(V), logitsHost: this.buffer(4 * V, "readback"), result: this.buffer(16, "readback"),
        chosen: this.buffer(4 * cfg.layers * T * K, "readback"),
        runs: this.buffer(4 * RUN_WORDS, "upload"),
        // split runs only, small (3 x 64 rows); the resident graph leaves them idle
        xnHost: this.buffer(4 * T * D, "readback"), routerHost: this.buffer(4 * T * E, "readback"), ffnHost: this.buffer(4 * T * D, "upload"),
      };
      this.views = {
        embed: new Float32Array(this.s.embed.host(), 0, T * D), positions: new Uint32Array(this.s.positions.host(), 0, BATCH_WORDS + T),
        logits: new Float32Array(this.s.logitsHost.host(), 0, V), result: new Uint32Array(this.s.result.host(), 0, 4),
        resultValue: new Float32Array(this.s.result.host(), 4, 1), chosen: new Int32Array(this.s.chosen.host(), 0, cfg.layers * T * K),
        runs: new Uint32Array(this.s.runs.host(), 0, RUN_WORDS),
        xn: new Float32Array(this.s.xnHost.host(), 0, T * D), router: new Float32Array(this.s.routerHost.host(), 0, T * E),
        ffn: new Float32Array(this.s.ffnHost.host(), 0, T * D),
      };
      this.views.positions.fill(0);
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  private own<T extends Disposable>(d: T): T {
    return this.owned.use(d);
  }

  private buffer(bytes: number, memory: "device" | "upload" | "readback" = "device"): Buffer {
    return this.own(new Buffer(this.device, { size: BigInt(Math.max(16, Math.ceil(bytes / 16) * 16)), memory, priority: 1 }));
  }

  /** A sequence of up to ctx tokens: its KV cache, conv and recurrent states in device memory (zeroed). */
  sequence(ctx: number, options: { timing?: boolean; hostExperts?: HostExperts } = {}): HybridSequence {
    const seq = new HybridSequence(this, ctx, options);
    this.live.add(seq);
    return seq;
  }

  /** Writes the tokens' embeddings and the first one's position into the mapped inputs. */
  writeInput(ids: ArrayLike<number>, position: number): void {
    const D = this.cfg.hidden;
    for (let t = 0; t < ids.length; t++) this.weights.embed(ids[t]!, this.views.embed.subarray(t * D, (t + 1) * D));
    this.views.positions[0] = position;
  }

  /**
   * A batched replay's inputs: token t's embedding, position and cache row (its sequence's first
   * row + the position), and the runs table grouping the tokens by their sequence `stateOf[t]`.
   */
  writeBatchInput(ids: ArrayLike<number>, positions: ArrayLike<number>, rows: ArrayLike<number>, stateOf: ArrayLike<number>): void {
    const D = this.cfg.hidden, w = this.views.positions;
    for (let t = 0; t < ids.length; t++) {
      this.weights.embed(ids[t]!, this.views.embed.subarray(t * D, (t + 1) * D));
      w[t] = positions[t]!;
      w[BATCH_WORDS + t] = rows[t]!;
    }
    writeRuns(this.views.runs, stateOf, ids.length);
  }

  /** Records S tokens through every layer (see the module comment) over `state`, ending as `output` asks. Returns the dispatches recorded. */
  recordToken(cb: CommandBuffer, state: SequenceState, output: GraphOutput, S = 1, mark: (op: string) => void = () => {}): number {
    if (!this.stage) throw new InvalidArgumentError("this graph has no MoE stage (its experts are not all resident): run it split, layer by layer");
    return this.record(cb, state, S, { first: 0, end: this.cfg.layers, start: true, split: false, output }, mark);
  }

  /**
   * A split run's part (no stage): layer `layer`'s recording (its dense ops, router and shared
   * expert; xn and the router logits copied to host memory), or with `layer` = cfg.layers the
   * head's (the last layer's experts and shared expert added, the final norm, lm_head, `output`).
   */
  recordSplit(cb: CommandBuffer, state: SequenceState, S: number, layer: number, output: GraphOutput = "none"): number {
    const L = this.cfg.layers;
    if (!Number.isInteger(layer) || layer < 0 || layer > L) throw new InvalidArgumentError(`layer must be an integer in 0..${L}, got ${layer}`);
    return layer === L
      ? this.record(cb, state, S, { first: L, end: L, start: false, split: true, output }, () => {})
      : this.record(cb, state, S, { first: layer, end: layer + 1, start: layer === 0, split: true }, () => {});
  }

  /**
   * Records S tokens of a batch's sequences (`state` holds state.slots of them): token t at its
   * own position and cache row (the positions words, as GraphBatch writes them), the linear
   * layers' kernels on each token's sequence's states (the runs table), every token's logits
   * into `outputs`. Returns the dispatches recorded.
   */
  recordBatch(cb: CommandBuffer, state: SequenceState, S: number, outputs: BatchOutputs, mark: (op: string) => void = () => {}): number {
    if (!this.stage) throw new GraphUnsupportedError("a batch runs every op on the GPU: this graph runs split (not every expert is resident)");
    return this.record(cb, state, S, { first: 0, end: this.cfg.layers, start: true, split: false, batch: outputs }, mark);
  }

  /**
   * Records layers [first, end) of S tokens (`start`: the embeddings copied in first). `split`: each
   * layer ends with xn and the router logits copied to host memory and the shared expert computed,
   * and a layer after the first (or the head) starts by adding the host's experts' sum and the
   * previous layer's shared expert; otherwise the router's top-k and the MoE call run here.
   */
  private record(
    cb: CommandBuffer, state: SequenceState, S: number,
    end: { first: number; end: number; start: boolean; split: boolean; output?: GraphOutput; batch?: BatchOutputs },
    mark: (op: string) => void,
  ): number {
    if (!Number.isInteger(S) || S < 1 || S > this.maxTokens) throw new InvalidArgumentError(`S must be an integer in 1..${this.maxTokens}, got ${S}`);
    const batched = end.batch !== undefined;
    if (batched && S > GRAPH_MAX_TOKENS) throw new InvalidArgumentError(`a batched replay takes 1..${GRAPH_MAX_TOKENS} tokens, got ${S}`);
    // a batch: each token's sequence's conv and recurrent states, a slot's states slotConv / slotDelta floats apart
    const convRuns: RunsBinding | undefined = batched ? { table: this.s.runs, stateStride: state.slotConvFloats, states: state.slots } : undefined;
    const deltaRuns: RunsBinding | undefined = batched ? { table: this.s.runs, stateStride: state.slotDeltaFloats, states: state.slots } : undefined;
    const cfg = this.cfg, s = this.s, P = this.params;
    const st = this.stage;
    const { hidden: D, heads: H, kvHeads: KV, headDim: hd, rmsEps: eps, experts: E, topK: K, sharedIntermediate: F } = cfg;
    const { keyHeads: KH, valueHeads: VH, keyDim: kd, valueDim: vd } = cfg.linear;
    const Kd = KH * kd, Vd = VH * vd, C = 2 * Kd + Vd;
    let n = 0;
    const op = (name: string, dispatches = 1) => {
      n += dispatches;
      mark(name);
    };
    const lin = (m: DeviceLinear, x: Buffer, y: Buffer) => {
      m.record(cb, x, y, S);
      return m.dispatches(S);
    };
    if (end.start) cb.barrier("computeToTransfer").copyBuffer(s.embed, s.h, BigInt(4 * S * D)).barrier("transferToCompute");
    cb.barrier("computeToCompute");
    // split: the layer before ran its experts on the host (their sum in ffnHost) and left its shared expert in sharedOut / sharedScale
    const addHostExperts = () => {
      cb.barrier("computeToTransfer").copyBuffer(s.ffnHost, s.ffn, BigInt(4 * S * D)).barrier("transferToCompute");
      this.gating.record(cb, { mode: "scaled-add", x: s.sharedOut, g: s.sharedScale, y: s.ffn, S, n: D });
      op("shared expert add");
      cb.barrier("computeToCompute");
    };
    if (end.split && end.first > 0) addHostExperts();
    // A resident layer leaves its shared expert (sharedOut, sharedScale) beside the routed experts'
    // sum (ffn): the next norm adds both (its scaled add), with no dec_gating step of its own.
    let sharedPending = false;
    const sharedAdd = (gateOffset = 0) => (sharedPending ? { scaledAdd: { x: s.sharedOut, gate: s.sharedScale, gateOffset } } : {});
    for (let l = end.first; l < end.end; l++) {
      const L = this.layers[l]!, m = L.mixer;
      // the matrices that read xn take the norm's quantized rows where they run the integer-dot path
      const readers = normReaders(L);
      const xq = this.norm.record(cb, { x: s.h, add: l > 0 ? s.ffn : undefined, ...sharedAdd(), w: P, wOffset: L.inputNorm, y: s.xn, rows: S, n: D, eps }, readers);
      const linq = (m: DeviceLinear, y: Buffer) => m.recordFrom(cb, s.xn, xq, y, S);
      op("input norm");
      cb.barrier("computeToCompute");
      const route = st && {
        table: st.table, work: st.work, pairs: st.pairs, slotWeight: st.slotWeight, slotExpert: st.slotExpert,
        chosen: s.chosen, S, E, k: K, normalize: true, seq: st.seq, tableOffset: st.tableOffset(l), chosenOffset: l * this.maxTokens * K,
      };
      const routerWeights = L.router.floatWeights;
      // decode calls of the fused experts' kernel run the shared expert as one more slot a token (VKMOE_SHARED_SLOT)
      const sharedInCall = !end.split && st?.runsShared?.(l, S) === true;
      const routeFold = route && !end.split && this.routerRoute && routerWeights && S <= ROUTER_ROUTE_MAX_S && (sharedInCall || (this.routeFoldMode === "route" && L.sharedGate.fusesGateUp(L.sharedUp, S)));
      // and the norm, where nothing but the router reads its rows in that step (the shared expert is in the experts' call)
      const normFold = routeFold && sharedInCall && this.routerRouteNorm && S <= this.routerRouteNorm.normTokens;
      const routerRouteNormArgs = () => ({
        ...route!, weights: routerWeights!.buffer, dtype: routerWeights!.dtype, x: s.xn, cols: D, logits: s.routerLogits, arrived: this.routeArrived,
        norm: { h: s.h, add: s.o, weights: P, weightOffset: L.postNorm, eps, xn: s.xn },
      });
      // that step's pipeline warmed on stand-ins beside the mixer's long step (RouterWarm), no barrier between
      const warmRouter = () => (normFold && this.routerWarm ? this.routerWarm.record(cb, this.routerRouteNorm!, routerRouteNormArgs()) : 0);
      if (m.kind === "linear") {
        op("qkv, z, a, b", linq(m.qkv, s.mixed) + linq(m.z, s.z) + linq(m.a, s.a) + linq(m.b, s.b));
        cb.barrier("computeToCompute");
        // a prompt chunk of one sequence runs chunk-parallel; decode steps, short chunks and batches (runs) run recurrent
        const chunked = !deltaRuns && S >= DELTA_RULE_CHUNKED_MIN_S ? this.deltaRuleChunked : undefined;
        // the recurrent kernel convolves its own channels of `mixed` (the conv state read only, moved on after)
        const fold = this.convFold && !chunked;
        const convArgs = { x: s.mixed, weight: P, weightOffset: m.conv, state: state.conv, stateOffset: m.slot * this.convStateFloats, S, channels: C, runs: convRuns };
        if (chunked) {
          // a prompt chunk's tokens in blocks side by side (the state read as it was), then beside the
          // delta rule the state moved on over the chunk's last inputs
          this.conv1d.recordOutputs(cb, { ...convArgs, out: s.conv });
          op("conv1d");
          cb.barrier("computeToCompute");
          this.conv1d.recordAdvance(cb, convArgs);
          op("conv state advance");
        } else if (!fold) {
          this.conv1d.record(cb, { ...convArgs, out: s.conv });
          op("conv1d");
          cb.barrier("computeToCompute");
        }
        n += warmRouter();
        // one dispatch, or (tiled value heads) one per value head of each key head: keyHeads contiguous heads, each its own key head
        const g = m.groups, heads = VH / g;
        // the recurrent kernel writes its rows quantized too where out_proj reads quantized rows (no quantize step there)
        const coreQ = !chunked && this.coreQuant && S <= this.coreQuant.maxTokens && m.out.takesQuantized(S) ? this.coreQuant : undefined;
        const deltaArgs = (j: number): DeltaRuleArgs => ({
          S, keyHeads: g === 1 ? KH : heads, valueHeads: heads, qkv: fold ? s.mixed : s.conv, qOffset: 0, kOffset: Kd, vOffset: 2 * Kd + j * heads * vd, qkvStride: C,
          a: s.a, b: s.b, aOffset: j * heads, aStride: VH, bOffset: j * heads, bStride: VH,
          params: P, negAOffset: m.negA + j * heads, dtBiasOffset: m.dtBias + j * heads,
          state: state.delta, stateOffset: m.slot * this.deltaStateFloats + j * heads * kd * vd,
          out: s.core, outOffset: j * heads * vd, outStride: Vd,
          norm: { z: s.z, zOffset: j * heads * vd, zStride: Vd, weightOffset: m.norm, eps },
          runs: deltaRuns,
          ...(fold && { conv: { weightOffset: m.conv, state: state.conv, stateOffset: convArgs.stateOffset, stateStride: convRuns?.stateStride } }),
          ...(coreQ && { quantized: coreQ }),
        });
        let deltaDispatches = chunked ? g + 1 : g;
        const split = chunked && S > DELTA_RULE_MAX_S ? this.deltaRuleSplit : undefined;
        if (split) {
          // a longer prompt chunk in two passes: every group's prepare (all its 64-token chunks at once), one
          // barrier, every group's state pass (the chunks in order inside each workgroup), one barrier, one norm
          for (let j = 0; j < g; j++) split.kernel.recordPrepare(cb, deltaArgs(j), split.scratch, j * heads);
          cb.barrier("computeToCompute");
          for (let j = 0; j < g; j++) split.kernel.recordState(cb, deltaArgs(j), split.scratch, j * heads);
          cb.barrier("computeToCompute");
          split.kernel.recordNorm(cb, { ...deltaArgs(0), keyHeads: KH, valueHeads: VH });
          deltaDispatches = 2 * g + 1;
        } else if (chunked && S > DELTA_RULE_MAX_S) {
          // a longer prompt chunk: DELTA_RULE_MAX_S tokens at a time, each carrying the recurrent state on
          // to the next, then one gated norm over all of them
          deltaDispatches = 1;
          for (let t0 = 0; t0 < S; t0 += DELTA_RULE_MAX_S) {
            const n = Math.min(DELTA_RULE_MAX_S, S - t0);
            const at = (j: number): DeltaRuleArgs => {
              const a = deltaArgs(j);
              return {
                ...a, S: n, qOffset: (a.qOffset ?? 0) + t0 * C, kOffset: (a.kOffset ?? 0) + t0 * C, vOffset: (a.vOffset ?? 0) + t0 * C,
                aOffset: (a.aOffset ?? 0) + t0 * VH, bOffset: (a.bOffset ?? 0) + t0 * VH, outOffset: (a.outOffset ?? 0) + t0 * Vd,
                norm: { ...a.norm!, zOffset: (a.norm!.zOffset ?? 0) + t0 * Vd },
              };
            };
            if (t0 > 0) cb.barrier("computeToCompute");
            for (let j = 0; j < g; j++) chunked.recordCore(cb, at(j));
            deltaDispatches += g;
          }
          cb.barrier("computeToCompute");
          chunked.recordNorm(cb, { ...deltaArgs(0), keyHeads: KH, valueHeads: VH });
        } else if (chunked) {
          // every group's delta rule, one barrier, then one gated norm over all value heads (the groups' outputs tile s.core)
          for (let j = 0; j < g; j++) chunked.recordCore(cb, deltaArgs(j));
          cb.barrier("computeToCompute");
          chunked.recordNorm(cb, { ...deltaArgs(0), keyHeads: KH, valueHeads: VH });
        } else {
          for (let j = 0; j < g; j++) this.deltaRule.record(cb, deltaArgs(j));
        }
        op(fold ? "delta rule + gated norm (+ conv1d)" : "delta rule + gated norm", deltaDispatches);
        cb.barrier("computeToCompute");
        op("out_proj", m.out.recordFrom(cb, s.core, coreQ, s.o, S));
        if (fold) {
          // beside out_proj, no barrier of its own: the conv state is next read by this layer's next call, and
          // `mixed` next written by the next layer's qkv, both behind the barriers that end this layer
          this.conv1d.recordAdvance(cb, convArgs);
          op("conv state advance");
        }
      } else {
        op("q, gate, k, v", linq(m.q, s.q) + linq(m.gate, s.gate) + linq(m.k, s.k) + linq(m.v, s.v));
        cb.barrier("computeToCompute");
        const norm = { qOffset: m.qNorm, kOffset: m.kNorm, eps };
        // decode calls of one sequence: the attention does the head norms, partial RoPE and KV append itself (one barrier
        // fewer); q is the query half of q_proj (its gate rows are a matrix of their own since load: no offset)
        const fold = state.attention.foldsRope(S, batched);
        if (!fold) {
          state.rope.record(cb, {
            q: s.q, k: s.k, v: s.v, invFreq: this.invFreq, kCache: state.keys[m.slot]!, vCache: state.values[m.slot]!,
            S, heads: H, kvHeads: KV, headDim: hd, ctx: state.rows, pos0: 0, positions: s.positions, posIndex: 0, batched,
            norm: { weights: P, ...norm }, rotaryDim: cfg.rotaryDim,
          });
          op("q/k norms + partial rope + kv append");
          cb.barrier("computeToCompute");
        }
        // the output gate (attn *= sigmoid(gate)) is applied by the attention's combine pass, or by dec_attention_cm (the binding's gate)
        // o_proj reads the combine's quantized rows where it takes the integer-dot path
        // (dec_attention_cm writes none: o_proj quantizes its rows itself after it)
        const onCores = state.attention.promptOnMatrixCores(S, batched);
        const oq = this.attnQuant && !onCores && m.o.takesQuantized(S) ? this.attnQuant : undefined;
        n += warmRouter();
        if (onCores) {
          // a prompt chunk: its keys and values are all in the cache (the RoPE step above)
          op("attention + output gate", state.attention.recordPrompt(cb, state.bindings[m.slot]!, { S, maxPositions: state.ctx }));
        } else if (S <= MAX_ATTENTION_TOKENS) {
          state.attention.record(cb, state.bindings[m.slot]!, {
            n: 1, S, maxPositions: state.ctx, posIndex: 0, batched, quantize: oq !== undefined, ...(fold && { rope: { norm, rotaryDim: cfg.rotaryDim } }),
          });
          op(fold ? "attention + output gate (+ q/k norms, partial rope, kv append)" : "attention + output gate", state.attention.dispatches(S));
        } else {
          // a longer prompt chunk: its keys and values are all in the cache (the RoPE step above)
          op("attention + output gate", state.attention.recordLong(cb, state.bindings[m.slot]!, { S, maxPositions: state.ctx }));
        }
        cb.barrier("computeToCompute");
        op("o_proj", m.o.recordFrom(cb, s.attn, oq, s.o, S));
      }
      cb.barrier("computeToCompute");
      // the norm after the layer: the next layer's input norm, or the final norm (every row of a batch; the last row
      // where a replay ends with logits or an id)
      const next = l + 1 < end.end ? this.layers[l + 1]! : undefined;
      const headRows = end.batch !== undefined ? S : (end.output ?? "none") !== "none" ? 1 : 0;
      const nextNorm = next ? { wOffset: next.inputNorm, readers: normReaders(next), rows: S }
        : headRows > 0 ? { wOffset: this.finalNorm, readers: [this.lmHead], rows: headRows } : undefined;
      const scaled = sharedInCall ? {} : { scaledAdd: { x: s.sharedOut, gate: s.sharedScale } };
      const warmNorm = this.warmNorms && nextNorm && !end.split && st
        ? () => (n += this.norm.recordWarm(cb, { x: s.h, add: s.ffn, ...scaled, w: P, wOffset: nextNorm.wOffset, y: s.xn, rows: nextNorm.rows, n: D, eps }, nextNorm.readers))
        : undefined;
      let xqPost: GgmlIdpScratch | undefined;
      if (!normFold) {
        xqPost = this.norm.record(cb, { x: s.h, add: s.o, w: P, wOffset: L.postNorm, y: s.xn, rows: S, n: D, eps }, sharedInCall ? [L.router] : [L.router, L.sharedGate, L.sharedUp, L.sharedScale]);
        op("post norm");
        cb.barrier("computeToCompute");
      }
      if (warmNorm && st!.oneStep(S)) warmNorm();
      const linp = (m: DeviceLinear, y: Buffer) => m.recordFrom(cb, s.xn, xqPost, y, S);
      const sharedGateUp = () => (sharedInCall ? 0 : L.sharedGate.recordGateUp(cb, L.sharedUp, s.xn, s.sharedG, S) + linp(L.sharedScale, s.sharedScale));
      const withShared = (name: string) => (sharedInCall ? name : `${name}, shared gate/up/scale`);
      if (normFold) {
        // each router workgroup norms the rows itself, its last moves the residual on, writes xn and routes
        this.routerRouteNorm!.record(cb, routerRouteNormArgs());
        op("post norm + router + route");
      } else if (routeFold) {
        // the route in the router's last workgroup, the shared expert's SwiGLU in its gate/up GEMV: no route step
        this.routerRoute!.record(cb, { ...route!, weights: routerWeights!.buffer, dtype: routerWeights!.dtype, x: s.xn, cols: D, logits: s.routerLogits, arrived: this.routeArrived });
        op(withShared("router + route"), 1 + sharedGateUp());
      } else {
        const dense = sharedInCall ? 0 : linp(L.sharedGate, s.sharedG) + linp(L.sharedUp, s.sharedU) + linp(L.sharedScale, s.sharedScale);
        op(withShared("router"), linp(L.router, s.routerLogits) + dense);
        cb.barrier("computeToCompute");
        if (end.split) {
          // the shared expert here (its add waits for the host's experts: the next recording's start)
          this.gating.record(cb, { mode: "swiglu", x: s.sharedG, g: s.sharedU, y: s.sharedG, S, n: F });
          op("shared swiglu");
          cb.barrier("computeToCompute");
          op("shared down_proj", lin(L.sharedDown, s.sharedG, s.sharedOut));
          cb.barrier("computeToTransfer")
            .copyBuffer(s.xn, s.xnHost, BigInt(4 * S * D))
            .copyBuffer(s.routerLogits, s.routerHost, BigInt(4 * S * E))
            .barrier("transferToHost");
          continue;
        }
        if (!st || !route) throw new InvalidArgumentError("this graph has no MoE stage: run it split");
        this.route.record(cb, { ...route, logits: s.routerLogits });
        if (sharedInCall) {
          op("route");
        } else {
          this.gating.record(cb, { mode: "swiglu", x: s.sharedG, g: s.sharedU, y: s.sharedG, S, n: F });
          op("route, shared swiglu", 2);
        }
      }
      cb.barrier("computeToCompute");
      // a shared down on the integer-dot GEMV quantizes its input beside the experts' first step and runs beside
      // their last (no step of its own), where the call has a barrier inside
      const downQ = !sharedInCall && !st!.oneStep(S) ? L.sharedDown.recordQuantize(cb, s.sharedG, S) : undefined;
      // the next norm's pipeline warmed on stand-ins (NormFeed.recordWarm) beside the experts' first of two or more steps,
      // or where they are one step beside the router's step before them (measurements, 2026-12-07 and 2026-12-08)
      if (warmNorm && !st!.oneStep(S)) warmNorm();
      // the stage marks each of its steps (a profile's rows "experts: gate+up" ...)
      st!.record(cb, s.xn, s.ffn, S, { chosen: s.chosen, chosenOffset: l * this.maxTokens * K, layer: l, mark: (step) => mark(`experts: ${step}`) });
      n += st!.dispatches(S);
      if (!sharedInCall) op("shared down_proj", (downQ ? 1 : 0) + L.sharedDown.recordFrom(cb, s.sharedG, downQ, s.sharedOut, S));
      cb.barrier("computeToCompute");
      // the next norm adds the shared expert where the experts' call did not
      sharedPending = !sharedInCall;
    }
    if (end.batch) {
      // every token's logits: each row is another sequence's next token (or a prompt's)
      const xq = this.norm.record(cb, { x: s.h, add: s.ffn, ...sharedAdd(), w: P, wOffset: this.finalNorm, y: s.xn, rows: S, n: D, eps }, [this.lmHead]);
      op("final norm");
      cb.barrier("computeToCompute");
      op("lm_head", this.lmHead.recordFrom(cb, s.xn, xq, end.batch.logits, S));
      cb.barrier("computeToTransfer").copyBuffer(end.batch.logits, end.batch.logitsHost, BigInt(4 * S * cfg.vocab)).barrier("transferToHost");
      cb.barrier("computeToHost");
      return n;
    }
    const output = end.output ?? "none";
    if (output !== "none") {
      // the last token's row only: its logits are all a replay returns
      const xq = this.norm.record(cb, { x: s.h, add: s.ffn, ...sharedAdd(S - 1), w: P, wOffset: this.finalNorm, y: s.xn, rows: 1, n: D, eps, xOffset: (S - 1) * D, addOffset: (S - 1) * D }, [this.lmHead]);
      op("final norm");
      cb.barrier("computeToCompute");
      op("lm_head", this.lmHead.recordFrom(cb, s.xn, xq, s.logits));
      if (output === "logits") {
        cb.barrier("computeToTransfer").copyBuffer(s.logits, s.logitsHost, BigInt(4 * cfg.vocab)).barrier("transferToHost");
      } else {
        cb.barrier("computeToCompute");
        this.argmax.record(cb, { logits: s.logits, V: cfg.vocab, result: s.result });
        op("argmax");
      }
    }
    cb.barrier("computeToHost");
    return n;
  }

  private dispose(): void {
    for (const seq of [...this.live]) seq[Symbol.dispose]();
    for (const batch of [...this.liveBatches]) batch[Symbol.dispose]();
    this.owned.dispose();
  }

  [Symbol.dispose](): void {
    try {
      this.device.waitIdle();
    } catch {
      // a lost device: destroying is still valid
    }
    this.dispose();
  }
}

/**
 * One sequence's device state: the full layers' f16 KV cache with its kernels, the linear layers'
 * states; or a batch's: `slots` sequences, sequence i's cache rows from i * ctx and its states
 * slotConvFloats / slotDeltaFloats floats from the start of `conv` / `delta`.
 */
export interface SequenceState {
  /** Positions per sequence. */
  ctx: number;
  /** Sequences; cache rows in all (slots x ctx). */
  slots: number;
  rows: number;
  keys: Buffer[];
  values: Buffer[];
  rope: RopeKvKernel;
  attention: DecoderAttention;
  bindings: AttentionBinding[];
  /** [slots][linear layers][channels][kernel − 1] f32. */
  conv: Buffer;
  /** [slots][linear layers][valueHeads][keyDim][valueDim] f32. */
  delta: Buffer;
  /** Floats of one sequence's states (every linear layer's): the distance between slots. */
  slotConvFloats: number;
  slotDeltaFloats: number;
  bytes: number;
}

export function openSequenceState(graph: HybridGraph, ctx: number, owned: DisposableStack, slots = 1): SequenceState {
  const cfg = graph.cfg, device = graph.device;
  const { kvHeads: KV, headDim: hd, heads: H } = cfg;
  const rows = slots * ctx;
  const layerBytes = rows * KV * hd * 2;
  const limit = device.info.limits.maxStorageBufferRange;
  const what = slots === 1 ? `${ctx} positions` : `${slots} x ${ctx} positions`;
  if (layerBytes > limit) throw new GraphUnsupportedError(`a KV cache of ${what} takes ${layerBytes} bytes per layer, past this device's maxStorageBufferRange of ${limit}`);
  const slotConvFloats = graph.linearLayers * graph.convStateFloats, slotDeltaFloats = graph.linearLayers * graph.deltaStateFloats;
  // each state buffer is bound whole: every slot's must fit one binding
  const deltaBytes = 4 * slots * slotDeltaFloats;
  if (deltaBytes > limit) throw new GraphUnsupportedError(`the recurrent states of ${slots} sequences take ${deltaBytes} bytes, past this device's maxStorageBufferRange of ${limit}`);
  const buffer = (bytes: number) => owned.use(new Buffer(device, { size: BigInt(Math.max(16, Math.ceil(bytes / 16) * 16)), memory: "device", priority: 1 }));
  const keys: Buffer[] = [], values: Buffer[] = [];
  for (let l = 0; l < graph.fullLayers; l++) {
    keys.push(buffer(layerBytes));
    values.push(buffer(layerBytes));
  }
  const rope = owned.use(new RopeKvKernel(device, { maxSets: Math.max(1, graph.fullLayers) }));
  // as openSequenceCache: GPUs take 32 positions a workgroup and 128 threads, CPU devices the kernel's defaults
  const shape = device.info.type === 4 ? {} : { chunk: 32, workgroupSize: 128 };
  // ropeFold: decode calls of one sequence fold the RoPE step into the attention (RopeKvKernel's
  // default shape: the same bits); VKMOE_ROPE_FOLD=off keeps the separate step (from the process env,
  // as LinearKernels' integer-dot decision)
  const env = readConfig();
  // only where the graph's chunks reach it (its self-check and pipeline cost the load time otherwise)
  const promptMatrixCores = attentionOnMatrixCores(device, env, graph.maxTokens);
  const attention = owned.use(new DecoderAttention(device, {
    heads: H, kvHeads: KV, headDim: hd, maxBindings: Math.max(1, graph.fullLayers), ropeFold: env.VKMOE_ROPE_FOLD !== "off", combineTail: env.VKMOE_COMBINE_TAIL !== "off", ...shape, ...(promptMatrixCores && { promptMatrixCores }),
  }));
  const partials = buffer(attention.partialBytesUpTo(ctx, Math.min(graph.maxTokens, MAX_ATTENTION_TOKENS)));
  const s = graph.s;
  const fold = attention.ropeFold ? { fold: { k: s.k, v: s.v, invFreq: graph.invFreq, normWeights: graph.params } } : {};
  const bindings = keys.map((k, l) => attention.bind({ q: s.q, keys: k, values: values[l]!, partials, out: s.attn, positions: s.positions, gate: s.gate, ...fold, ...(graph.attnQuant && { quantized: graph.attnQuant }) }));
  const conv = buffer(4 * slots * slotConvFloats);
  const delta = buffer(deltaBytes);
  const bytes = 2 * graph.fullLayers * Math.ceil(layerBytes / 16) * 16 + Number(conv.size) + Number(delta.size);
  return { ctx, slots, rows, keys, values, rope, attention, bindings, conv, delta, slotConvFloats, slotDeltaFloats, bytes };
}

export class HybridSequence implements Disposable {
  readonly ctx: number;
  /** Bytes of the KV cache and the recurrent states in device memory. */
  readonly cacheBytes: number;
  /** The recurrent states cannot drop tokens: truncating re-runs the kept ones from reset(). */
  readonly rewindable = false;
  private readonly state: SequenceState;
  private readonly owned = new DisposableStack();
  private readonly commands: CommandPool;
  /** Recordings by recording()'s index: made on first use, replayed after. */
  private readonly recorded: ({ submission: Submission; dispatches: number } | undefined)[] = [];
  private readonly fence: Fence;
  private readonly waiter: ReplayWaiter;
  private readonly queries: QueryPool | undefined;
  private readonly tick: number;
  readonly counts = { replays: 0, dispatches: 0 };
  /** GPU µs of the last resident run (with `timing`); split runs leave it 0. */
  lastGpuUs = 0;
  private disposed = false;
  private readonly hostExperts: HostExperts | undefined;

  /** Tokens runTokens takes at most (the graph's maxTokens). */
  get maxChunk(): number {
    return this.graph.maxTokens;
  }

  constructor(private readonly graph: HybridGraph, ctx: number, options: { timing?: boolean; hostExperts?: HostExperts } = {}) {
    if (!Number.isInteger(ctx) || ctx < 1) throw new InvalidArgumentError(`ctx must be a positive integer, got ${ctx}`);
    if (!graph.stage && !options.hostExperts) throw new InvalidArgumentError("a split sequence (the experts not all resident) needs the host's experts (hostExperts)");
    this.ctx = ctx;
    this.hostExperts = options.hostExperts;
    const device = graph.device;
    try {
      this.state = openSequenceState(graph, ctx, this.owned);
      this.cacheBytes = this.state.bytes;
      this.commands = this.owned.use(new CommandPool(device));
      this.fence = this.owned.use(new Fence(device));
      this.waiter = new ReplayWaiter(this.fence, fenceWaitMode(device));
      this.queries = options.timing && device.info.limits.timestampComputeAndGraphics ? this.owned.use(new QueryPool(device, 2)) : undefined;
      this.tick = device.info.limits.timestampPeriod;
      this.reset();
    } catch (e) {
      this.owned.dispose();
      throw e;
    }
  }

  /** Zeroes the conv and recurrent states (a new sequence; the KV cache rows are overwritten as it grows). */
  reset(): void {
    this.check();
    for (const b of [this.state.conv, this.state.delta]) uploadBytes(this.graph.device, b, 0n, new Uint8Array(Number(b.size)));
  }

  /** Submits per run: 1 resident; split, one per layer and the head, beside the experts' own calls. */
  get submitsPerRun(): number {
    return this.graph.stage ? 1 : this.graph.cfg.layers + 1;
  }

  /**
   * The recording of a whole token (`segment` undefined), or of a split run's part: a layer index
   * or the head (cfg.layers). Made on first use; found by index (no key built per token).
   */
  private recording(output: GraphOutput, S: number, segment?: number) {
    const L = this.graph.cfg.layers;
    const part = segment === undefined ? 0 : segment + 1;
    const index = (OUTPUTS.indexOf(output) * (this.graph.maxTokens + 1) + S) * (L + 2) + part;
    let r = this.recorded[index];
    if (!r) {
      const cb = this.commands.allocate().begin();
      // GPU time is measured on whole tokens only
      const timed = segment === undefined ? this.queries : undefined;
      if (timed) cb.resetQueries(timed).timestamp(timed, 0);
      const dispatches = segment === undefined ? this.graph.recordToken(cb, this.state, output, S) : this.graph.recordSplit(cb, this.state, S, segment, output);
      if (timed) cb.timestamp(timed, 1);
      cb.end();
      const submission = this.owned.use(new Submission(this.graph.device, [cb], { fence: this.fence }));
      this.recorded[index] = r = { submission, dispatches };
    }
    return r;
  }

  /** Dispatches a run of one token records (split: its layers' and head's together). */
  dispatchesOf(output: GraphOutput): number {
    if (this.graph.stage) return this.recording(output, 1).dispatches;
    const L = this.graph.cfg.layers;
    let n = output === "none" ? 0 : this.recording(output, 1, L).dispatches;
    for (let l = 0; l < L; l++) n += this.recording("none", 1, l).dispatches;
    return n;
  }

  private submitAndWait(submission: Submission): void {
    const done = this.waiter.run(submission);
    if (!done) throw new Error("hybrid graph: the GPU did not finish a token within the timeout");
    if (this.graph.injectDeviceLost) {
      this.graph.injectDeviceLost = false;
      throw new DeviceLostError("vkWaitForFences (injected)");
    }
  }

  run(id: number, position: number, output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    return this.runTokens([id], position, output);
  }

  runTokens(ids: ArrayLike<number>, position: number, output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    this.check();
    const S = ids.length;
    if (!Number.isInteger(position) || position < 0 || position + S > this.ctx) throw new InvalidArgumentError(`positions ${position}..${position + S - 1} are outside the context 0..${this.ctx - 1}`);
    this.graph.writeInput(ids, position);
    if (!this.graph.stage) return this.runSplit(S, output);
    const r = this.recording(output, S);
    this.submitAndWait(r.submission);
    this.counts.replays++;
    this.counts.dispatches += r.dispatches;
    if (this.queries) {
      const [a, b] = this.queries.results(0, 2);
      this.lastGpuUs = (Number(b! - a!) * this.tick) / 1000;
    }
    return this.result(output);
  }

  /**
   * A split run (the experts not all resident): each layer's dense part on the GPU (one submit),
   * then its routed experts on the host (`hostExperts`), their sum written where the next
   * recording adds it with the shared expert; then the head, unless the output is "none".
   */
  private runSplit(S: number, output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    const experts = this.hostExperts!;
    const v = this.graph.views, D = this.graph.cfg.hidden, E = this.graph.cfg.experts, L = this.graph.cfg.layers;
    const xn = v.xn.subarray(0, S * D), logits = v.router.subarray(0, S * E), y = v.ffn.subarray(0, S * D);
    for (let l = 0; l < L; l++) {
      const r = this.recording("none", S, l);
      this.submitAndWait(r.submission);
      this.counts.dispatches += r.dispatches;
      experts(l, xn, logits, S, y);
    }
    this.counts.replays++;
    if (output === "none") return {};
    const h = this.recording(output, S, L);
    this.submitAndWait(h.submission);
    this.counts.dispatches += h.dispatches;
    return this.result(output);
  }

  /** What a run returns for `output`, read from the host-visible outputs. */
  private result(output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    const v = this.graph.views;
    if (output === "logits") return { logits: v.logits };
    if (output === "none") return {};
    const best = v.result[0]!;
    return { id: best === ARGMAX_NONE ? -1 : best, value: v.resultValue[0] };
  }

  /** As GraphSequence.profile: each op's GPU µs for S tokens through a recording with a timestamp after every op. */
  profile(ids: readonly number[], position: number, output: GraphOutput): { op: string; us: number }[] {
    this.check();
    if (!this.graph.stage) throw new GraphUnsupportedError("a profile records the whole token in one submit: this sequence runs split (not every expert is resident)");
    const S = ids.length;
    if (!Number.isInteger(S) || S < 1 || S > this.maxChunk) throw new InvalidArgumentError(`a profile runs 1..${this.maxChunk} tokens, got ${S}`);
    if (!Number.isInteger(position) || position < 0 || position + S > this.ctx) throw new InvalidArgumentError(`positions ${position}..${position + S - 1} are outside the context 0..${this.ctx - 1}`);
    const device = this.graph.device, names: string[] = [];
    using queries = new QueryPool(device, 8 + 24 * this.graph.cfg.layers);
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    cb.resetQueries(queries).timestamp(queries, 0);
    this.graph.recordToken(cb, this.state, output, S, (op) => {
      names.push(op);
      cb.timestamp(queries, names.length);
    });
    cb.end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    this.graph.writeInput(ids, position);
    submission.submit();
    if (!fence.wait()) throw new Error("hybrid graph: the profiled tokens did not finish within the timeout");
    const t = queries.results(0, names.length + 1);
    return names.map((op, i) => ({ op, us: (Number(t[i + 1]! - t[i]!) * this.tick) / 1000 }));
  }

  lastRouting(): Int32Array {
    return this.graph.views.chosen;
  }

  private check(): void {
    if (this.disposed) throw new InvalidArgumentError("this sequence (or its model) is disposed");
  }

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    try {
      this.graph.device.waitIdle();
    } catch {
      // a lost device: destroying is still valid
    }
    this.recorded.length = 0;
    this.owned.dispose();
    this.graph.live.delete(this);
  }
}

/**
 * Device bytes the hybrid graph takes beside the experts: dense weights, parameters, the full
 * layers' KV cache of ctx positions and the linear layers' states for each of `slots` sequences
 * (a HybridBatch's; 1: one session), a prompt chunk's activations and experts' rows (chunks of
 * `chunk` tokens), ~8 MiB of scratch.
 */
export function hybridGraphReserveBytes(cfg: Qwen35MoeConfig, w: HybridWeights, ctx: number, slots = 1, chunk = GRAPH_MAX_TOKENS): number {
  let bytes = w.lmHead.bytes;
  const { keyHeads: KH, valueHeads: VH, keyDim: kd, valueDim: vd, convKernel } = cfg.linear;
  const sharedSlot = readConfig().VKMOE_SHARED_SLOT !== "off";
  const C = 2 * KH * kd + VH * vd;
  let full = 0;
  for (const l of w.layers) {
    const sh = l.shared;
    bytes += l.router.bytes + sh.gate.bytes + sh.up.bytes + sh.down.bytes + sh.scale.bytes + 8 * cfg.hidden;
    // a q4/q8 shared expert of the routed experts' width: its second copy, packed as an expert for the fused call (VKMOE_SHARED_SLOT)
    if (sharedSlot && (sh.gate.kind === "q4" || sh.gate.kind === "q8") && sh.gate.rows === cfg.expertIntermediate) bytes += sh.gate.bytes + sh.up.bytes + sh.down.bytes + 4 * cfg.hidden;
    // the conv taps once; each sequence's conv and recurrent states
    if (l.linear) bytes += l.linear.qkv.bytes + l.linear.z.bytes + l.linear.a.bytes + l.linear.b.bytes + l.linear.out.bytes + 4 * (C * convKernel + slots * (C * (convKernel - 1) + VH * kd * vd));
    if (l.attention) {
      full++;
      bytes += l.attention.q.bytes + l.attention.k.bytes + l.attention.v.bytes + l.attention.o.bytes;
    }
  }
  const record = 4 * cfg.heads * (cfg.headDim + 4);
  const partials = Math.max(4 * Math.ceil(ctx / 32), 64 * 16) * record;
  // a token of a chunk: the residual and norms, q/k/v/z/a/b/core of the linear layers, q/gate/k/v/attn of the
  // full ones, router logits, the shared expert's rows, the experts' gate/up and down rows
  const D = cfg.hidden, qd = cfg.heads * cfg.headDim, kvd = cfg.kvHeads * cfg.headDim, Vd = VH * vd;
  const perToken = 4 * (6 * D + 2 * C + 2 * Vd + 2 * VH + 3 * qd + 2 * kvd + cfg.experts + 2 * cfg.sharedIntermediate + cfg.topK * (cfg.expertIntermediate + D));
  // chunks past DELTA_RULE_MAX_S tokens: the two-pass delta rule's scratch
  const split = chunk > DELTA_RULE_MAX_S ? DeltaRuleSplitScratch.bytes(chunk, VH, kd) : 0;
  return bytes + 2 * full * slots * ctx * kvd * 2 + partials + chunk * perToken + split + 8 * 2 ** 20;
}
