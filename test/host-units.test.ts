/**
 * The host's parts on their own: the reasoning splitter (whatever the deltas' split), the bind and
 * key rules, VKMOE_API_KEY as a setting, the Bearer check, request schemas' error naming, the
 * Prometheus text, and a Sequence stepped by hand giving the engine's generate() ids and text
 * (sampled, penalized, with logprobs).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { ConfigError, readConfig } from "../src/config.ts";
import type { Model } from "../src/engine/index.ts";
import { promptIds } from "../src/engine/index.ts";
import { bearerCheck } from "../src/host/auth.ts";
import { ApiError, HostConfigError, isLoopback, ReasoningSplitter, resolveHostConfig, Sequence } from "../src/host/index.ts";
import { Metrics } from "../src/host/metrics.ts";
import { chatCompletionSchema, parseRequest } from "../src/host/schemas.ts";
import { samplingFromModel } from "../src/sampling/defaults.ts";
import { engineReply, loadHostModel, modelPath } from "./support/host.ts";

function splitAll(text: string, cuts: number[], startInside = false): { reasoning: string; content: string } {
  const s = new ReasoningSplitter(startInside);
  const out = { reasoning: "", content: "" };
  let last = 0;
  for (const cut of [...cuts, text.length]) {
    const r = s.push(text.slice(last, cut));
    out.reasoning += r.reasoning;
    out.content += r.content;
    last = cut;
  }
  const r = s.flush();
  return { reasoning: out.reasoning + r.reasoning, content: out.content + r.content };
}

test("reasoning splitter: <think>…</think> apart from the answer, however the text is cut into deltas", () => {
  const cases: [string, boolean, { reasoning: string; content: string }][] = [
    ["<think>\nweigh it</think>\n\nThe answer.", false, { reasoning: "\nweigh it", content: "The answer." }],
    ["\n<think>a<b</think>c", false, { reasoning: "a<b", content: "c" }],
    ["plain answer <think> not a block", false, { reasoning: "", content: "plain answer <think> not a block" }],
    ["<thin", false, { reasoning: "", content: "<thin" }],
    ["still thinking </thi", false, { reasoning: "", content: "still thinking </thi" }],
    ["<think>unfinished </thi", false, { reasoning: "unfinished </thi", content: "" }],
    ["opened by the prompt</think>\n\nok", true, { reasoning: "opened by the prompt", content: "ok" }],
    ["", false, { reasoning: "", content: "" }],
  ];
  for (const [text, inside, want] of cases) {
    expect(splitAll(text, [], inside)).toEqual(want);
    for (let i = 0; i <= text.length; i++) expect(splitAll(text, [i], inside)).toEqual(want);
    expect(splitAll(text, [...text].map((_, i) => i + 1).slice(0, -1), inside)).toEqual(want);
  }
});

test("bind rules: loopback addresses need no key; anything else refuses to start without one", () => {
  for (const h of ["127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"]) expect(isLoopback(h)).toBe(true);
  for (const h of ["0.0.0.0", "::", "192.168.1.2", "10.0.0.1", "example.com", "128.0.0.1"]) expect(isLoopback(h)).toBe(false);
  const base = { modelName: "m", ctx: 64 };
  expect(resolveHostConfig(base)).toMatchObject({ host: "127.0.0.1", port: 8080, parallel: 4, maxTokensCap: 64, cors: [] });
  expect(() => resolveHostConfig({ ...base, host: "0.0.0.0" })).toThrow(HostConfigError);
  expect(resolveHostConfig({ ...base, host: "0.0.0.0", apiKey: "long-enough-key" }).host).toBe("0.0.0.0");
  expect(() => resolveHostConfig({ ...base, apiKey: "short" })).toThrow(/apiKey must be at least 8 characters/);
  expect(() => resolveHostConfig({ ...base, parallel: 0 })).toThrow(HostConfigError);
});

test("VKMOE_API_KEY is one of the VKMOE_* settings: the strict reader takes it (the engine ignores it); an unknown name still fails", () => {
  expect(readConfig({ VKMOE_API_KEY: "env-key-12345" }).VKMOE_API_KEY).toBe("env-key-12345");
  expect(readConfig({ VKMOE_API_KEY: "" }).VKMOE_API_KEY).toBeUndefined(); // an empty variable is an unset one
  expect(() => readConfig({ VKMOE_API_KEYS: "x" })).toThrow(ConfigError);
});

test("Bearer check: the right key passes; missing, wrong, longer, shorter or a non-Bearer scheme is a 401", () => {
  const check = bearerCheck("sk-right-key-1");
  check("Bearer sk-right-key-1");
  check("bearer   sk-right-key-1 ");
  for (const h of [undefined, "", "Bearer", "Bearer sk-right-key-2", "Bearer sk-right-key-11", "Bearer sk-right", "Basic sk-right-key-1", "sk-right-key-1"]) {
    let error: unknown;
    try {
      check(h);
    } catch (e) {
      error = e;
    }
    expect(error instanceof ApiError && error.status === 401).toBe(true);
  }
});

test("schemas: errors name the field (nested too), unknown fields are named, documented ones are known", () => {
  const bad = (body: unknown) => {
    try {
      parseRequest(chatCompletionSchema, body);
    } catch (e) {
      return (e as ApiError).body.error;
    }
    throw new Error("accepted");
  };
  expect(bad({ messages: [{ role: "user", content: "x" }], top_p: 3 })).toMatchObject({ param: "top_p", code: "invalid_value" });
  expect(bad({ messages: [{ role: "wizard", content: "x" }] })).toMatchObject({ param: "messages[0].role" });
  expect(bad({ messages: [{ role: "user", content: "x" }], stream_options: { include_usage: true, extra: 1 } })).toMatchObject({ param: "stream_options.extra", code: "unknown_parameter" });
  expect(bad({ messages: [{ role: "user", content: "x" }], stop: [""] })).toMatchObject({ param: "stop[0]" });
  expect(bad({ messages: [{ role: "user", content: "x" }], seed: 1.5 })).toMatchObject({ param: "seed" });
  const ok = parseRequest(chatCompletionSchema, { messages: [{ role: "user", content: [{ type: "text", text: "x" }] }], user: "u", store: false, metadata: { a: "b" }, service_tier: "auto", max_completion_tokens: 3 });
  expect(ok.max_completion_tokens).toBe(3);
});

test("metrics: Prometheus text with HELP/TYPE lines and live gauges", () => {
  const m = new Metrics(() => ({ queued: 2, active: 3, slots: 4, queueLimit: 8 }));
  m.request("/v1/completions", 200);
  m.request("/v1/completions", 200);
  m.request("other", 404);
  m.prefilled(10);
  m.prefilled(3, 7); // a slot's session held 7 of the prompt's 10 ids
  m.generated(5);
  const text = m.render();
  expect(text).toContain('vkmoe_requests_total{route="/v1/completions",status="200"} 2\n');
  expect(text).toContain('vkmoe_requests_total{route="other",status="404"} 1\n');
  expect(text).toContain("vkmoe_prompt_tokens_total 20\n");
  expect(text).toContain("vkmoe_prompt_tokens_prefilled_total 13\n");
  expect(text).toContain("vkmoe_prompt_tokens_reused_total 7\n");
  expect(text).toContain("vkmoe_completion_tokens_total 5\n");
  expect(text).toContain("vkmoe_queue_depth 2\n");
  expect(text).toContain("vkmoe_active_sequences 3\n");
  expect(text).toContain("# TYPE vkmoe_decode_tokens_per_second gauge\n");
  for (const line of text.trimEnd().split("\n")) expect(line).toMatch(/^(# (HELP|TYPE) \w+ .+|\w+(\{[^}]*\})? -?[\d.]+)$/);
});

let model: Model | undefined;
beforeAll(async () => {
  if (modelPath) model = await loadHostModel();
});
afterAll(() => model?.[Symbol.dispose]());

(modelPath ? test : test.skip)("a Sequence stepped by hand gives generate()'s ids and text: sampled with penalties, greedy with logprobs, a stop string", () => {
  const m = model!;
  const cases: { sampling: Record<string, number>; stop: string[]; topLogprobs?: number }[] = [
    { sampling: { temperature: 0.8, topK: 40, repeatPenalty: 1.3, presencePenalty: 0.5, seed: 11 }, stop: [] },
    { sampling: { temperature: 0 }, stop: [], topLogprobs: 3 },
    { sampling: { temperature: 0.7, seed: 5 }, stop: ["e"] },
  ];
  for (const c of cases) {
    const want = engineReply(m, "Hello there", { maxTokens: 8, ctx: 64, stop: c.stop, sampling: c.sampling });
    using session = m.session({ ctx: 64 });
    const seq = new Sequence(m.tokenizer, session, promptIds(m, "Hello there"), { maxTokens: 8, sampling: samplingFromModel(m.generationDefaults, c.sampling), stop: c.stop, topLogprobs: c.topLogprobs });
    let text = seq.prefill().text;
    const tokens: number[] = [];
    while (!seq.done) {
      const d = seq.step();
      text += d.text;
      tokens.push(...d.tokens.map((t) => t.id));
      if (c.topLogprobs) for (const t of d.tokens) expect(t.topLogprobs!.length).toBe(3);
    }
    expect({ ids: seq.ids, text, finish: seq.finishReason }).toEqual({ ids: want.ids, text: want.text, finish: want.finishReason });
    expect(seq.text).toBe(want.text);
  }
});
