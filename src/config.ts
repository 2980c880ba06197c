/** VKMOE_* environment variables, validated with zod at the boundary. Unknown VKMOE_* names are rejected. */
import { z } from "zod";
import { VkmoeError } from "./errors.ts";
import { readEnv } from "./env.ts";

export class ConfigError extends VkmoeError {
  constructor(message: string) {
    super("CONFIG", message);
  }
}

const mode3 = z.enum(["auto", "on", "off"]);
const envSchema = z.strictObject({
  VKMOE_LOADER: z.string().min(1).optional(),
  VKMOE_DEVICE: z.string().min(1).optional(),
  VKMOE_GPU: z.stringbool().default(true),
  VKMOE_BDA: z.enum(["auto", "off"]).default("auto"),
  VKMOE_IDP: mode3.default("auto"),
  VKMOE_FLOAT_ATOMICS: z.enum(["auto", "off"]).default("auto"),
  /**
   * Prompt chunks' larger dense GEMMs on the matrix cores where the driver offers them and the kernel
   * passes its self-check ("auto", the default, or "on": VK_NV_cooperative_matrix, else
   * VK_KHR_cooperative_matrix; "nv" / "khr": only that one), or never ("off").
   */
  VKMOE_COOPMAT: z.enum(["auto", "on", "off", "khr", "nv"]).default("auto"),
  /**
   * Prompt chunks' experts on the matrix cores where the dense GEMMs run there (moe_ggml_cm,
   * moe_pool_cm): "auto" for calls of 256 tokens or more (src/moe/prefill-plan.ts), "on" for every
   * call regrouped by expert, "off" never.
   */
  VKMOE_MOE_COOPMAT: z.enum(["auto", "on", "off"]).default("auto"),
  /**
   * Prompt chunks' attention on the matrix cores where the dense GEMMs run there (dec_attention_cm,
   * one dispatch a chunk): "auto" for chunks of more than 64 tokens, "on" for every chunk of more
   * than 4, "off" never; "emulated" runs its emulation (plain sums over the same tiles, any device
   * with shaderFloat16 and the Vulkan memory model; slow: for checking its arithmetic) as "on".
   */
  VKMOE_ATTENTION_COOPMAT: z.enum(["auto", "on", "off", "emulated"]).default("auto"),
  /**
   * Tokens a prompt chunk's replay takes at most in the graphs: "auto" 512 where the experts run on
   * the matrix cores (VKMOE_MOE_COOPMAT), else 64; or 64, 128, 256, 512 (each weight read once for
   * that many, the delta rule run 64 tokens at a time within it).
   */
  VKMOE_PREFILL_CHUNK: z.enum(["auto", "64", "128", "256", "512"]).default("auto"),
  VKMOE_PRELAUNCH: mode3.default("auto"),
  VKMOE_STAGED: mode3.default("auto"),
  /** Decode attention does the q/k head norms, RoPE and KV append itself ("auto"), or after its own dispatch ("off"). */
  VKMOE_ROPE_FOLD: z.enum(["auto", "off"]).default("auto"),
  /** Decode attention merges its partial records in the last workgroup of each KV head ("auto"), or in a dispatch of its own ("off"). */
  VKMOE_COMBINE_TAIL: z.enum(["auto", "off"]).default("auto"),
  /** Decode's Gated DeltaNet delta rule runs the conv1d itself ("auto"), or after the conv's own dispatch ("off"). */
  VKMOE_CONV_FOLD: z.enum(["auto", "off"]).default("auto"),
  /** Qwen3.5 prompt chunks past 64 tokens run the delta rule in two passes ("auto"), or 64 tokens a dispatch ("off"). */
  VKMOE_DELTA_SPLIT: z.enum(["auto", "off"]).default("auto"),
  /**
   * Matrix-core prompt chunks of 256 tokens or more of the dense matrices on 128-row tiles: "ggml" for
   * GGML block matrices (K-quant files; the default: q4/q8 pool matrices were slower there on an
   * H100), "on" for both, "off" for neither: the 64 x 64 tiles of shorter chunks.
   */
  VKMOE_WIDE_GEMM: z.enum(["ggml", "on", "off"]).default("ggml"),
  /**
   * Decode's MoE router GEMV does the post-attention norm in each workgroup and routes the tokens in
   * its last ("auto"), only routes them ("route": the norm its own dispatch), or neither ("off").
   */
  VKMOE_ROUTE_FOLD: z.enum(["auto", "route", "off"]).default("auto"),
  /**
   * Qwen3.5 MoE decode: the shared expert runs as one more slot a token of the fused MoE call where
   * it has the routed experts' shape ("auto"), or as dense matrices beside the call ("off").
   */
  VKMOE_SHARED_SLOT: z.enum(["auto", "off"]).default("auto"),
  /**
   * Decode calls of GGML-block experts do the next layer's input norm in the last workgroup of their
   * down dispatch ("on": measured 2.6% slower a token than the default on an H100, README), or the
   * norm is a dispatch of its own ("off", the default).
   */
  VKMOE_NORM_TAIL: z.enum(["on", "off"]).default("off"),
  /**
   * The whole-token graphs run the next norm's pipeline once on stand-in rows beside the first of
   * the experts' two or more steps, or beside the router's step where the experts are one step ("on",
   * the default), so that the norm after the experts finds its code warm; "off": not.
   */
  VKMOE_NORM_WARM: z.enum(["on", "off"]).default("on"),
  /**
   * The whole-token graphs run the post norm + router + route step's pipeline once on stand-in rows
   * beside the mixer's long step two steps before it ("on", the default), so that the real step finds
   * its code and the router's weights in the cache; "off": not.
   */
  VKMOE_ROUTER_WARM: z.enum(["on", "off"]).default("on"),
  /**
   * The whole-token graphs' q4/q8 GEMVs of one token (Q4_0 / Q8_0 files' decode tokens): "table" (the
   * default) the tuning table's shape, as every call; "narrow" on an NVIDIA GPU 64 threads x 2 rows,
   * the GGML GEMVs' decode shape there (not yet timed for q4/q8).
   */
  VKMOE_QUANT_GEMV_SHAPE: z.enum(["table", "narrow"]).default("table"),
  /** Prompt chunks of q4/q8 matrices (Q4_0 / Q8_0 files) on the integer-dot GEMM where the integer-dot path is on ("on", the default: 1.2-1.4x the float GEMM on the H200), or the float GEMM ("off"). */
  VKMOE_QUANT_GEMM_IDP: z.enum(["on", "off"]).default("on"),
  /**
   * How the host waits for a token's replay: "block" in vkWaitForFences, or "hybrid": blocked for
   * most of the time the same replay took last, then polling the fence (a CPU core busy for the
   * rest); "auto": hybrid on a GPU, block on a CPU device.
   */
  VKMOE_FENCE_WAIT: z.enum(["auto", "block", "hybrid"]).default("auto"),
  VKMOE_VALIDATION: z.stringbool().default(false),
  VKMOE_BUDGET_MB: z.coerce.number().int().positive().optional(),
  VKMOE_IGNORE_BUDGET_EXT: z.stringbool().default(false),
  VKMOE_CACHE_DIR: z.string().min(1).optional(),
  /**
   * The whole token on the GPU where every expert is resident: "auto" on a GPU (a CPU Vulkan
   * device such as Lavapipe runs the CPU decoder, faster there), "on" on any device, "off" never
   * (the CPU decoder with the experts per layer).
   */
  VKMOE_GRAPH: mode3.default("auto"),
  /**
   * The host's Bearer key (`bun run serve`; --api-key wins over it). Here so that the one strict
   * reader accepts it; the engine ignores it, and the host checks its length.
   */
  VKMOE_API_KEY: z.string().min(1).optional(),
});

