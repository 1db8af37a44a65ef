"""Benchmark: the tokens of a session's first request (the fixed prefix every session shares, plus the first
message and its note), counted with a real BPE vocabulary that is available offline, now and at an earlier
revision, side by side in one run.

The request is the one Cachet really sends: a session is started through the real store and its first message
sent through the real reply loop to the project's scripted server, which keeps the body byte for byte. The
session is in the ``edit`` mode (Cachet's default: nine tools) and in ``full`` (``run`` as well). The prompts of
the earlier revision (``--before``, default the commit before the prefix was cut) are taken from git into a
temporary folder and used through ``CACHET_PROMPTS``, with today's code, so only the texts differ.

The count is Mistral's Tekken tokenizer (tiktoken BPE, 131,072 tokens; the ``mistral-common`` package carries
it, no download) rendering the request with its own chat template, tools included, through
``encode_chat_completion``; the parts are counted alone (system prompt, tool schemas, the first message with
its note). Characters are given too. A peer's figure is compared in its own vocabulary: the smallest real peer's
first request is 1,370 o200k_base tokens (issue 36's count), so the request is counted in o200k_base too
(``bench/o200k.py``, offline): its system prompt, tool schemas as sent and first message, each alone, summed.

    pip install -e '.[bench]'
    python bench/first_request.py [--before REV] [--target 1354]

The lines ``first request o200k tokens = N`` and ``first request tokens = N`` (Tekken; the edit mode, now; the full
mode follows in brackets) are an interface.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402
from testing.safe_git import git_argv, git_env  # noqa: E402

BEFORE = "899c26a"
TARGET = 1354  # Tekken tokens this revision's first request stays within (its own earlier figure, no peer's)
MODES = ("edit", "full")
WORDS = "Where are the request handlers defined, and what do they answer?"


PEER_O200K = 1370  # the smallest real peer's first request, in o200k_base, as issue 36 counted it


@dataclass(frozen=True)
class Count:
    total: int
    system: int
    tools: int
    message: int
    characters: int
    o200k: int = 0


def record(mode: str) -> dict[str, Any]:
    """The first request of a session in ``mode``, as the scripted server received it (run in a child)."""
    from bench.cache import Action, _setup_django, make_workspace
    from testing.scripted_server import Step

    work = Path(tempfile.mkdtemp(prefix="cachet-first-request-"))
    _setup_django(work / "data")
    from django.contrib.auth import get_user_model

    from chat.agent.loop import ReplyLoop
    from chat.tools import tool_list
    from sessions_app.models import ModelEndpoint, Workspace
    from sessions_app.services.sessions import session_start
    from testing.drive import run_to_end
    from testing.scripted_server import ScriptedServer

    make_workspace(work / "app")
    user = get_user_model().objects.create(username="bench")
    action = Action("send", WORDS, [Step(text="In app/big.py; each answers respond(request, code=N).")])
    with ScriptedServer(model="bench") as server:
        workspace = Workspace.objects.create(
            name="app",
            folder=str(work / "app"),
            allow_commands=mode == "full",
            open_to_everyone=True,
            from_shell=True,
        )
        endpoint = ModelEndpoint.objects.create(name="scripted", base_url=server.base_url, model="bench")
        session = session_start(
            owner=user,
            workspace=workspace,
            endpoint=endpoint,
            model_name="bench",
            tools=tool_list(allow_commands=mode == "full"),
            mode=mode,
        )
        server.push(*action.steps)
        run_to_end(ReplyLoop(session, date="2026-12-05", titles=False).send(action.words))  # the first request only
        body: dict[str, Any] = json.loads(server.requests[0])
    return body


def _tokenizer() -> Any:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.v3(is_tekken=True)


def count(body: dict[str, Any]) -> Count:
    """The request's tokens as Tekken's chat template renders it, and its parts' tokens alone."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    tokenizer = _tokenizer()
    text_tokens = tokenizer.instruct_tokenizer.tokenizer

    def tokens(text: str) -> int:
        return len(text_tokens.encode(text, bos=False, eos=False))

    messages = body["messages"]
    request: Any = ChatCompletionRequest.model_validate({"messages": messages, "tools": body.get("tools") or None})
    total = len(tokenizer.encode_chat_completion(request).tokens)
    tools_json = json.dumps(body.get("tools") or [], ensure_ascii=False)
    return Count(
        total=total,
        system=tokens(messages[0]["content"]),
        tools=tokens(tools_json),
        message=tokens(messages[1]["content"]),
        characters=len(messages[0]["content"]) + len(tools_json) + len(messages[1]["content"]),
        o200k=o200k_count(body),
    )


