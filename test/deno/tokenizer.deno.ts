/**
 * The tokenizer under Deno, from tokenizer.json and from GGUF metadata: a few reference cases,
 * both prompts' ids, the chat template from both sources, and the streaming detokenizer.
 * The full suite is test/tokenizer.test.ts.
 */
import { readFileSync } from "node:fs";
import { gguf } from "@huggingface/gguf";
import { ChatTemplate, TextTokenizer, TokenTextStream, UnsupportedTokenizerError } from "../../src/tokenizer/index.ts";
import { fixture } from "../support/fixtures.ts";

declare const Deno: any;

function assertEqual(actual: unknown, expected: unknown, what: string): void {
  const [a, e] = [JSON.stringify(actual), JSON.stringify(expected)];
  if (a !== e) throw new Error(`${what}: got ${a.slice(0, 300)}, expected ${e.slice(0, 300)}`);
}

const dir = fixture("qwen3-moe-tiny");
const ggufPath = fixture("qwen3-moe-tiny.Q8_0.gguf");

if (dir && ggufPath) {
  const reference = JSON.parse(readFileSync(`${dir}/reference.json`, "utf8"));
  const metadata = (await gguf(ggufPath, { allowLocalFile: true })).metadata as unknown as Record<string, unknown>;
  const chat = reference.prompts.find((p: { kind: string }) => p.kind === "chat");
  const raw = reference.prompts.find((p: { kind: string }) => p.kind === "raw");

  const sources: [string, () => TextTokenizer, () => ChatTemplate][] = [
    ["tokenizer.json", () => TextTokenizer.fromHfDirectory(dir), () => ChatTemplate.fromHfDirectory(dir)],
    ["GGUF metadata", () => TextTokenizer.fromGgufMetadata(metadata), () => ChatTemplate.fromGgufMetadata(metadata)],
  ];
  for (const [label, makeTokenizer, makeTemplate] of sources) {
    Deno.test(`tokenizer under Deno from ${label}: reference cases, prompts, chat template, stream`, () => {
      const t0 = performance.now();
      const tokenizer = makeTokenizer();
      console.log(`  ${label}: built in ${(performance.now() - t0).toFixed(0)} ms`);
      // Contractions, CJK, emoji, digits, \r\n, specials, long runs.
      for (const index of [10, 11, 13, 17, 20, 21, 22, 28]) {
        const c = reference.tokenizer_cases[index];
        assertEqual(tokenizer.encode(c.text), c.ids, `case ${JSON.stringify(c.text)}`);
        assertEqual(tokenizer.decode(c.ids), c.text, `decode ${JSON.stringify(c.text)}`);
      }
      assertEqual(tokenizer.encode(raw.source), raw.input_ids, "raw prompt");
      const rendered = makeTemplate().render(chat.source.messages, { addGenerationPrompt: true, enableThinking: false });
      assertEqual(rendered, chat.source.rendered, "rendered chat prompt");
      assertEqual(tokenizer.encode(rendered), chat.input_ids, "chat prompt");

      const stream = new TokenTextStream(tokenizer);
      let text = "";
      for (const id of raw.input_ids) {
        const delta = stream.push(id);
        if (delta.includes("\uFFFD")) throw new Error(`replacement character in delta after id ${id}`);
        text += delta;
      }
      text += stream.flush();
      assertEqual(text, tokenizer.decode(raw.input_ids), "streamed raw prompt");
      assertEqual(text, raw.source, "streamed raw prompt vs source");
    });
  }
}

Deno.test("tokenizer under Deno: unsupported GGUF pre-tokenizer is a typed error", () => {
  try {
    TextTokenizer.fromGgufMetadata({ "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.tokens": [], "tokenizer.ggml.merges": [] });
  } catch (e) {
    if (e instanceof UnsupportedTokenizerError && e.found === "llama-bpe") return;
    throw e;
  }
  throw new Error("no error for an unsupported pre-tokenizer");
});
