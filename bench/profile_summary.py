"""Summarize py-spy's raw (collapsed) stacks, as ``bench/web.py --profile DIR`` writes them: the functions with the
most own samples (the deepest Python frame), the most cumulative samples (any frame of the stack, once per
stack), and the samples by area of the code (chat's rendering, the reply events and page messages, the model
client, the cache check, the tools, the ORM and the database driver, JSON and request building, the queue and
the channel layer).

    .venv/bin/python bench/profile_summary.py DIR/new-gap-worker-0.txt [more files] [--top 15] [--steps N]
        [--pieces N] [--drop-waits]

Each area is counted twice: inclusive (a sample where any frame is of the area) and by the innermost area of
the stack (each sample once: a page rendered from rows the ORM fetches counts as ORM there). ``--steps`` divides
the samples' time (at py-spy's rate, 200 a second in ``bench/web.py``) by the steps of the run, in ms per step;
``--pieces`` by the pieces streamed (``bench/web.py`` prints them), in ms per piece.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

# Checked in order: the first area whose pattern a frame's file (or function) matches is the frame's.
AREAS: list[tuple[str, re.Pattern[str]]] = [
    ("cache check", re.compile(r"chat/agent/(cache_check|server_api)\.py|chat/worker/checks\.py")),
    ("model client", re.compile(r"chat/agent/model/|(^|/)httpx/|(^|/)httpcore/|(^|/)h11/")),
    ("tools", re.compile(r"chat/tools/")),
    (
        "reply events and page messages",
        re.compile(r"chat/wire\.py|chat/worker/(jobs|publish)\.py|chat/web/(tabs|publish|consumers|sync|socket_store)"),
    ),
    (
        "rendering",
        re.compile(
            r"chat/web/(publisher|fragments|display|markdown|render|messages)|chat/web/.*render|(^|/)markdown_it/|"
            r"/nh3|(^|/)pygments/|(^|/)latex2mathml/|(^|/)django/template/|(^|/)django/utils/html"
        ),
    ),
    (
        "JSON/request building",
        re.compile(
            r"sessions_app/selectors/requests|sessions_app/hygiene/|(^|/)json/|chat/agent/budget|sessions_app/prompts"
        ),
    ),
    (
        "ORM/DB",
        re.compile(r"(^|/)django/db/|(^|/)psycopg/|(^|/)psycopg_pool/|sessions_app/(services|selectors|models)"),
    ),
    ("queue (procrastinate)", re.compile(r"(^|/)procrastinate/")),
    (
        "channel layer",
        re.compile(
            r"(^|/)channels/|(^|/)channels_redis/|(^|/)redis/|(^|/)msgpack/|cachet/(pg_layer|redis_layer|layers)|chat/web/(relay|layer)"
        ),
    ),
    ("asyncio/threads", re.compile(r"(^|/)asyncio/|(^|/)threading\.py|(^|/)concurrent/|(^|/)asgiref/")),
]


# Where a thread waits (py-spy's idle detection lets some through when every running thread is sampled): dropped
# with --drop-waits. The function and the start of its file.
WAITS = (
    "_worker (concurrent/futures/thread.py",  # an idle pool thread on its queue
    "Connection.wait (psycopg/",  # waiting for Postgres's answer
    "EpollSelector.select (selectors.py",  # an idle event loop
    "SyncStream.read (httpcore/",  # waiting for the model server
    "is_socket_readable (httpcore/",
)


def parse(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        stacks.append((stack.split(";"), int(count)))
    return stacks


def short(frame: str) -> str:
    match = FRAME.match(frame)
    if not match:
        return frame
    file = match["file"]
    for marker in ("site-packages/", "/new-tree/", "/old-tree/", "/work/main/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{match['function']} ({file})"


def area(frame: str) -> str | None:
    match = FRAME.match(frame)
    where = match["file"] if match else frame
    for name, pattern in AREAS:
        if pattern.search(where):
            return name
    return None


PROJECT = re.compile(r"\((chat|sessions_app|cachet)/")
PLUMBING = {"asyncio/threads", None}
# Frames on nearly every stack, left out of the cumulative list: threads, the event loop, the command.
ROOTS = re.compile(
    r"\((threading\.py|concurrent/|asyncio/|selectors\.py|contextlib\.py|manage\.py|django/core/management/|"
    r"chat/management/commands/worker\.py)"
)


def activity(frames: list[str]) -> str:
    """What the sampled thread was doing, by the frames near its root."""
    joined = ";".join(frames)
    for label, marker in (
        ("reply loop (ReplyLoop: its thread, or its coroutine and its store thread)", "ReplyLoop."),
        ("cache check (its thread pool, or its job)", "check_request ("),
        ("cache check (its thread pool, or its job)", "run_check ("),
        ("the job, outside the reply loop (publishing its events)", "Job."),
        ("web: reply events made page messages (chat/web/tabs.py)", "page_messages ("),
        ("web: the tabs' sockets (chat/web/consumers.py)", "SessionConsumer."),
        ("event loop: channel layer", "_layer.py"),
        ("event loop: queue (procrastinate)", "procrastinate/"),
        ("event loop", "run_forever ("),
    ):
        if marker in joined:
            return label
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--steps", type=int, help="steps of the run: print ms per step")
    parser.add_argument("--pieces", type=int, help="pieces streamed in the run: print ms per piece")
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--drop-waits", action="store_true", help="leave out the samples whose deepest frame waits")
    args = parser.parse_args()
    stacks = [item for path in args.files for item in parse(path)]
    if args.drop_waits:
        stacks = [(frames, count) for frames, count in stacks if not frames[-1].startswith(WAITS)]
    total = sum(count for _, count in stacks)
    own: collections.Counter[str] = collections.Counter()
    cumulative: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    innermost: collections.Counter[str] = collections.Counter()
    outermost: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    project: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        names = [short(frame) for frame in frames if not frame.startswith(("process ", "thread "))]
        if names:
            own[names[-1]] += count
        for name in set(names):
            cumulative[name] += count
        areas = [area(frame) for frame in frames]
        for name in {a for a in areas if a}:
            inclusive[name] += count
        inner = next((a for a in reversed(areas) if a), "other")
        innermost[inner] += count
        outer = next((a for a in areas if a and a not in PLUMBING), None) or inner
        outermost[outer] += count
        threads[activity(frames)] += count
        ours = [name for frame, name in zip(frames, [short(f) for f in frames], strict=True) if PROJECT.search(frame)]
        project[ours[-1] if ours else "(no project frame)"] += count

    def ms(count: int) -> str:
        if args.pieces:
            return f"  {count * 1000 / args.rate / args.pieces:7.4f} ms/piece"
        if not args.steps:
            return ""
        return f"  {count * 1000 / args.rate / args.steps:6.2f} ms/step"

    print(f"{total} samples ({total / args.rate:.1f} s at {args.rate} Hz)")
    print(f"\nown (deepest Python frame), top {args.top}:")
    for name, count in own.most_common(args.top):
        print(f"  {100 * count / total:5.1f}%{ms(count)}  {name}")
    print(f"\ncumulative, top {args.top} (the threads' and the event loop's own frames left out):")
    shown = [(name, count) for name, count in cumulative.most_common() if not ROOTS.search(name)]
    for name, count in shown[: args.top]:
        print(f"  {100 * count / total:5.1f}%{ms(count)}  {name}")
    print(f"\nby the deepest frame of the project's own code (the libraries it calls counted in), top {args.top}:")
    for name, count in project.most_common(args.top):
        print(f"  {100 * count / total:5.1f}%{ms(count)}  {name}")
    print("\nby thread and activity:")
    for name, count in threads.most_common():
        print(f"  {100 * count / total:5.1f}%{ms(count)}  {name}")
    print("\nby area, inclusive (a sample counts in every area on its stack):")
    for name, count in inclusive.most_common():
        if name not in PLUMBING:
            print(f"  {100 * count / total:5.1f}%{ms(count)}  {name}")
    print("\nby area, outermost (each sample once, under the first area from the root: the caller that asked):")
    for name, count in outermost.most_common():
        print(f"  {100 * count / total:5.1f}%{ms(count)}  {name}")
    print("\nby area, innermost (each sample once, under the last area on the stack: where the time went):")
    for name, count in innermost.most_common():
        print(f"  {100 * count / total:5.1f}%{ms(count)}  {name}")


if __name__ == "__main__":
    main()
