/**
 * The host under Deno (Deno.serve): the server started in-process on 127.0.0.1, port 0, over the
 * tiny Q8_0 fixture; one chat completion with fetch, whole and streamed, greedy, equal to the
 * engine's generate() for the same prompt. The full suite is test/host-*.test.ts.
 */
import { startServer } from "../../src/host/index.ts";
import { engineReply, loadHostModel, modelPath } from "../support/host.ts";

declare const Deno: any;

function assertEqual(actual: unknown, expected: unknown, what: string): void {
  const [a, e] = [JSON.stringify(actual), JSON.stringify(expected)];
  if (a !== e) throw new Error(`${what}: got ${a.slice(0, 300)}, expected ${e.slice(0, 300)}`);
}

if (modelPath) {
  Deno.test("host under Deno: a chat completion over fetch, whole and streamed, equal to generate()", async () => {
    using model = await loadHostModel();
    await using server = startServer(model, { port: 0, ctx: 128, modelName: "tiny" });
    const want = engineReply(model, "Hello", { maxTokens: 5, ctx: 128 });
    const ask = (stream: boolean) => fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 5, temperature: 0, stream }),
    });
    const r = await ask(false);
    assertEqual(r.status, 200, "status");
    const body = await r.json() as any;
    assertEqual(body.choices[0].message.content, want.text, "content");
    assertEqual(body.usage, { prompt_tokens: want.promptIds.length, completion_tokens: 5, total_tokens: want.promptIds.length + 5 }, "usage");
    const events = (await (await ask(true)).text()).split("\n\n").filter(Boolean);
    assertEqual(events.at(-1), "data: [DONE]", "last event");
    const text = events.slice(0, -1).map((e) => JSON.parse(e.slice("data: ".length)).choices[0].delta.content ?? "").join("");
    assertEqual(text, want.text, "streamed content");
  });
}
