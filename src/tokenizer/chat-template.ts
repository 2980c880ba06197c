/**
 * A model's chat template (Jinja, rendered by @huggingface/jinja), from tokenizer_config.json /
 * chat_template.jinja or GGUF `tokenizer.chat_template`, called the way transformers'
 * apply_chat_template calls it: messages, tools (null when none), documents (null),
 * add_generation_prompt, the tokenizer's special token texts (bos_token, eos_token, ...) and extra
 * variables such as enable_thinking, passed only when set so that `is defined` tests work.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Template } from "@huggingface/jinja";
import { InvalidArgumentError } from "../errors.ts";
import { byteLevelToText } from "./byte-level.ts";
import { ChatTemplateError } from "./errors.ts";
import { GgufTokenType } from "./gguf-vocabulary.ts";
import { readDirectoryJson, specialTokenText } from "./hf-directory.ts";

export interface ChatMessage {
  role: string;
  content: string;
  /** Other fields a template may read: reasoning_content, tool_calls, name, ... */
  [field: string]: unknown;
}

export interface ChatRenderOptions {
  /** End with the assistant's turn header, ready for generation (default true). */
  addGenerationPrompt?: boolean;
  /** Qwen3's switch: false renders an empty think block so that the model answers directly. Passed only when set. */
  enableThinking?: boolean;
  /** Tool JSON schemas, as transformers passes them. */
  tools?: unknown[];
  /** Any other template variables. */
  variables?: Record<string, unknown>;
}

/** Special token texts a template may use, named as transformers names them. */
export type ChatSpecialTokens = Partial<Record<"bos_token" | "eos_token" | "pad_token" | "unk_token", string>>;

export class ChatTemplate {
  readonly source: string;
  readonly specialTokens: Readonly<ChatSpecialTokens>;
  private readonly template: Template;

  constructor(source: string, specialTokens: ChatSpecialTokens = {}) {
    if (typeof source !== "string" || !source) throw new ChatTemplateError("missing", "chat template source is empty");
    try {
      this.template = new Template(source);
    } catch (cause) {
      throw new ChatTemplateError("parse", `chat template does not parse: ${(cause as Error).message}`, { cause });
    }
    this.source = source;
    this.specialTokens = Object.freeze({ ...specialTokens });
  }

  /** chat_template.jinja when the directory has one (transformers prefers it), else tokenizer_config.json's chat_template. */
  static fromHfDirectory(dir: string, name = "default"): ChatTemplate {
    const config = readDirectoryJson(dir, "tokenizer_config.json", true)!;
    const jinjaPath = join(dir, "chat_template.jinja");
    if (name === "default" && existsSync(jinjaPath)) return new ChatTemplate(readFileSync(jinjaPath, "utf8"), hfSpecialTokens(config));
    return ChatTemplate.fromTokenizerConfig(config, name);
  }

  /** tokenizer_config.json's chat_template: a string, or a list of `{ name, template }` of which `name` is taken. */
  static fromTokenizerConfig(config: Record<string, unknown>, name = "default"): ChatTemplate {
    const value = config.chat_template;
    const source = Array.isArray(value)
      ? (value.find((t) => t && typeof t === "object" && t.name === name)?.template as unknown)
      : name === "default" ? value : undefined;
    if (typeof source !== "string") throw new ChatTemplateError("missing", `tokenizer_config has no chat_template${name === "default" ? "" : ` named ${JSON.stringify(name)}`}`);
    return new ChatTemplate(source, hfSpecialTokens(config));
  }

  /** GGUF `tokenizer.chat_template` (or `tokenizer.chat_template.<name>`), with BOS/EOS texts from the vocabulary, as llama.cpp passes them. */
  static fromGgufMetadata(metadata: Record<string, unknown>, name = "default"): ChatTemplate {
    const key = name === "default" ? "tokenizer.chat_template" : `tokenizer.chat_template.${name}`;
    const source = metadata[key];
    if (typeof source !== "string") throw new ChatTemplateError("missing", `GGUF metadata has no ${key}`);
    return new ChatTemplate(source, ggufSpecialTokens(metadata));
  }

  render(messages: readonly ChatMessage[], options: ChatRenderOptions = {}): string {
    if (!Array.isArray(messages)) throw new InvalidArgumentError("render: messages must be an array of { role, content }");
    messages.forEach((m, i) => {
      if (!m || typeof m !== "object" || typeof m.role !== "string") throw new InvalidArgumentError(`render: messages[${i}] has no string role`);
    });
    const variables: Record<string, unknown> = {
      ...this.specialTokens,
      ...options.variables,
      messages,
      tools: options.tools ?? null,
      documents: null,
      add_generation_prompt: options.addGenerationPrompt ?? true,
    };
    if (options.enableThinking !== undefined) variables.enable_thinking = options.enableThinking;
    try {
      return this.template.render(variables);
    } catch (cause) {
      throw new ChatTemplateError("render", `chat template failed while rendering: ${(cause as Error).message}`, { cause });
    }
  }
}

function hfSpecialTokens(config: Record<string, unknown>): ChatSpecialTokens {
  const tokens: ChatSpecialTokens = {};
  for (const key of ["bos_token", "eos_token", "pad_token", "unk_token"] as const) {
    const text = specialTokenText(config[key]);
    if (text !== undefined) tokens[key] = text;
  }
  return tokens;
}

function ggufSpecialTokens(metadata: Record<string, unknown>): ChatSpecialTokens {
  const tokens = metadata["tokenizer.ggml.tokens"];
  const types = metadata["tokenizer.ggml.token_type"];
  const result: ChatSpecialTokens = {};
  if (!Array.isArray(tokens)) return result;
  const keys = { bos_token: "bos_token_id", eos_token: "eos_token_id", pad_token: "padding_token_id", unk_token: "unknown_token_id" } as const;
  for (const [name, key] of Object.entries(keys) as [keyof ChatSpecialTokens, string][]) {
    const raw = metadata[`tokenizer.ggml.${key}`];
    const id = typeof raw === "bigint" ? Number(raw) : raw;
    if (typeof id !== "number" || typeof tokens[id] !== "string") continue;
    // Control tokens are their text; a normal token is spelled in ByteLevel characters.
    const isNormal = !Array.isArray(types) || Number(types[id]) === GgufTokenType.normal;
    result[name] = isNormal ? byteLevelToText(tokens[id]) : tokens[id];
  }
  return result;
}
