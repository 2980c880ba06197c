/**
 * The tokenizer, streaming detokenizer and chat template against transformers' own outputs for the
 * real Qwen3 tokenizer (fixtures/qwen3-moe-tiny/reference.json), built from the HF directory and
 * from each GGUF's metadata. Synthetic vocabularies cover the error paths without fixtures.
 */
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { gguf } from "@huggingface/gguf";
import { InvalidArgumentError, VkmoeError } from "../src/errors.ts";
import {
  ChatTemplate,
  ChatTemplateError,
  TextTokenizer,
  TokenTextStream,
  TokenizerLoadError,
  UnsupportedTokenizerError,
  tokenizerSpecFromGguf,
  tokenizerSpecFromHfDirectory,
} from "../src/tokenizer/index.ts";
import { fixture } from "./support/fixtures.ts";

interface Reference {
  tokenizer_cases: { text: string; ids: number[] }[];
  prompts: (
    | { kind: "raw"; source: string; input_ids: number[]; greedy_new_ids: number[]; greedy_new_text: string }
    | { kind: "chat"; source: { messages: { role: string; content: string }[]; rendered: string; enable_thinking: boolean }; input_ids: number[]; greedy_new_ids: number[]; greedy_new_text: string }
  )[];
}

const dir = fixture("qwen3-moe-tiny");
const ggufPaths = { Q8_0: fixture("qwen3-moe-tiny.Q8_0.gguf"), Q4_0: fixture("qwen3-moe-tiny.Q4_0.gguf") };
const reference: Reference | undefined = dir ? JSON.parse(readFileSync(`${dir}/reference.json`, "utf8")) : undefined;
const qwen35Dir = fixture("qwen3.5-moe-tiny");

const once = <T>(make: () => Promise<T>) => {
  let value: Promise<T> | undefined;
  return () => (value ??= make());
};
const metadataOf = Object.fromEntries(
  Object.entries(ggufPaths).map(([name, path]) => [name, once(async () => (await gguf(path!, { allowLocalFile: true })).metadata as unknown as Record<string, unknown>)]),
) as Record<keyof typeof ggufPaths, () => Promise<Record<string, unknown>>>;
const hfTokenizer = once(async () => TextTokenizer.fromHfDirectory(dir!));
const ggufTokenizer = Object.fromEntries(
  Object.keys(ggufPaths).map((name) => [name, once(async () => TextTokenizer.fromGgufMetadata(await metadataOf[name as keyof typeof ggufPaths]()))]),
) as Record<keyof typeof ggufPaths, () => Promise<TextTokenizer>>;

/** Every tokenizer source, each with its label. */
const sources: [string, () => Promise<TextTokenizer>, () => string | undefined][] = [
  ["tokenizer.json", hfTokenizer, () => dir],
  ["Q8_0 GGUF metadata", ggufTokenizer.Q8_0, () => dir && ggufPaths.Q8_0],
  ["Q4_0 GGUF metadata", ggufTokenizer.Q4_0, () => dir && ggufPaths.Q4_0],
];

const promptText = (p: Reference["prompts"][number]) => (p.kind === "raw" ? p.source : p.source.rendered);
const chatPrompt = () => reference!.prompts.find((p) => p.kind === "chat") as Extract<Reference["prompts"][number], { kind: "chat" }>;

/** Concatenated deltas of a stream fed `ids` one at a time, plus after how many pushes bytes were held back. */
function streamText(tokenizer: TextTokenizer, ids: number[], skipSpecial = false): { text: string; deltas: string[]; heldBack: number } {
  const stream = new TokenTextStream(tokenizer, { skipSpecial });
  const utf8 = new TextEncoder();
  const deltas: string[] = [];
  let heldBack = 0;
  let pushedBytes = 0;
  let emittedBytes = 0;
  for (const id of ids) {
    const delta = stream.push(id);
    if (!(skipSpecial && tokenizer.isSpecial(id))) pushedBytes += tokenizer.tokenBytes(id).length;
    emittedBytes += utf8.encode(delta).length;
    if (emittedBytes < pushedBytes) heldBack++;
    deltas.push(delta);
  }
  deltas.push(stream.flush());
  return { text: deltas.join(""), deltas, heldBack };
}

