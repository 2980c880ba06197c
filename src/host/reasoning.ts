/**
 * Splits a Qwen3-style reply into its reasoning (inside <think>…</think>) and its answer, as the
 * deltas stream in, for OpenAI-style `reasoning_content` beside `content`. A tag split across
 * deltas is held back until it is whole. The reply may open with "<think>" itself, or the prompt
 * may have opened it already (`startInside`: templates that end the generation prompt in
 * "<think>\n"); with enable_thinking false Qwen3's template closes an empty block in the prompt and
 * the whole reply is content.
 */
const OPEN = "<think>";
const CLOSE = "</think>";

export interface SplitText {
  reasoning: string;
  content: string;
}

type State = "start" | "reasoning" | "after-close" | "content";

export class ReasoningSplitter {
  private state: State;
  private held = "";

  constructor(startInside = false) {
    this.state = startInside ? "reasoning" : "start";
  }

  push(delta: string): SplitText {
    const out: SplitText = { reasoning: "", content: "" };
    let text = this.held + delta;
    this.held = "";
    while (text) {
      if (this.state === "start") {
        const lead = text.trimStart();
        if (lead.startsWith(OPEN)) {
          this.state = "reasoning";
          text = lead.slice(OPEN.length);
        } else if (OPEN.startsWith(lead)) {
          this.held = text; // whitespace, or a prefix of "<think>": wait for more
          return out;
        } else this.state = "content";
      } else if (this.state === "reasoning") {
        const at = text.indexOf(CLOSE);
        if (at >= 0) {
          out.reasoning += text.slice(0, at);
          text = text.slice(at + CLOSE.length);
          this.state = "after-close";
          continue;
        }
        const hold = partialSuffix(text, CLOSE);
        out.reasoning += text.slice(0, text.length - hold);
        this.held = text.slice(text.length - hold);
        return out;
      } else if (this.state === "after-close") {
        // the newlines between "</think>" and the answer belong to neither
        const rest = text.replace(/^\s+/, "");
        if (!rest) return out;
        this.state = "content";
        text = rest;
      } else {
        out.content += text;
        return out;
      }
    }
    return out;
  }

  /** End of the reply: what is still held goes where it stands. */
  flush(): SplitText {
    const text = this.held;
    this.held = "";
    if (this.state === "reasoning") return { reasoning: text, content: "" };
    return { reasoning: "", content: this.state === "after-close" ? "" : text };
  }
}

/** Length of the longest suffix of `text` that is a proper prefix of `tag`. */
function partialSuffix(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) if (tag.startsWith(text.slice(text.length - n))) return n;
  return 0;
}
