/**
 * The whole token on the GPU: every op of a Qwen3-MoE decode step recorded once into one command
 * buffer and replayed, one submit and one wait per token. The host writes the token's embedding
 * row and its position into mapped memory; the GPU runs per layer
 *   RMSNorm (+ the residual) → q, k, v → q/k head norms, RoPE and the f16 KV-cache append →
 *   split attention (+ combine) (decode tokens: the two in one step, the attention's ROPE_FOLD;
 *   the combine in the attention's last workgroups, COMBINE_TAIL) →
 *   o → RMSNorm (+ residual) → router → dec_route (softmax, top-k,
 *   the MoE tables from the resident experts' handles; decode tokens of a float router: the two in
 *   one step, dec_router_route, ROUTE_FOLD) → the MoE call,
 * then the final norm, lm_head and either nothing (prefill), the logits copied to host memory,
 * or the greedy argmax.
 *
 * `DecodeGraph` holds what a model needs once (dense weights, norms, kernels, scratch, the MoE
 * stage); `GraphSequence` one sequence's KV cache and recordings. Sequences run one at a time
 * (each call waits), so they share the scratch.
 */
import { readConfig } from "../config.ts";
import { InvalidArgumentError } from "../errors.ts";
import { ArgmaxKernel, ARGMAX_NONE } from "../kernels/decoder/argmax.ts";
import { ATTENTION_GQA, ATTENTION_HEAD_DIMS, DecoderAttention, MAX_ATTENTION_TOKENS, type AttentionBinding } from "../kernels/decoder/attention.ts";
import { BATCH_WORDS, RopeKvKernel } from "../kernels/decoder/rope-kv.ts";
import { GemvHalfKernel } from "../kernels/decoder/gemv-half.ts";
import { RouteKernel } from "../kernels/decoder/route.ts";
import { ROUTER_ROUTE_MAX_S, routerNormTokens, RouterRouteKernel } from "../kernels/decoder/router-route.ts";
import type { MoeNormTail } from "../moe/ggml-experts.ts";
import type { MoeGraphStage } from "../moe/graph-stage.ts";
import type { Qwen3MoeConfig } from "../model/config.ts";
import { ropeInverseFrequencies } from "../model/ops.ts";
import type { ModelWeights } from "../model/weights.ts";
import { CommandPool, type CommandBuffer } from "../vk/commands.ts";
import type { Device } from "../vk/device.ts";
import { Buffer } from "../vk/memory.ts";
import { DeviceLostError } from "../vk/errors.ts";
import { Fence, QueryPool, Submission } from "../vk/sync.ts";
import { uploadBytes } from "../vk/transfer.ts";
import { attentionOnMatrixCores } from "../moe/prefill-plan.ts";
import { DeviceLinear, LinearKernels } from "./device-linear.ts";
import { GgmlIdpScratch } from "../kernels/decoder/ggml-gemv.ts";
import { RmsNormQuantKernel, type RmsNormArgs } from "../kernels/decoder/rmsnorm.ts";
import { NormFeed } from "./norm-feed.ts";
import { RouterWarm } from "./router-warm.ts";
import { GraphUnsupportedError } from "./errors.ts";
import { fenceWaitMode, ReplayWaiter } from "./replay-wait.ts";

/** What a replay ends with: nothing (a prompt chunk), the last token's logits in host memory, or its greedy id. */
export type GraphOutput = "none" | "logits" | "argmax";

/** Tokens one replay runs at most (a prompt in chunks of this many; the MoE call's and the attention kernel's limit), unless a graph takes longer prompt chunks (moe/prefill-plan.ts). */
export const GRAPH_MAX_TOKENS = MAX_ATTENTION_TOKENS;
const OUTPUTS: readonly GraphOutput[] = ["none", "logits", "argmax"];

interface LayerOnDevice {
  q: DeviceLinear;
  k: DeviceLinear;
  v: DeviceLinear;
  o: DeviceLinear;
  router: DeviceLinear;
  /** Offsets of this layer's norm weights in the norms buffer (floats). */
  inputNorm: number;
  postNorm: number;
  qNorm: number;
  kNorm: number;
}