function mismatches(tokenizer: TextTokenizer, cases: { text: string; ids: number[] }[]): string[] {
  return cases.filter((c) => JSON.stringify(tokenizer.encode(c.text)) !== JSON.stringify(c.ids)).map((c) => JSON.stringify(c.text));
}

for (const [label, load, available] of sources) {
  describe(`tokenizer from ${label}`, () => {
    test("all 32 reference cases give transformers' ids", async () => {
      if (!available()) return;
      const tokenizer = await load();
      expect(reference!.tokenizer_cases.length).toBe(32);
      expect(mismatches(tokenizer, reference!.tokenizer_cases)).toEqual([]);
    });

    test("both reference prompts give their input_ids (the chat one parses <|im_start|> etc. as specials)", async () => {
      if (!available()) return;
      const tokenizer = await load();
      for (const prompt of reference!.prompts) expect(tokenizer.encode(promptText(prompt))).toEqual(prompt.input_ids);
    });

    test("decode round trip: every case, and transformers' decode of the greedy ids", async () => {
      if (!available()) return;
      const tokenizer = await load();
      for (const c of reference!.tokenizer_cases) expect(tokenizer.decode(c.ids)).toBe(c.text);
      expect(tokenizer.decode(Int32Array.from(reference!.prompts[0]!.input_ids))).toBe(promptText(reference!.prompts[0]!)); // sampler output
      for (const prompt of reference!.prompts) {
        expect(tokenizer.decode(prompt.input_ids)).toBe(promptText(prompt));
        expect(tokenizer.decode(prompt.greedy_new_ids)).toBe(prompt.greedy_new_text);
      }
    });

    test("NFC: decomposed text tokenizes like its composed form", async () => {
      if (!available()) return;
      const tokenizer = await load();
      for (const text of ["café naïve", "Ünïcödé çàfé naïve", "한국어 텍스트"]) {
        const decomposed = text.normalize("NFD");
        expect(decomposed).not.toBe(text);
        expect(tokenizer.encode(decomposed)).toEqual(tokenizer.encode(text));
      }
    });

    test("contractions match case-insensitively, as the split regex's (?i:...) says (no reference case has one in capitals)", async () => {
      if (!available()) return;
      const tokenizer = await load();
      // The contraction is its own piece before the letters after it; case-sensitively "'SELF" would be one.
      expect(tokenizer.encode("IT'SELF").map((id) => tokenizer.tokenText(id))).toEqual(["IT", "'S", "EL", "F"]);
      expect(tokenizer.encode("she'DO").map((id) => tokenizer.tokenText(id))).toEqual(["she", "'D", "O"]);
    });

    test("special: false tokenizes control tokens as text; <think> (not special) still matches", async () => {
      if (!available()) return;
      const tokenizer = await load();
      const text = "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>";
      const plain = tokenizer.encode(text, { special: false });
      expect(plain).not.toContain(tokenizer.tokenId("<|im_start|>")!);
      expect(plain).not.toContain(tokenizer.tokenId("<|im_end|>")!);
      expect(plain).toContain(tokenizer.tokenId("<think>")!);
      expect(plain).toContain(tokenizer.tokenId("</think>")!);
      expect(tokenizer.decode(plain)).toBe(text);
      // Without specials in the text both paths agree.
      for (const c of reference!.tokenizer_cases.filter((c) => !c.text.includes("<|"))) expect(tokenizer.encode(c.text, { special: false })).toEqual(c.ids);
    });

    test("skipSpecial drops control tokens only; unknown ids decode to nothing; bad ids are typed errors", async () => {
      if (!available()) return;
      const tokenizer = await load();
      const chat = chatPrompt();
      const skipped = tokenizer.decode(chat.input_ids, { skipSpecial: true });
      expect(skipped).toBe(chat.source.rendered.replaceAll("<|im_start|>", "").replaceAll("<|im_end|>", ""));
      expect(skipped).toContain("<think>");
      expect(tokenizer.decode([])).toBe("");
      expect(tokenizer.decode([151700, 785, 151935])).toBe("The"); // embedding padding rows
      expect(() => tokenizer.decode([785, -1])).toThrow(InvalidArgumentError);
      expect(() => tokenizer.decode([1.5])).toThrow(InvalidArgumentError);
      expect(tokenizer.tokenText(785)).toBe("The");
      expect(tokenizer.tokenText(23811)).toBe("Ġhello");
      expect(tokenizer.tokenText(151645)).toBe("<|im_end|>");
      expect(tokenizer.isSpecial(151645)).toBe(true);
      expect(tokenizer.isSpecial(151667)).toBe(false); // <think>
    });

    test("stream: one id at a time, never U+FFFD for valid text, holds back split characters, equals decode", async () => {
      if (!available()) return;
      const tokenizer = await load();
      const raw = reference!.prompts.find((p) => p.kind === "raw")!;
      expect(promptText(raw)).toContain("你好，世界！");
      expect(promptText(raw)).toContain("🙂");
      // Characters of 4 bytes split 3+1 and runs of symbols split mid-character ("𝔘" is 124026 + 246).
      const exotic = "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ᚠᛇᚻ 🧑‍🔬 ꙮ ∃δ";
      expect(tokenizer.decode(tokenizer.encode(exotic))).toBe(exotic);
      const sequences = [raw.input_ids, chatPrompt().input_ids, tokenizer.encode(exotic), ...reference!.tokenizer_cases.map((c) => c.ids), reference!.tokenizer_cases.flatMap((c) => c.ids)];
      let heldBack = 0;
      for (const ids of sequences) {
        const streamed = streamText(tokenizer, ids);
        for (const delta of streamed.deltas) expect(delta).not.toContain("\uFFFD");
        expect(streamed.text).toBe(tokenizer.decode(ids));
        heldBack += streamed.heldBack;
      }
      expect(heldBack).toBeGreaterThan(10); // characters really were split across tokens
      // skipSpecial streams like decode(skipSpecial).
      expect(streamText(tokenizer, chatPrompt().input_ids, true).text).toBe(tokenizer.decode(chatPrompt().input_ids, { skipSpecial: true }));
    });

    test("stream over random-model output: invalid UTF-8 becomes U+FFFD exactly where decode puts it", async () => {
      if (!available()) return;
      const tokenizer = await load();
      const texts: { ids: number[]; text: string }[] = reference!.prompts.map((p) => ({ ids: p.greedy_new_ids, text: p.greedy_new_text }));
      if (qwen35Dir) {
        const ref35: Reference = JSON.parse(readFileSync(`${qwen35Dir}/reference.json`, "utf8"));
        texts.push(...ref35.prompts.map((p) => ({ ids: p.greedy_new_ids, text: p.greedy_new_text })));
        expect(texts.some((t) => t.text.includes("\uFFFD"))).toBe(true);
      }
      for (const { ids, text } of texts) expect(streamText(tokenizer, ids).text).toBe(text);
    });

    test("stream cost per token does not grow with the text", async () => {
      if (!available()) return;
      const tokenizer = await load();
      const ids = reference!.tokenizer_cases.flatMap((c) => c.ids);
      const long = Array.from({ length: 100 }, () => ids).flat(); // ~50k tokens
      const stream = new TokenTextStream(tokenizer);
      const t0 = performance.now();
      let chars = 0;
      for (const id of long) chars += stream.push(id).length;
      const perToken = ((performance.now() - t0) * 1000) / long.length;
      expect(chars + stream.flush().length).toBe(tokenizer.decode(long).length);
      console.log(`  ${label}: stream ${long.length} tokens, ${perToken.toFixed(2)} µs/token`);
      expect(perToken).toBeLessThan(50); // re-decoding the text so far would be milliseconds per token here
    });
  });
}

