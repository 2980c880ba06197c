/** Turns what a user typed into prompt ids: the model's chat template by default, the raw text with `raw`. */
import { InvalidArgumentError } from "../errors.ts";
import type { Model } from "../model/model.ts";
import type { ChatMessage } from "../tokenizer/chat-template.ts";

export interface PromptOptions {
  /** Plain completion of the text, no template. */
  raw?: boolean;
  system?: string;
  /** Qwen3's thinking switch, passed to the template when set. */
  enableThinking?: boolean;
}

/** The messages of one chat turn, after `history` (earlier turns, alternating user/assistant). */
export function chatMessages(prompt: string, options: PromptOptions, history: readonly ChatMessage[] = []): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (options.system !== undefined) messages.push({ role: "system", content: options.system });
  return [...messages, ...history, { role: "user", content: prompt }];
}

export function promptIds(model: Model, prompt: string, options: PromptOptions = {}, history: readonly ChatMessage[] = []): number[] {
  if (options.raw) {
    if (options.system !== undefined) throw new InvalidArgumentError("--system needs the chat template; it cannot go with --raw");
    return model.tokenizer.encode(prompt, { addBos: model.tokenizer.addBos });
  }
  const template = model.chatTemplate;
  if (!template) throw new InvalidArgumentError(`${model.source.path} has no chat template; use --raw for plain completion`);
  const text = template.render(chatMessages(prompt, options, history), { addGenerationPrompt: true, enableThinking: options.enableThinking });
  return model.tokenizer.encode(text);
}