export class DecodeGraph implements Disposable {
  readonly device: Device;
  readonly cfg: Qwen3MoeConfig;
  private readonly linears: LinearKernels;
  private readonly layers: LayerOnDevice[] = [];
  private readonly lmHead: DeviceLinear;
  /** Every norm vector (the attention's folded head norms read q_norm / k_norm here). */
  readonly norms: Buffer;
  private readonly finalNorm: number;
  readonly invFreq: Buffer;
  /** The RMSNorms, and the quantized rows they write for integer-dot readers. */
  private readonly norm: NormFeed;
  /** o's input quantized by the attention's combine, where the o matrices take the integer-dot path. */
  readonly attnQuant: GgmlIdpScratch | undefined;
  readonly route: RouteKernel;
  /**
   * Decode calls (S <= ROUTER_ROUTE_MAX_S) of a float router: the router GEMV routes the tokens in
   * its last workgroup, dec_router_route (one dependent step fewer a layer; the same bits as the
   * router's GEMV and `route`, whose shape it shares); undefined with VKMOE_ROUTE_FOLD=off (read
   * from the process env when the graph is made, as VKMOE_ROPE_FOLD).
   */
  readonly routerRoute: RouterRouteKernel | undefined;
  /**
   * The same with the post-attention norm folded in too (its calls of up to normTokens tokens; one
   * more dependent step fewer a layer): VKMOE_ROUTE_FOLD=auto where the rows fit shared memory
   * (routerNormTokens); `route` keeps the separate norm.
   */
  readonly routerRouteNorm: RouterRouteKernel | undefined;
  /** The float routers' GEMV, in the shape of `route` and `routerRoute` on every device (not LinearKernels' CPU shape), so that folded and separate steps give the same bits. */
  private readonly routerGemv: GemvHalfKernel;
  /**
   * routerRoute's arrival word (0 between calls): one for every layer, since the layers' calls are
   * separated by barriers and each call leaves it 0.
   */
  private readonly routeArrived: Buffer;
  /** The next norm's pipeline run on stand-ins beside each layer's experts, or its router's step where the experts are one step (VKMOE_NORM_WARM, read when the graph is made). */
  private readonly warmNorms: boolean;
  /** The post norm + router + route step run on stand-ins beside each layer's attention (VKMOE_ROUTER_WARM, read when the graph is made; where that step folds the norm in). */
  private readonly routerWarm: RouterWarm | undefined;
  readonly argmax: ArgmaxKernel;
  /** Everything the graph allocated, disposed in reverse. */
  private readonly owned = new DisposableStack();
  // Scratch shared by every sequence (one runs at a time).
  readonly s: {
    embed: Buffer; positions: Buffer; h: Buffer; xn: Buffer; q: Buffer; k: Buffer; v: Buffer; attn: Buffer; o: Buffer; ffn: Buffer;
    routerLogits: Buffer; logits: Buffer; logitsHost: Buffer; result: Buffer; chosen: Buffer;
    /** Split runs: the host's copies of xn and the router logits, and the experts' sum it writes back. */
    xnHost: Buffer; routerHost: Buffer; ffnHost: Buffer;
  };
  /** Fault hook for tests: the next replay reports a lost device (after really running). */
  injectDeviceLost = false;
  readonly views: {
    embed: Float32Array; positions: Uint32Array; logits: Float32Array; result: Uint32Array; resultValue: Float32Array; chosen: Int32Array;
    xn: Float32Array; router: Float32Array; ffn: Float32Array;
  };

  /** Tokens one replay runs at most: the stage's maxTokens (GRAPH_MAX_TOKENS, or the prefill plan's longer prompt chunks). */
  readonly maxTokens: number;