describe("GGUF vocabulary rebuilt as tokenizer.json", () => {
  test("same vocabulary, merges, normalizer, pre-tokenizer, decoder and added tokens as the HF tokenizer.json", async () => {
    if (!dir || !ggufPaths.Q8_0) return;
    const hf = tokenizerSpecFromHfDirectory(dir);
    const fromGguf = tokenizerSpecFromGguf(await metadataOf.Q8_0());
    expect({ ...fromGguf.json.model.vocab }).toEqual(hf.json.model.vocab);
    const joined = (merges: unknown[]) => merges.map((m) => (Array.isArray(m) ? m.join(" ") : m));
    expect(joined(fromGguf.json.model.merges!)).toEqual(joined(hf.json.model.merges!));
    for (const key of ["normalizer", "pre_tokenizer", "post_processor", "decoder"] as const) expect(fromGguf.json[key]).toEqual(hf.json[key] as never);
    const { vocab: _v1, merges: _m1, ...ggufModel } = fromGguf.json.model;
    const { vocab: _v2, merges: _m2, ...hfModel } = hf.json.model;
    expect(ggufModel).toEqual(hfModel);
    expect(fromGguf.json.added_tokens.map((t) => [t.id, t.content])).toEqual(hf.json.added_tokens.map((t) => [t.id, t.content]));
    // The converter types FIM and repo tokens as control, which HF lists as not special; nothing else differs.
    const specialDiffers = fromGguf.json.added_tokens.filter((t, i) => t.special !== hf.json.added_tokens[i]!.special).map((t) => t.content);
    expect(specialDiffers).toEqual(["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]);
  });

  test("ids: vocabSize, EOS (HF generation_config vs llama.cpp's EOG rule), BOS", async () => {
    if (!dir || !ggufPaths.Q8_0) return;
    const hf = await hfTokenizer();
    const gg = await ggufTokenizer.Q8_0();
    expect(hf.vocabSize).toBe(151669);
    expect(gg.vocabSize).toBe(151936); // the GGUF keeps the [PAD…] rows up to the embedding size
    expect(hf.eosIds).toEqual([151645]); // generation_config.json names <|im_end|> only
    expect(gg.eosIds).toEqual([151645, 151643]); // eos, then <|endoftext|> by name
    expect(gg.isEndOfGeneration(151643)).toBe(true);
    expect(hf.isEndOfGeneration(785)).toBe(false);
    expect(hf.bosId).toBeUndefined(); // tokenizer_config bos_token is null
    expect(gg.bosId).toBe(151643);
    expect(hf.addBos).toBe(false);
    expect(gg.addBos).toBe(false);
    expect(gg.encode("hello", { addBos: true })).toEqual([151643, 14990]);
    expect(hf.encode("hello", { addBos: true })).toEqual([14990]);
  });

  test("load times: directory and GGUF metadata, 151k vocabulary", async () => {
    if (!dir || !ggufPaths.Q8_0) return;
    const metadata = await metadataOf.Q8_0();
    let t0 = performance.now();
    TextTokenizer.fromHfDirectory(dir);
    const hfMs = performance.now() - t0;
    t0 = performance.now();
    TextTokenizer.fromGgufMetadata(metadata);
    const ggufMs = performance.now() - t0;
    console.log(`  load: HF directory ${hfMs.toFixed(0)} ms (read + parse 11 MB tokenizer.json + build), GGUF metadata ${ggufMs.toFixed(0)} ms (build only)`);
    expect(ggufMs).toBeLessThan(2000);
  });

  test("negative controls: the checks fail when the pre-tokenizer regex or the NFC normalizer is wrong", async () => {
    if (!dir || !ggufPaths.Q8_0) return;
    const metadata = await metadataOf.Q8_0();
    // GPT-2's regex: digits grouped (\p{N}+), no (?i:) contractions, no newline rules.
    const gpt2Regex = tokenizerSpecFromGguf(metadata);
    const split = (gpt2Regex.json.pre_tokenizer as { pretokenizers: { pattern?: { Regex: string } }[] }).pretokenizers[0]!;
    split.pattern = { Regex: String.raw`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` };
    // (Qwen's vocabulary has no multi-digit tokens, so the digit cases survive; newlines and punctuation runs do not.)
    const broken = mismatches(new TextTokenizer(gpt2Regex), reference!.tokenizer_cases);
    expect(broken).toEqual([JSON.stringify("def f(x):\n    return x ** 2\n"), JSON.stringify("a\r\nb\rc"), JSON.stringify("http://example.com/a?b=c&d=e")]);
    // Without NFC the reference cases (all NFC already) still pass; the NFC test above is what catches it.
    const noNfc = tokenizerSpecFromGguf(metadata);
    noNfc.json.normalizer = null;
    const tokenizer = new TextTokenizer(noNfc);
    expect(mismatches(tokenizer, reference!.tokenizer_cases)).toEqual([]);
    expect(tokenizer.encode("café".normalize("NFD"))).not.toEqual(tokenizer.encode("café"));
  });
});

describe("chat template", () => {
  const templates = [
    ["tokenizer_config.json", async () => ChatTemplate.fromHfDirectory(dir!), () => dir],
    ["Q8_0 GGUF tokenizer.chat_template", async () => ChatTemplate.fromGgufMetadata(await metadataOf.Q8_0()), () => dir && ggufPaths.Q8_0],
    ["Q4_0 GGUF tokenizer.chat_template", async () => ChatTemplate.fromGgufMetadata(await metadataOf.Q4_0()), () => dir && ggufPaths.Q4_0],
  ] as const;

  for (const [label, load, available] of templates) {
    test(`${label}: renders the reference chat prompt exactly, which tokenizes to its input_ids`, async () => {
      if (!available()) return;
      const template = await load();
      const chat = chatPrompt();
      expect(chat.source.enable_thinking).toBe(false);
      const rendered = template.render(chat.source.messages, { addGenerationPrompt: true, enableThinking: false });
      expect(rendered).toBe(chat.source.rendered);
      expect((await hfTokenizer()).encode(rendered)).toEqual(chat.input_ids);
      expect((await ggufTokenizer.Q8_0()).encode(rendered)).toEqual(chat.input_ids);
    });

    test(`${label}: enable_thinking false, true and unset render as Qwen3's template does`, async () => {
      if (!available()) return;
      const template = await load();
      const messages = chatPrompt().source.messages;
      const off = template.render(messages, { enableThinking: false });
      const on = template.render(messages, { enableThinking: true });
      const unset = template.render(messages);
      expect(off.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n")).toBe(true);
      expect(on.endsWith("<|im_start|>assistant\n")).toBe(true);
      expect(on).not.toBe(off);
      expect(unset).toBe(on); // thinking is the template's default
      const noPrompt = template.render(messages, { addGenerationPrompt: false });
      expect(noPrompt.endsWith("<|im_end|>\n")).toBe(true);
      expect(noPrompt).not.toContain("<|im_start|>assistant");
    });
  }

  test("tools are rendered into the system prompt; an assistant turn's think block is split off", async () => {
    if (!dir) return;
    const template = ChatTemplate.fromHfDirectory(dir);
    const tool = { type: "function", function: { name: "get_time", description: "now", parameters: { type: "object", properties: {} } } };
    const withTools = template.render([{ role: "user", content: "time?" }], { tools: [tool] });
    // tojson writes Python's json.dumps spacing, as transformers' does.
    expect(withTools).toContain('<tools>\n{"type": "function", "function": {"name": "get_time", "description": "now", "parameters": {"type": "object", "properties": {}}}}\n</tools>');
    const history = template.render(
      [
        { role: "user", content: "hi" },
        { role: "assistant", content: "<think>\nhmm\n</think>\n\nhello" },
        { role: "user", content: "again" },
      ],
      { enableThinking: false },
    );
    expect(history).toContain("<|im_start|>assistant\nhello<|im_end|>"); // earlier reasoning dropped, as Qwen3 does
  });

  test("template errors are typed: parse, render (raise_exception), missing", async () => {
    expect(() => new ChatTemplate("{% if %}")).toThrow(ChatTemplateError);
    try {
      new ChatTemplate("{% for m in messages %}");
    } catch (e) {
      expect((e as ChatTemplateError).phase).toBe("parse");
      expect((e as ChatTemplateError).code).toBe("CHAT_TEMPLATE");
    }
    const strict = new ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok");
    expect(strict.render([{ role: "user", content: "x" }])).toBe("ok");
    let error: unknown;
    try {
      strict.render([{ role: "system", content: "x" }]);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ChatTemplateError);
    expect((error as ChatTemplateError).phase).toBe("render");
    expect((error as Error).message).toContain("first message must be from the user");
    expect(() => ChatTemplate.fromGgufMetadata({})).toThrow(ChatTemplateError);
    expect(() => ChatTemplate.fromTokenizerConfig({ chat_template: [{ name: "tool_use", template: "x" }] })).toThrow(ChatTemplateError);
    expect(ChatTemplate.fromTokenizerConfig({ chat_template: [{ name: "default", template: "{{ bos_token }}hi" }], bos_token: { content: "<s>" } }).render([])).toBe("<s>hi");
    expect(() => new ChatTemplate("x").render("nope" as never)).toThrow(InvalidArgumentError);
  });
});

describe("GGUF metadata errors and a synthetic vocabulary (no fixtures needed)", () => {
  // ByteLevel spellings: "Ġ" is the space byte.
  const tiny = (overrides: Record<string, unknown> = {}) => ({
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "qwen2",
    "tokenizer.ggml.tokens": ["a", "b", "Ġ", "ab", "Ġab", "<|end|>", "<tool>", "[PAD7]"],
    "tokenizer.ggml.token_type": [1, 1, 1, 1, 1, 3, 4, 5],
    "tokenizer.ggml.merges": ["a b", "Ġ ab"],
    "tokenizer.ggml.eos_token_id": 5,
    ...overrides,
  });

  test("a tiny vocabulary encodes, decodes and streams", () => {
    const tokenizer = TextTokenizer.fromGgufMetadata(tiny());
    expect(tokenizer.encode("ab ab<|end|><tool>")).toEqual([3, 4, 5, 6]);
    expect(tokenizer.encode("ab<|end|>", { special: false })).not.toContain(5);
    expect(tokenizer.decode([3, 4, 5, 6, 7])).toBe("ab ab<|end|><tool>");
    expect(tokenizer.decode([3, 5, 6], { skipSpecial: true })).toBe("ab<tool>");
    expect(tokenizer.eosIds).toEqual([5]); // "<|end|>" is both eos and an EOG name
    expect(tokenizer.vocabSize).toBe(8);
    expect(tokenizer.tokenText(7)).toBeUndefined(); // unused
    expect(streamText(tokenizer, [3, 4, 5, 6]).text).toBe("ab ab<|end|><tool>");
  });

  test("the stream refuses a tokenizer whose tokens do not spell bytes (no ByteLevel decoder)", () => {
    const spec = tokenizerSpecFromGguf(tiny());
    spec.json.decoder = { type: "Fuse" };
    expect(() => new TokenTextStream(new TextTokenizer(spec))).toThrow(UnsupportedTokenizerError);
  });

  test("unsupported tokenizer.ggml.model / pre: typed error naming found and supported", () => {
    let error: unknown;
    try {
      TextTokenizer.fromGgufMetadata(tiny({ "tokenizer.ggml.model": "llama" }));
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(UnsupportedTokenizerError);
    expect(error).toBeInstanceOf(VkmoeError);
    expect((error as UnsupportedTokenizerError).code).toBe("UNSUPPORTED_TOKENIZER");
    expect((error as UnsupportedTokenizerError).setting).toBe("tokenizer.ggml.model");
    expect((error as UnsupportedTokenizerError).found).toBe("llama");
    expect((error as Error).message).toBe('unsupported tokenizer.ggml.model "llama"; supported: "gpt2"');
    expect(() => TextTokenizer.fromGgufMetadata(tiny({ "tokenizer.ggml.pre": "llama-bpe" }))).toThrow('unsupported tokenizer.ggml.pre "llama-bpe"; supported: "qwen2"');
    expect(() => TextTokenizer.fromGgufMetadata(tiny({ "tokenizer.ggml.pre": undefined }))).toThrow(UnsupportedTokenizerError);
  });

  test("malformed metadata and missing files are TokenizerLoadError", () => {
    expect(() => TextTokenizer.fromGgufMetadata({})).toThrow(TokenizerLoadError);
    expect(() => TextTokenizer.fromGgufMetadata(tiny({ "tokenizer.ggml.merges": ["ab"] }))).toThrow(TokenizerLoadError);
    expect(() => TextTokenizer.fromGgufMetadata(tiny({ "tokenizer.ggml.token_type": [1, 1] }))).toThrow(TokenizerLoadError);
    expect(() => TextTokenizer.fromGgufMetadata(tiny({ "tokenizer.ggml.eos_token_id": 99 }))).toThrow(TokenizerLoadError);
    expect(() => TextTokenizer.fromHfDirectory("/nonexistent/model")).toThrow(TokenizerLoadError);
  });
});