export type VkmoeEnv = z.infer<typeof envSchema>;

/** Documented defaults, in the order the README lists them. */
export const ENV_NAMES = Object.keys(envSchema.shape) as (keyof VkmoeEnv)[];

function allEnv(): Record<string, string> {
  const deno = (globalThis as any).Deno;
  try {
    if (deno?.env) return deno.env.toObject();
  } catch {
    // No --allow-env: read the names we know one by one below.
  }
  const out: Record<string, string> = {};
  const proc = (globalThis as any).process?.env;
  if (proc) for (const k of Object.keys(proc)) out[k] = proc[k];
  else for (const k of ENV_NAMES) {
    const v = readEnv(k);
    if (v !== undefined) out[k] = v;
  }
  return out;
}

/** Parses the VKMOE_* variables of `source` (default: the process environment). */
export function readConfig(source: Record<string, string | undefined> = allEnv()): VkmoeEnv {
  const picked: Record<string, string> = {};
  for (const [k, v] of Object.entries(source)) if (k.startsWith("VKMOE_") && v !== undefined && v !== "") picked[k] = v;
  const parsed = envSchema.safeParse(picked);
  if (!parsed.success) throw new ConfigError(`invalid VKMOE_* environment:\n${z.prettifyError(parsed.error)}`);
  return parsed.data;
}