  /**
   * `stage` undefined: the experts are not all resident, and the graph runs split, layer by layer
   * (the host runs the experts). `maxTokens`: what the stage was made for (a multiple of
   * MAX_ATTENTION_TOKENS past it: the attention runs that many tokens at a time).
   */
  constructor(device: Device, cfg: Qwen3MoeConfig, private readonly weights: ModelWeights, readonly stage: MoeGraphStage | undefined, maxTokens = GRAPH_MAX_TOKENS) {
    this.device = device;
    this.cfg = cfg;
    if (!Number.isInteger(maxTokens) || maxTokens < 1 || (maxTokens > MAX_ATTENTION_TOKENS && maxTokens % MAX_ATTENTION_TOKENS !== 0)) {
      throw new InvalidArgumentError(`maxTokens must be 1..${MAX_ATTENTION_TOKENS} or a multiple of it, got ${maxTokens}`);
    }
    this.maxTokens = maxTokens;
    if (!(ATTENTION_HEAD_DIMS as readonly number[]).includes(cfg.headDim)) throw new GraphUnsupportedError(`head_dim ${cfg.headDim}: the GPU attention takes ${ATTENTION_HEAD_DIMS.join(", ")}`);
    if (!(ATTENTION_GQA as readonly number[]).includes(cfg.heads / cfg.kvHeads)) throw new GraphUnsupportedError(`${cfg.heads / cfg.kvHeads} query heads per KV head: the GPU attention takes ${ATTENTION_GQA.join(", ")}`);
    const dense = weights.layers.findIndex((l) => !l.router);
    if (dense >= 0) throw new GraphUnsupportedError(`layer ${dense} has a dense MLP (mlp_only_layers / decoder_sparse_step), not in the decode graph yet`);
    this.linears = new LinearKernels(device);
    this.owned.use(this.linears);
    try {
      const { hidden: D, heads: H, kvHeads: KV, headDim: hd, vocab: V } = cfg;
      const up = (name: string, l: ModelWeights["lmHead"]) => this.own(new DeviceLinear(this.linears, name, l));
      // Every norm vector in one buffer.
      const normParts: Float32Array[] = [];
      let at = 0;
      const place = (w: Float32Array) => {
        normParts.push(w);
        const o = at;
        at += w.length;
        return o;
      };
      const routeShape = { workgroupSize: 128, rowsPerWorkgroup: 4, useSubgroup: device.info.subgroup.arithmetic };
      this.routerGemv = this.own(new GemvHalfKernel(device, { ...routeShape, maxSets: 256 }));
      weights.layers.forEach((lw, l) => {
        const a = lw.attention;
        this.layers.push({
          q: up(`layer ${l} q_proj`, a.q), k: up(`layer ${l} k_proj`, a.k), v: up(`layer ${l} v_proj`, a.v), o: up(`layer ${l} o_proj`, a.o),
          router: this.own(new DeviceLinear(this.linears, `layer ${l} router`, lw.router!, this.routerGemv)),
          inputNorm: place(a.inputNorm), postNorm: place(a.postNorm), qNorm: place(a.qNorm), kNorm: place(a.kNorm),
        });
      });
      this.finalNorm = place(weights.finalNorm);
      this.lmHead = up("lm_head", weights.lmHead);
      if (this.layers.some((L) => L.o.takesQuantized(1))) this.attnQuant = this.own(new GgmlIdpScratch(device, H * hd, this.linears.quantizedTokens));
      const normData = new Float32Array(at);
      let o = 0;
      for (const p of normParts) normData.set(p, (o += p.length) - p.length);
      this.norms = this.buffer(4 * at, "device");
      uploadBytes(device, this.norms, 0n, new Uint8Array(normData.buffer));
      const inv = ropeInverseFrequencies(hd, cfg.ropeTheta, cfg.ropeFrequencies);
      this.invFreq = this.buffer(4 * inv.length, "device");
      uploadBytes(device, this.invFreq, 0n, new Uint8Array(inv.buffer, inv.byteOffset, inv.byteLength));
      this.norm = this.own(new NormFeed(this.linears, D));
      this.route = this.own(new RouteKernel(device, { workgroupSize: routeShape.workgroupSize, useSubgroup: routeShape.useSubgroup }));
      const env = readConfig();
      const routeFold = env.VKMOE_ROUTE_FOLD;
      this.routerRoute = routeFold !== "off" && this.layers.some((L) => L.router.floatWeights) ? this.own(new RouterRouteKernel(device, { ...routeShape, maxSets: cfg.layers })) : undefined;
      this.routerRouteNorm = this.routerRoute && routeFold === "auto" && routerNormTokens(device, D, routeShape.workgroupSize, routeShape.rowsPerWorkgroup) > 0
        ? this.own(new RouterRouteKernel(device, { ...routeShape, normCols: D, maxSets: 2 * cfg.layers })) // each layer's call and its warm
        : undefined;
      this.warmNorms = env.VKMOE_NORM_WARM === "on";
      this.routerWarm = this.routerRouteNorm && env.VKMOE_ROUTER_WARM === "on" ? this.own(new RouterWarm(device, D, cfg.experts, cfg.topK)) : undefined;
      this.routeArrived = this.buffer(16);
      uploadBytes(device, this.routeArrived, 0n, new Uint8Array(16));
      this.argmax = this.own(new ArgmaxKernel(device, { maxV: V }));
      const K = cfg.topK, T = maxTokens;
      this.s = {
        embed: this.buffer(4 * T * D, "upload"), positions: this.buffer(4 * (BATCH_WORDS + T), "upload"),
        h: this.buffer(4 * T * D), xn: this.buffer(4 * T * D), q: this.buffer(4 * T * H * hd), k: this.buffer(4 * T * KV * hd), v: this.buffer(4 * T * KV * hd),
        attn: this.buffer(4 * T * H * hd), o: this.buffer(4 * T * D), ffn: this.buffer(4 * T * D), routerLogits: this.buffer(4 * T * cfg.experts),
        logits: this.buffer(4 * V), logitsHost: this.buffer(4 * V, "readback"), result: this.buffer(16, "readback"),
        chosen: this.buffer(4 * cfg.layers * T * K, "readback"),
        xnHost: this.buffer(4 * T * D, "readback"), routerHost: this.buffer(4 * T * cfg.experts, "readback"), ffnHost: this.buffer(4 * T * D, "upload"),
      };
      this.views = {
        embed: new Float32Array(this.s.embed.host(), 0, T * D), positions: new Uint32Array(this.s.positions.host(), 0, BATCH_WORDS + T),
        logits: new Float32Array(this.s.logitsHost.host(), 0, V), result: new Uint32Array(this.s.result.host(), 0, 4),
        resultValue: new Float32Array(this.s.result.host(), 4, 1),
        chosen: new Int32Array(this.s.chosen.host(), 0, cfg.layers * T * K),
        xn: new Float32Array(this.s.xnHost.host(), 0, T * D), router: new Float32Array(this.s.routerHost.host(), 0, T * cfg.experts),
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

  /** A sequence of up to ctx tokens with its own f16 KV cache in device memory. */
  sequence(ctx: number, options: { timing?: boolean; hostExperts?: HostExperts } = {}): GraphSequence {
    const seq = new GraphSequence(this, ctx, options);
    this.live.add(seq);
    return seq;
  }

  /** Sequences not yet disposed: disposing the graph disposes them first (their recordings use its buffers). */
  readonly live = new Set<GraphSequence>();
  /** Batches not yet disposed (likewise). */
  readonly liveBatches = new Set<Disposable>();

  /** Writes the tokens' embeddings and the first one's position into the mapped inputs (host side of a replay). */
  writeInput(ids: ArrayLike<number>, position: number): void {
    const D = this.cfg.hidden;
    for (let t = 0; t < ids.length; t++) this.weights.embed(ids[t]!, this.views.embed.subarray(t * D, (t + 1) * D));
    this.views.positions[0] = position;
  }

  /** A batched replay's inputs: token t's embedding, its position and its cache row (its sequence's first row + the position). */
  writeBatchInput(ids: ArrayLike<number>, positions: ArrayLike<number>, rows: ArrayLike<number>): void {
    const D = this.cfg.hidden, w = this.views.positions;
    for (let t = 0; t < ids.length; t++) {
      this.weights.embed(ids[t]!, this.views.embed.subarray(t * D, (t + 1) * D));
      w[t] = positions[t]!;
      w[BATCH_WORDS + t] = rows[t]!;
    }
  }

  /**
   * Records one token through every layer (see the module comment) into cb, reading the KV cache
   * of `kv`, and ending as `output` asks. Returns the dispatches recorded.
   */
  recordToken(cb: CommandBuffer, kv: SequenceCache, output: GraphOutput, S = 1, mark: (op: string) => void = () => {}): number {
    if (!this.stage) throw new InvalidArgumentError("this graph has no MoE stage (its experts are not all resident): run it split, layer by layer");
    return this.recordRange(cb, kv, S, { first: 0, end: this.cfg.layers, start: true, output, split: false }, mark);
  }

  /**
   * Records layers [first, end) of S tokens: after each, in `split` mode, the normalised hidden
   * state and the router logits are copied to host memory (the host runs the experts and writes
   * their sum into `ffnHost`, which the next layer's input norm adds); otherwise the router's top-k
   * and the MoE call run here. `start` copies the embeddings in first; `output` (when given) ends
   * with the final norm and lm_head.
   */
  recordRange(
    cb: CommandBuffer, kv: SequenceCache, S: number,
    r: { first: number; end: number; start: boolean; output?: GraphOutput; split: boolean; batch?: BatchOutputs },
    mark: (op: string) => void = () => {},
  ): number {
    if (!Number.isInteger(S) || S < 1 || S > this.maxTokens) throw new InvalidArgumentError(`S must be an integer in 1..${this.maxTokens}, got ${S}`);
    if (r.batch !== undefined && S > GRAPH_MAX_TOKENS) throw new InvalidArgumentError(`a batched replay takes 1..${GRAPH_MAX_TOKENS} tokens, got ${S}`);
    const cfg = this.cfg, s = this.s, st = this.stage;
    const { hidden: D, heads: H, kvHeads: KV, headDim: hd, rmsEps: eps, experts: E, topK: K } = cfg;
    const ffn = r.split ? s.ffnHost : s.ffn;
    let n = 0;
    // `op(name, dispatches)` after each op: counts dispatches and lets a profiler mark the op's end.
    const op = (name: string, dispatches = 1) => {
      n += dispatches;
      mark(name);
    };
    // Ordered after the previous replay (its KV writes, its reads of the scratch) and the copy.
    if (r.start) cb.barrier("computeToTransfer").copyBuffer(s.embed, s.h, BigInt(4 * S * D)).barrier("transferToCompute");
    cb.barrier("computeToCompute");
    // the layer's input norm where the previous layer's MoE call did it (its quantized rows, or none)
    let normDone: { xq: GgmlIdpScratch | undefined } | undefined;
    for (let l = r.first; l < r.end; l++) {
      const L = this.layers[l]!;
      const inputNorm: RmsNormArgs = { x: s.h, add: l > 0 ? ffn : undefined, w: this.norms, wOffset: L.inputNorm, y: s.xn, rows: S, n: D, eps };
      // q, k and v read the norm's quantized rows where they take the integer-dot path
      let xq: GgmlIdpScratch | undefined;
      if (normDone) {
        xq = normDone.xq;
        normDone = undefined;
      } else {
        xq = this.norm.record(cb, inputNorm, [L.q, L.k, L.v]);
        op("input norm");
        cb.barrier("computeToCompute");
      }
      op("q, k, v", L.q.recordFrom(cb, s.xn, xq, s.q, S) + L.k.recordFrom(cb, s.xn, xq, s.k, S) + L.v.recordFrom(cb, s.xn, xq, s.v, S));
      cb.barrier("computeToCompute");
      const norm = { qOffset: L.qNorm, kOffset: L.kNorm, eps };
      // decode calls of one sequence: the attention does the head norms, RoPE and KV append itself (one barrier fewer)
      const fold = kv.attention.foldsRope(S, r.batch !== undefined);
      if (!fold) {
        // the per-head q/k RMSNorm runs inside the RoPE kernel (one head of one token per workgroup)
        // a batch: each token at its own position and cache row, in a cache of kv.rows rows
        kv.rope.record(cb, {
          q: s.q, k: s.k, v: s.v, invFreq: this.invFreq, kCache: kv.keys[l]!, vCache: kv.values[l]!,
          S, heads: H, kvHeads: KV, headDim: hd, ctx: kv.rows, pos0: 0, positions: s.positions, posIndex: 0, batched: r.batch !== undefined,
          norm: { weights: this.norms, ...norm },
        });
        op("q/k norms + rope + kv append");
        cb.barrier("computeToCompute");
      }
      // decode tokens of a float router: the route runs in the router GEMV's last workgroup, no barrier between the two
      const routerWeights = L.router.floatWeights;
      const routeFold = !r.split && this.routerRoute !== undefined && routerWeights !== undefined && S <= ROUTER_ROUTE_MAX_S;
      // and the post norm in each of its workgroups (the last moves the residual on and writes xn)
      const normFold = routeFold && this.routerRouteNorm !== undefined && S <= this.routerRouteNorm.normTokens;
      const route = r.split ? undefined : {
        table: st!.table, work: st!.work, pairs: st!.pairs, slotWeight: st!.slotWeight, slotExpert: st!.slotExpert,
        chosen: s.chosen, S, E, k: K, normalize: cfg.normTopkProb, seq: st!.seq, tableOffset: st!.tableOffset(l), chosenOffset: l * this.maxTokens * K,
      };
      const routerNorm = { h: s.h, add: s.o, weights: this.norms, weightOffset: L.postNorm, eps, xn: s.xn };
      const routerRouteNormArgs = () => ({ ...route!, weights: routerWeights!.buffer, dtype: routerWeights!.dtype, x: s.xn, cols: D, logits: s.routerLogits, arrived: this.routeArrived, norm: routerNorm });
      // that step's pipeline warmed on stand-ins beside the attention (RouterWarm), no barrier between
      if (normFold && this.routerWarm) n += this.routerWarm.record(cb, this.routerRouteNorm!, routerRouteNormArgs());
      // o reads the combine's quantized rows where it takes the integer-dot path
      // (dec_attention_cm writes none: o quantizes its rows itself after it)
      const onCores = kv.attention.promptOnMatrixCores(S, r.batch !== undefined);
      const oq = this.attnQuant && !onCores && L.o.takesQuantized(S) ? this.attnQuant : undefined;
      if (onCores) {
        // a prompt chunk: its keys and values are all in the cache (the RoPE step above)
        op("attention", kv.attention.recordPrompt(cb, kv.bindings[l]!, { S, maxPositions: kv.ctx }));
      } else if (S <= MAX_ATTENTION_TOKENS) {
        kv.attention.record(cb, kv.bindings[l]!, { n: 1, S, maxPositions: kv.ctx, posIndex: 0, batched: r.batch !== undefined, quantize: oq !== undefined, ...(fold && { rope: { norm } }) });
        op(fold ? "attention (+ q/k norms, rope, kv append)" : "attention", kv.attention.dispatches(S));
      } else {
        // a longer prompt chunk: its keys and values are all in the cache (the RoPE step above)
        op("attention", kv.attention.recordLong(cb, kv.bindings[l]!, { S, maxPositions: kv.ctx }));
      }
      cb.barrier("computeToCompute");
      op("o", L.o.recordFrom(cb, s.attn, oq, s.o, S));
      cb.barrier("computeToCompute");
      // the norm after the layer: the next layer's input norm, or after the last layer the final norm
      // (every row of a batch; the last row where a replay ends with logits or an id)
      const next = l + 1 < r.end ? this.layers[l + 1]! : undefined;
      const headRows = r.batch !== undefined ? S : (r.output ?? "none") !== "none" ? 1 : 0;
      const nextNorm = next ? { wOffset: next.inputNorm, readers: [next.q, next.k, next.v], rows: S }
        : l + 1 === cfg.layers && headRows > 0 ? { wOffset: this.finalNorm, readers: [this.lmHead], rows: headRows } : undefined;
      // in the call's last workgroup (one dependent step fewer), where it can: a norm of every row
      const after = nextNorm?.rows === S ? nextNorm : undefined;
      let normTail: MoeNormTail | undefined;
      if (after && !r.split && st!.foldsNorm?.(S)) {
        const a: RmsNormArgs = { x: s.h, add: s.ffn, w: this.norms, wOffset: after.wOffset, y: s.xn, rows: S, n: D, eps };
        const quantized = this.norm.quantizedFor(a, after.readers);
        if (RmsNormQuantKernel.aligned(a) && D % RmsNormQuantKernel.GROUP === 0) {
          normTail = { residual: s.h, weights: this.norms, wOffset: after.wOffset, eps, xn: s.xn, ...(quantized && { quantized }) };
          normDone = { xq: quantized };
        }
      }
      const warmNorm = this.warmNorms && nextNorm && !normTail && !r.split
        ? () => (n += this.norm.recordWarm(cb, { x: s.h, add: s.ffn, w: this.norms, wOffset: nextNorm.wOffset, y: s.xn, rows: nextNorm.rows, n: D, eps }, nextNorm.readers))
        : undefined;
      let xqPost: GgmlIdpScratch | undefined;
      if (!normFold) {
        xqPost = this.norm.record(cb, { x: s.h, add: s.o, w: this.norms, wOffset: L.postNorm, y: s.xn, rows: S, n: D, eps }, [L.router]);
        op("post norm");
        cb.barrier("computeToCompute");
      }
      if (warmNorm && st!.oneStep(S)) warmNorm();
      if (!routeFold) op("router", L.router.recordFrom(cb, s.xn, xqPost, s.routerLogits, S));
      if (r.split) {
        cb.barrier("computeToTransfer")
          .copyBuffer(s.xn, s.xnHost, BigInt(4 * S * D))
          .copyBuffer(s.routerLogits, s.routerHost, BigInt(4 * S * E))
          .barrier("transferToHost");
        continue;
      }
      if (normFold) {
        this.routerRouteNorm!.record(cb, routerRouteNormArgs());
        op("post norm + router + route");
      } else if (routeFold) {
        this.routerRoute!.record(cb, { ...route!, weights: routerWeights!.buffer, dtype: routerWeights!.dtype, x: s.xn, cols: D, logits: s.routerLogits, arrived: this.routeArrived });
        op("router + route");
      } else {
        cb.barrier("computeToCompute");
        this.route.record(cb, { ...route!, logits: s.routerLogits });
        op("route");
      }
      cb.barrier("computeToCompute");
      // the next norm's pipeline warmed on stand-ins (NormFeed.recordWarm) beside the experts' first of two or more steps,
      // or where they are one step beside the router's step before them (measurements, 2026-12-07 and 2026-12-08)
      if (warmNorm && !st!.oneStep(S)) warmNorm();
      // the stage marks each of its steps (a profile's rows "experts: gate+up" ...)
      st!.record(cb, s.xn, s.ffn, S, { chosen: s.chosen, chosenOffset: l * this.maxTokens * K, layer: l, mark: (step) => mark(`experts: ${step}`), ...(normTail && { normTail }) });
      n += st!.dispatches(S);
      cb.barrier("computeToCompute");
    }
    // the last layer's MoE call did the final norm (normDone), or it runs here
    const finalNorm = (a: RmsNormArgs): GgmlIdpScratch | undefined => {
      if (normDone) return normDone.xq;
      const xq = this.norm.record(cb, a, [this.lmHead]);
      op("final norm");
      cb.barrier("computeToCompute");
      return xq;
    };
    if (r.batch) {
      // every token's logits: each row is another sequence's next token
      const xq = finalNorm({ x: s.h, add: ffn, w: this.norms, wOffset: this.finalNorm, y: s.xn, rows: S, n: D, eps });
      op("lm_head", this.lmHead.recordFrom(cb, s.xn, xq, r.batch.logits, S));
      cb.barrier("computeToTransfer").copyBuffer(r.batch.logits, r.batch.logitsHost, BigInt(4 * S * cfg.vocab)).barrier("transferToHost");
      cb.barrier("computeToHost");
      return n;
    }
    const output = r.output ?? "none";
    if (output !== "none") {
      // the last token's row only: its logits are all a replay returns
      const xq = finalNorm({ x: s.h, add: ffn, w: this.norms, wOffset: this.finalNorm, y: s.xn, rows: 1, n: D, eps, xOffset: (S - 1) * D, addOffset: (S - 1) * D });
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
 * The KV cache of `sequences` sequences of ctx positions (one buffer per layer for keys and for
 * values, sequence i's rows from i * ctx) and the kernels bound to it, its resources owned by `owned`.
 */
export function openSequenceCache(graph: DecodeGraph, sequences: number, ctx: number, owned: DisposableStack): SequenceCache {
  const cfg = graph.cfg, device = graph.device;
  const { kvHeads: KV, headDim: hd, heads: H } = cfg;
  const rows = sequences * ctx;
  const layerBytes = rows * KV * hd * 2;
  const limit = device.info.limits.maxStorageBufferRange;
  const what = sequences === 1 ? `${ctx} positions` : `${sequences} x ${ctx} positions`;
  if (layerBytes > limit) throw new GraphUnsupportedError(`a KV cache of ${what} takes ${layerBytes} bytes per layer, past this device's maxStorageBufferRange of ${limit}`);
  const buffer = (bytes: number) => owned.use(new Buffer(device, { size: BigInt(Math.ceil(bytes / 16) * 16), memory: "device", priority: 1 }));
  const keys: Buffer[] = [], values: Buffer[] = [];
  for (let l = 0; l < cfg.layers; l++) {
    keys.push(buffer(layerBytes));
    values.push(buffer(layerBytes));
  }
  const rope = owned.use(new RopeKvKernel(device, { maxSets: cfg.layers }));
  // GPUs: 32 positions per workgroup and 128 threads (H200, 30B-A3B shape at position 812: 37 µs
  // a layer against 48 with the kernel's 64 / 64; scripts/profile-graph.ts). CPU devices keep 64 / 64.
  const shape = device.info.type === 4 ? {} : { chunk: 32, workgroupSize: 128 };
  // ropeFold: decode calls of one sequence fold the RoPE step into the attention (RopeKvKernel's
  // default shape: the same bits); VKMOE_ROPE_FOLD=off keeps the separate step (from the process env,
  // as LinearKernels' integer-dot decision)
  const env = readConfig();
  // only where the graph's chunks reach it (its self-check and pipeline cost the load time otherwise)
  const promptMatrixCores = attentionOnMatrixCores(device, env, graph.maxTokens);
  const attention = owned.use(new DecoderAttention(device, {
    heads: H, kvHeads: KV, headDim: hd, maxBindings: cfg.layers, ropeFold: env.VKMOE_ROPE_FOLD !== "off", combineTail: env.VKMOE_COMBINE_TAIL !== "off", ...shape, ...(promptMatrixCores && { promptMatrixCores }),
  }));
  const partials = buffer(attention.partialBytesUpTo(ctx, Math.min(graph.maxTokens, MAX_ATTENTION_TOKENS)));
  const s = graph.s;
  const fold = attention.ropeFold ? { fold: { k: s.k, v: s.v, invFreq: graph.invFreq, normWeights: graph.norms } } : {};
  const bindings = keys.map((k, l) => attention.bind({ q: s.q, keys: k, values: values[l]!, partials, out: s.attn, positions: s.positions, ...fold, ...(graph.attnQuant && { quantized: graph.attnQuant }) }));
  return { ctx, rows, keys, values, rope, attention, bindings, bytes: 2 * cfg.layers * Math.ceil(layerBytes / 16) * 16 };
}

/** Where a batched replay leaves its S rows of logits: device rows, copied to host memory. */
export interface BatchOutputs {
  logits: Buffer;
  logitsHost: Buffer;
}

/**
 * One sequence's f16 KV cache (a buffer per layer for keys and for values) and the kernels bound
 * to it; or a batch's: `rows` = sequences x ctx rows, sequence i's from row i * ctx.
 */
export interface SequenceCache {
  /** Positions per sequence. */
  ctx: number;
  /** Cache rows in all (ctx for one sequence). */
  rows: number;
  /** Bytes of the keys and values in device memory. */
  bytes: number;
  keys: Buffer[];
  values: Buffer[];
  rope: RopeKvKernel;
  attention: DecoderAttention;
  bindings: AttentionBinding[];
}

/**
 * The host's half of a split run: the experts of `layer` for S tokens, from the normalised hidden
 * state xn [S][D] and the router logits [S][E], written into y [S][D] (the MoE layer's per-layer
 * call, with its expert cache and CPU share).
 */
export type HostExperts = (layer: number, xn: Float32Array, routerLogits: Float32Array, S: number, y: Float32Array) => void;


export class GraphSequence implements Disposable {
  readonly ctx: number;
  /** Bytes of the KV cache in device memory. */
  readonly cacheBytes: number;
  private readonly cache: SequenceCache;
  /** Everything the sequence allocated, disposed in reverse. */
  private readonly owned = new DisposableStack();
  private readonly commands: CommandPool;
  /** Recordings, by recording()'s index: made on first use, replayed after. */
  private readonly recorded: ({ cb: CommandBuffer; submission: Submission; dispatches: number } | undefined)[] = [];
  private readonly fence: Fence;
  private readonly waiter: ReplayWaiter;
  private readonly queries: QueryPool | undefined;
  private readonly tick: number;
  /** Replays so far, and dispatches they recorded. */
  readonly counts = { replays: 0, dispatches: 0 };
  /** GPU µs of the last resident run (with `timing`); split runs leave it 0. */
  lastGpuUs = 0;

  private readonly hostExperts: HostExperts | undefined;

  /** Tokens runTokens takes at most (the graph's maxTokens). */
  get maxChunk(): number {
    return this.graph.maxTokens;
  }

  constructor(private readonly graph: DecodeGraph, ctx: number, options: { timing?: boolean; hostExperts?: HostExperts } = {}) {
    this.hostExperts = options.hostExperts;
    const cfg = graph.cfg, device = graph.device;
    if (!Number.isInteger(ctx) || ctx < 1) throw new InvalidArgumentError(`ctx must be a positive integer, got ${ctx}`);
    this.ctx = ctx;
    try {
      this.cache = openSequenceCache(graph, 1, ctx, this.owned);
      this.cacheBytes = this.cache.bytes;
      this.commands = this.own(new CommandPool(device));
      this.fence = this.own(new Fence(device));
      this.waiter = new ReplayWaiter(this.fence, fenceWaitMode(device));
      this.queries = options.timing && device.info.limits.timestampComputeAndGraphics ? this.own(new QueryPool(device, 2)) : undefined;
      this.tick = device.info.limits.timestampPeriod;
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  private own<T extends Disposable>(d: T): T {
    return this.owned.use(d);
  }

  /**
   * The recording of a whole token (`segment` undefined), or of a split run's part: a layer index
   * (its attention half) or the head ("head"). Made on first use; found by index (no key built per token).
   */
  private recording(output: GraphOutput, S = 1, segment?: number | "head") {
    const L = this.graph.cfg.layers;
    const part = segment === undefined ? 0 : segment === "head" ? 1 : segment + 2;
    const index = (OUTPUTS.indexOf(output) * (this.graph.maxTokens + 1) + S) * (L + 2) + part;
    let r = this.recorded[index];
    if (!r) {
      const cb = this.commands.allocate().begin();
      // GPU time is measured on whole tokens only
      const timed = this.queries && segment === undefined ? this.queries : undefined;
      if (timed) cb.resetQueries(timed).timestamp(timed, 0);
      const dispatches = segment === undefined
        ? this.graph.recordToken(cb, this.cache, output, S)
        : segment === "head"
          ? this.graph.recordRange(cb, this.cache, S, { first: L, end: L, start: false, output, split: true })
          : this.graph.recordRange(cb, this.cache, S, { first: segment, end: segment + 1, start: segment === 0, split: true });
      if (timed) cb.timestamp(timed, 1);
      cb.end();
      const submission = this.own(new Submission(this.graph.device, [cb], { fence: this.fence }));
      this.recorded[index] = r = { cb, submission, dispatches };
    }
    return r;
  }

  /** Dispatches a replay of `output` runs (split: its layers' and head's together). */
  dispatchesOf(output: GraphOutput): number {
    if (this.graph.stage) return this.recording(output).dispatches;
    let n = this.recording(output, 1, "head").dispatches;
    for (let l = 0; l < this.graph.cfg.layers; l++) n += this.recording("none", 1, l).dispatches;
    return n;
  }

  /** Submits per token: 1 resident; split, one per layer and the head, beside the experts' own calls. */
  get submitsPerRun(): number {
    return this.graph.stage ? 1 : this.graph.cfg.layers + 1;
  }

  private submitAndWait(submission: Submission): void {
    const done = this.waiter.run(submission);
    if (!done) throw new Error("decode graph: the GPU did not finish a token within the timeout");
    if (this.graph.injectDeviceLost) {
      this.graph.injectDeviceLost = false;
      throw new DeviceLostError("vkWaitForFences (injected)");
    }
  }

  /**
   * Runs token `id` at `position` (its keys and values go to that row of the cache): one submit,
   * one wait. "logits": returns the logits (a view of host memory, valid until the next run);
   * "argmax": the greedy id and its logit; "none": nothing.
   */
  run(id: number, position: number, output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    this.single[0] = id;
    return this.runTokens(this.single, position, output);
  }

  private readonly single = [0];

  /**
   * Runs 1..maxChunk consecutive tokens from `position` in one replay (a prompt chunk:
   * each weight read once for all of them); the output is the last token's.
   */
  runTokens(ids: ArrayLike<number>, position: number, output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    if (this.disposed) throw new InvalidArgumentError("this sequence (or its model) is disposed");
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

  /** What a run returns for `output`, read from the host-visible outputs. */
  private result(output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    const v = this.graph.views;
    if (output === "logits") return { logits: v.logits };
    if (output === "none") return {};
    const bestId = v.result[0]!;
    return { id: bestId === ARGMAX_NONE ? -1 : bestId, value: v.resultValue[0] };
  }

  /**
   * A split run (the experts not all resident): each layer's attention half on the GPU, then its
   * experts on the host (`hostExperts`), their sum written where the next layer adds it; then the head.
   */
  private runSplit(S: number, output: GraphOutput): { logits?: Float32Array; id?: number; value?: number } {
    const experts = this.hostExperts;
    if (!experts) throw new InvalidArgumentError("a split run needs the host's experts (hostExperts)");
    const v = this.graph.views, D = this.graph.cfg.hidden, E = this.graph.cfg.experts;
    const xn = v.xn.subarray(0, S * D), logits = v.router.subarray(0, S * E), y = v.ffn.subarray(0, S * D);
    for (let l = 0; l < this.graph.cfg.layers; l++) {
      const r = this.recording("none", S, l);
      this.submitAndWait(r.submission);
      this.counts.dispatches += r.dispatches;
      experts(l, xn, logits, S, y);
    }
    this.counts.replays++;
    if (output === "none") return {};
    const h = this.recording(output, S, "head");
    this.submitAndWait(h.submission);
    this.counts.dispatches += h.dispatches;
    return this.result(output);
  }

  /**
   * Runs tokens `ids` from `position` once through a recording with a timestamp after every op (a
   * profiler's recording, not the replayed one: the timestamps cost a little) and returns each
   * op's GPU µs in order, the time since the previous op ended.
   */
  profile(ids: readonly number[], position: number, output: GraphOutput): { op: string; us: number }[] {
    const S = ids.length;
    if (!Number.isInteger(S) || S < 1 || S > this.maxChunk) throw new InvalidArgumentError(`a profile runs 1..${this.maxChunk} tokens, got ${S}`);
    if (!Number.isInteger(position) || position < 0 || position + S > this.ctx) throw new InvalidArgumentError(`positions ${position}..${position + S - 1} are outside the context 0..${this.ctx - 1}`);
    const device = this.graph.device;
    const names: string[] = [];
    const cfg = this.graph.cfg;
    using queries = new QueryPool(device, 8 + 24 * cfg.layers);
    using pool = new CommandPool(device);
    const cb = pool.allocate().begin();
    cb.resetQueries(queries).timestamp(queries, 0);
    this.graph.recordToken(cb, this.cache, output, S, (op) => {
      names.push(op);
      cb.timestamp(queries, names.length);
    });
    cb.end();
    using fence = new Fence(device);
    using submission = new Submission(device, [cb], { fence });
    this.graph.writeInput(ids, position);
    submission.submit();
    if (!fence.wait()) throw new Error("decode graph: the profiled tokens did not finish within the timeout");
    const t = queries.results(0, names.length + 1);
    return names.map((op, i) => ({ op, us: (Number(t[i + 1]! - t[i]!) * this.tick) / 1000 }));
  }

  /** Expert ids the router chose at every layer for the tokens of the last run: [layers][maxChunk][topK], the first S rows of each layer filled. */
  lastRouting(): Int32Array {
    return this.graph.views.chosen;
  }

  private dispose(): void {
    this.owned.dispose();
  }

  private disposed = false;

  [Symbol.dispose](): void {
    if (this.disposed) return;
    this.disposed = true;
    try {
      this.graph.device.waitIdle();
    } catch {
      // a lost device: destroying is still valid
    }
    this.recorded.length = 0;
    this.dispose();
    this.graph.live.delete(this);
  }
}
