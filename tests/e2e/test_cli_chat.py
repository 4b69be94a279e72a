"""`pagedchat chat` in a pseudo-terminal, as a person uses it (pexpect, tiny random model): Ctrl-C stops a reply
and keeps the conversation, slash commands never reach the model, logs stay off stdout and below WARNING unless -v.

stdout (and stdin) is the terminal; stderr goes to a file, so what went where can be told apart.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
from pathlib import Path

import pexpect

from tests.app.factories import TINY_BLOCK_BYTES
from tests.e2e.conftest import REPO_ROOT, share_kernels

PROMPT = "you> "
STOPPED = "[stopped: the reply so far stays in the conversation]"
NUM_BLOCKS = 256
# a reply that runs for seconds (960 tokens, end-of-sequence ignored), so that Ctrl-C lands while it streams
CHAT_FLAGS = [
    *("--device", "cpu", "--dtype", "float32", "--num-threads", "1", "--seed", "0"),
    *("--max-model-len", "1024", "--max-tokens", "960", "--ignore-eos"),
    *(
        "--block-size",
        "16",
        "--kv-cache-bytes",
        str(NUM_BLOCKS * 16 * TINY_BLOCK_BYTES),
        "--kv-disk-bytes",
        "0",
    ),
]


def spawn_chat(tmp_path: Path, model: str, *flags: str) -> tuple[pexpect.spawn, Path]:
    """`pagedchat chat` on a pseudo-terminal (stdin, stdout) with stderr to a file; the transcript (all stdout) is
    kept in the child's logfile_read."""
    stderr_path = tmp_path / "stderr.txt"
    cache = tmp_path / "cache"  # its own history file; the compiled kernels shared with every test server
    share_kernels(cache)
    env = {**os.environ, "TERM": "dumb", "INPUTRC": "/dev/null", "PAGEDCHAT_CACHE_DIR": str(cache)}

    def stderr_to_file() -> None:  # runs in the child, after the terminal is set up and before the exec
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        # Ctrl-C as at a user's terminal: a test run started in the background by a non-interactive shell ignores
        # SIGINT, every process under it inherits that, and Python then leaves SIGINT ignored at the chat's prompt
        # (the chat's second Ctrl-C went unseen: `bash .ci/run &` failed here every time, the foreground never)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    child = pexpect.spawn(
        sys.executable,
        ["-m", "pagedchat", "chat", "--model", model, *CHAT_FLAGS, *flags],
        cwd=str(REPO_ROOT),
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 200),
        preexec_fn=stderr_to_file,
    )
    child.logfile_read = io.StringIO()
    return child, stderr_path


def transcript(child: pexpect.spawn) -> str:
    return child.logfile_read.getvalue().replace("\r\n", "\n")


def ask(child: pexpect.spawn, line: str) -> str:
    """Type a line; what the chat wrote on the terminal before the next prompt (the echoed line first)."""
    child.sendline(line)
    child.expect_exact(PROMPT)
    return child.before.replace("\r\n", "\n")


def stop_reply(child: pexpect.spawn, message: str) -> None:
    """Send a message, press Ctrl-C once its reply has started, and wait for the prompt."""
    child.sendline(message)
    child.expect_exact("assistant> ")
    child.expect(r"\S")  # its first word is on the screen
    child.sendintr()
    child.expect_exact(STOPPED)
    child.expect_exact(PROMPT)


