/**
 * Which architecture a model file describes, and its config: Qwen3-MoE (config.ts) or the hybrid
 * Qwen3.5 MoE (qwen35-config.ts), told by config.json's model_type or GGUF general.architecture.
 */
import { configFromGguf, configFromHf, type Qwen3MoeConfig } from "./config.ts";
import { isQwen35HfConfig, qwen35ConfigFromGguf, qwen35ConfigFromHf, type Qwen35MoeConfig } from "./qwen35-config.ts";

export type ModelConfig = Qwen3MoeConfig | Qwen35MoeConfig;

export function modelConfigFromHf(json: unknown, where = "config.json"): ModelConfig {
  return isQwen35HfConfig(json) ? qwen35ConfigFromHf(json, where) : configFromHf(json, where);
}

export function modelConfigFromGguf(meta: Readonly<Record<string, unknown>>, hasTensor: (name: string) => boolean, where = "GGUF"): ModelConfig {
  return meta["general.architecture"] === "qwen35moe" ? qwen35ConfigFromGguf(meta, hasTensor, where) : configFromGguf(meta, hasTensor, where);
}