def o200k_count(body: dict[str, Any]) -> int:
    """The request in o200k_base: its system prompt, its tool schemas as the JSON it sends, and its first message,
    each counted alone, summed (no chat template's framing: the same count for every harness)."""
    from bench.o200k import count as o200k

    messages = body["messages"]
    tools_json = json.dumps(body.get("tools") or [], ensure_ascii=False)
    return o200k(messages[0]["content"]) + o200k(tools_json) + o200k(messages[1]["content"])


def _prompts_at(revision: str, folder: Path) -> Path:
    archive = subprocess.run(
        git_argv("-C", str(ROOT), "archive", "--format=tar", revision, "prompts"),
        check=True,
        capture_output=True,
        env=git_env(),
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    # The loop's numbers that today's code needs and the revision's loop.json lacks (documents' limits, …) come
    # from today's: they are no text of the request, which is what is compared.
    loop_json = folder / "prompts" / "loop.json"
    before = json.loads(loop_json.read_text(encoding="utf-8"))
    today = json.loads((ROOT / "prompts" / "loop.json").read_text(encoding="utf-8"))
    before["loop"] = {**today["loop"], **before["loop"]}
    loop_json.write_text(json.dumps(before, ensure_ascii=False, indent=2), encoding="utf-8")
    return folder / "prompts"


def _child(mode: str, prompts: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if prompts is not None:
        env["CACHET_PROMPTS"] = str(prompts)
    done = subprocess.run(
        [sys.executable, __file__, "--record", mode], env=env, check=True, capture_output=True, text=True
    )
    body: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return body


def main() -> None:
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=BEFORE, help=f"the revision to compare with (default {BEFORE})")
    parser.add_argument(
        "--target", type=int, default=TARGET, help=f"Tekken tokens to stay within (default {TARGET}, with run)"
    )
    parser.add_argument("--record", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.record:
        print(json.dumps(record(args.record)))
        return
    with tempfile.TemporaryDirectory() as folder:
        before_prompts = _prompts_at(args.before, Path(folder))
        rows: list[tuple[str, Count, Count]] = []
        for mode in MODES:
            rows.append((mode, count(_child(mode, before_prompts)), count(_child(mode, None))))
    print("first request, Tekken tokens (Mistral's chat template, tools included); parts counted alone")
    print(f"{'mode':<6} {'part':<10} {args.before:>10} {'now':>8} {'now/before':>11}")
    for mode, before, now in rows:
        for part in ("total", "system", "tools", "message", "characters", "o200k"):
            old, new = getattr(before, part), getattr(now, part)
            print(f"{mode:<6} {part:<10} {old:>10,} {new:>8,} {new / old:>11.2f}")
    edit_now, full_now = rows[0][2].total, rows[1][2].total
    verdict = "within" if max(edit_now, full_now) <= args.target else "over"  # a regression check, no peer's figure
    edit_o200k, full_o200k = rows[0][2].o200k, rows[1][2].o200k
    against_peer = "within" if edit_o200k <= PEER_O200K else "over"
    print()
    print(
        f"first request o200k tokens = {edit_o200k} (with run {full_o200k}; {against_peer} the smallest real peer's "
        f"{PEER_O200K:,}, counted in o200k too)"
    )
    print(f"first request tokens = {edit_now} (with run {full_now}; Tekken; {verdict} {args.target:,})")


if __name__ == "__main__":
    main()