def test_ctrl_c_stops_the_reply_and_the_conversation_goes_on(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    child, stderr_path = spawn_chat(tmp_path, tiny_model)
    child.expect_exact(PROMPT)
    shown = ask(child, "/help")
    assert "/save FILE" in shown and "/system TEXT" in shown and "assistant> " not in shown
    assert "assistant> " not in ask(child, "/bogus")
    assert "last reply: none yet" in ask(child, "/stats")  # neither line reached the model
    assert "system prompt set" in ask(child, "/system You are terse.")

    stop_reply(child, "hello")
    child.sendintr()  # a second Ctrl-C right after the one that stopped the reply: the chat stays
    child.expect_exact(PROMPT)
    stats = ask(child, "/stats")
    assert "stopped with Ctrl-C" in stats
    assert f"KV pool: 0 of {NUM_BLOCKS} blocks in use" in stats  # the aborted request's blocks are back

    stop_reply(child, "and then?")
    stats = ask(child, "/stats")
    assert f"KV pool: 0 of {NUM_BLOCKS} blocks in use" in stats
    num_prompt_tokens, num_cached = map(
        int, re.search(r"(\d+) prompt tokens, (\d+) from the prefix", stats).groups()
    )

    assert "saved 5 messages" in ask(child, f"/save {tmp_path / 'chat.json'}")
    messages = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))["messages"]
    assert [(m["role"], m.get("stopped", False)) for m in messages] == [
        ("system", False),
        ("user", False),
        ("assistant", True),
        ("user", False),
        ("assistant", True),
    ]
    assert messages[:2] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
    ]
    shown = transcript(child).replace("^C", "")  # the terminal echoes Ctrl-C where it was pressed
    assert messages[2]["content"].strip() and f"assistant> {messages[2]['content']}\n{STOPPED}" in shown
    # the second prompt was the first exchange, its cut reply included, then the new message; its first turn's
    # full blocks came from the prefix cache
    history = [{"role": m["role"], "content": m["content"]} for m in messages[:4]]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    expected = tokenizer.apply_chat_template(
        history, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert num_prompt_tokens == len(expected)
    assert num_cached >= 16

    assert "(Markdown)" in ask(child, f"/save {tmp_path / 'chat.md'}")
    markdown = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Chat with ") and markdown.count("## Assistant (stopped with Ctrl-C)") == 2
    ask(child, f"/save {tmp_path / 'no-such-folder' / 'chat.json'}")
    assert "conversation cleared (the system prompt stays)" in ask(child, "/reset")
    ask(child, f"/save {tmp_path / 'after-reset.json'}")
    after_reset = json.loads((tmp_path / "after-reset.json").read_text(encoding="utf-8"))["messages"]
    assert after_reset == [{"role": "system", "content": "You are terse."}]

    child.send("half a thought")
    child.expect_exact("half a thought")  # readline has it (a Ctrl-C flushes what it has not read yet)
    child.sendintr()  # drops the line being typed
    child.expect_exact(PROMPT)
    child.sendintr()  # at an empty prompt: quits
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    out, err = transcript(child), stderr_path.read_text(encoding="utf-8")
    assert "Traceback" not in out + err
    assert " INFO " not in out + err
    assert "unknown command /bogus, try /help" in err
    assert (
        f"error: cannot write {tmp_path / 'no-such-folder' / 'chat.json'}: No such file or directory" in err
    )
    assert "assistant> " not in out.split("half a thought")[-1]  # the dropped line was not sent


def test_logs_at_info_with_v_go_to_stderr_up_arrow_recalls_and_ctrl_d_quits(tmp_path, tiny_model):
    child, stderr_path = spawn_chat(tmp_path, tiny_model, "-v")
    child.expect_exact(PROMPT)
    assert "system prompt set" in ask(child, "/system Be brief.")
    assert "system prompt: Be brief." in ask(child, "/system")
    assert "system prompt set" in ask(child, "\x1b[A\x1b[A")  # up-arrow twice: the line before last, again
    child.sendeof()  # Ctrl-D
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    out, err = transcript(child), stderr_path.read_text(encoding="utf-8")
    assert " INFO engine.llm_engine: engine ready" in err
    assert " INFO " not in out  # the model load's lines stay off the conversation
    assert "Traceback" not in out + err
    history = (tmp_path / "cache" / "chat_history").read_text(encoding="utf-8").splitlines()
    assert history[-3:] == ["/system Be brief.", "/system", "/system Be brief."]
