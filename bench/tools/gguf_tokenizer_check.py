"""Does a running llama.cpp server tokenize a GGUF file's text as transformers does? (bench make-gguf's tokenizers)

    llama-server -m FILE.gguf --port 8081 --no-repack &   # --no-repack: see below
    python -m bench.tools.gguf_tokenizer_check FILE.gguf --url http://127.0.0.1:8081

Tokenizes a few texts (English, code and unicode, special-token text) with transformers (the tokenizer the engine
builds from the file, engine/loading/gguf.py) and with the server's /tokenize, compares the chat prompt's token count
with one /v1/chat/completions, and prints each result; exit status 1 on a mismatch. On a CPU with AMX, llama.cpp
0.3.36's AMX matmul crashed here (SIGSEGV in ldtilecfg), so start the server with --no-repack there.
"""

from __future__ import annotations

import argparse
import json
import urllib.request

from engine.loading.gguf import load_gguf_tokenizer

TEXTS = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, 12345 times!",
    "Hello  world\n\n  def f(x):\treturn x**2  # ünïcödé ✓ 你好",
    "<|im_start|> and <|eot_id|> written inside a message",
)


def post(url: str, route: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + route, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", help="the file the server was started with")
    parser.add_argument("--url", default="http://127.0.0.1:8081")
    args = parser.parse_args()
    tokenizer = load_gguf_tokenizer(args.gguf)
    ok = True
    for text in TEXTS:
        ours = tokenizer.encode(text, add_special_tokens=False)
        theirs = post(args.url, "/tokenize", {"content": text, "add_special": False, "parse_special": True})[
            "tokens"
        ]
        ok &= ours == theirs
        print(
            f"{'same' if ours == theirs else 'DIFFERENT'}: {len(ours)} / {len(theirs)} tokens for {text[:40]!r}"
        )
    messages = [{"role": "user", "content": "Hello there"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    reply = post(args.url, "/v1/chat/completions", {"messages": messages, "max_tokens": 8})
    served = reply["usage"]["prompt_tokens"]
    ok &= served == len(prompt)
    print(
        f"chat prompt: {len(prompt)} tokens here, {served} served; reply {reply['choices'][0]['message']['content']!r}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
