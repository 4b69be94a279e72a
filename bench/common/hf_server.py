"""The serving baseline: HF transformers behind an OpenAI-like streaming endpoint, one request at a time (FIFO).

Run as `python -m bench.common.hf_server --model PATH --port N`; stdlib HTTP only, so it needs no web framework.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

logger = logging.getLogger("bench.common.hf_server")


class FifoLock:
    """A lock granted in arrival order, so queued requests are served first come, first served."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> FifoLock:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._cond.wait_for(lambda: self._serving == ticket)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


class SSEStreamer(BaseStreamer):
    """Receives tokens from `generate` and writes each new piece of text as an OpenAI chat chunk."""

    def __init__(self, tokenizer: Any, send: Any) -> None:
        self.tokenizer = tokenizer
        self.send = send  # callable(text_delta)
        self.token_ids: list[int] = []
        self.text = ""
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate first passes the prompt
            self._prompt_seen = True
            return
        self.token_ids.extend(int(t) for t in value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the next token
            return
        if len(text) > len(self.text) and text.startswith(self.text):
            self.send(text[len(self.text) :])
            self.text = text

    def end(self) -> None:
        pass


class BaselineService:
    """The model, its tokenizer and EOS ids, and the FIFO lock that serialises generation."""

    def __init__(self, model_path: str, dtype: str, model_name: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from engine.loading.loader import (
            eos_token_ids,
            load_generation_config,
            load_hf_config,
            resolve_model_path,
        )

        path = resolve_model_path(model_path)
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else _auto_dtype()
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.eos_ids = sorted(
            eos_token_ids(load_hf_config(path), load_generation_config(path), self.tokenizer)
        )
        self.model_name = model_name
        self.lock = FifoLock()

    @torch.inference_mode()
    def generate(self, body: dict[str, Any], send: Any) -> tuple[str, int, int]:
        """Generate a reply for an OpenAI chat body, streaming deltas to `send`; (finish_reason, prompt, output)."""
        ids = self.tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
        temperature = float(body.get("temperature", 1.0))
        sampling = {"do_sample": False, "top_p": None, "top_k": None}
        if temperature > 0:
            sampling = {
                "do_sample": True,
                "temperature": temperature,
                "top_p": float(body.get("top_p", 1.0)),
                "top_k": None,
            }
        if body.get("ignore_eos"):  # generate has no ignore_eos: forbid EOS until max_tokens instead
            sampling["min_new_tokens"] = max_tokens
        x = torch.tensor([list(ids)])
        streamer = SSEStreamer(self.tokenizer, send)
        with self.lock:
            self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_tokens,
                streamer=streamer,
                eos_token_id=self.eos_ids,
                pad_token_id=self.eos_ids[0],
                **sampling,
            )
        out = streamer.token_ids
        finish = "stop" if out and out[-1] in self.eos_ids and not body.get("ignore_eos") else "length"
        return finish, len(ids), len(out)


def _auto_dtype() -> torch.dtype:
    from engine.worker.device import resolve_dtype

    return resolve_dtype("auto", torch.device("cpu"))


def make_handler(service: BaselineService) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to one service."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            logger.debug(fmt, *args)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": service.model_name, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            rid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
            base = {"id": rid, "created": created, "model": service.model_name}
            if not body.get("stream"):
                pieces: list[str] = []
                finish, num_prompt, num_out = service.generate(body, pieces.append)
                message = {"role": "assistant", "content": "".join(pieces)}
                self._json(
                    200,
                    {
                        **base,
                        "object": "chat.completion",
                        "usage": _usage(num_prompt, num_out),
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    },
                )
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()

            def chunk(delta: dict[str, Any], finish: str | None, usage: dict | None = None) -> None:
                data = {
                    **base,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                if usage is not None:
                    data["usage"] = usage
                self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            chunk({"role": "assistant", "content": ""}, None)
            finish, num_prompt, num_out = service.generate(body, lambda text: chunk({"content": text}, None))
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunk({}, finish, _usage(num_prompt, num_out) if include_usage else None)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _json(self, status: int, data: dict[str, Any]) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    return Handler


def _usage(num_prompt: int, num_out: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_out, "total_tokens": num_prompt + num_out}


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="a local HF folder or smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    service = BaselineService(args.model, args.dtype, model_name=args.model)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(service))
    server.daemon_threads = True
    logger.info(
        "HF baseline serving %s on http://%s:%d (one request at a time)", args.model, args.host, args.port
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
