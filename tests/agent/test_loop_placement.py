"""Where a session's requests go: a slot of its own on a llama.cpp server with several (two sessions taking turns
keep their prefixes), and another replica when its own cannot be reached (recorded, and marked on the chart)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from time import monotonic
from typing import Any

import pytest

from chat.agent import placement, server_api
from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.tools import tool_list
from chat.web import chart
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, RequestStatus, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.llama import LlamaServer
from testing.scripted_server import ScriptedServer, Step
from testing.tiny_gguf import ModelShape, write_model
from tests.agent.loop_helpers import run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("loop-placement")]

FAST = Timeouts(connect=2.0, first_token=60.0, between_chunks=60.0)
SLOT_CONTEXT = 16384
SHAPE = ModelShape(layers=1, dim=32, heads=1, ff=64, ctx=SLOT_CONTEXT)  # placement, not arithmetic, is tested
WORDS = 50  # a turn of 50 words (about 300 tokens) after a prefix of about 4,500


@pytest.fixture(autouse=True)
def _placed_afresh() -> Iterator[None]:
    placement.forget()
    yield
    placement.forget()


def _session(user: Any, workspace: Workspace, endpoint: ModelEndpoint) -> ChatSession:
    return session_start(
        owner=user,
        workspace=workspace,
        endpoint=endpoint,
        model_name=endpoint.model,
        tools=tool_list(allow_commands=False),
    )


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", SHAPE)
    with LlamaServer(model, ctx_size=2 * SLOT_CONTEXT, n_predict=1, alias="tiny", parallel=2) as server:
        yield server  # llama.cpp's default flags: a host-memory prompt cache, no saved slots


def test_two_sessions_taking_turns_on_two_slots_each_find_their_prefix(
    user: Any, workspace: Workspace, two_slots: LlamaServer
) -> None:
    assert placement.server_slots(two_slots.base_url, api_key=None) == placement.ServerSlots(2, False, True)
    endpoint = ModelEndpoint.objects.create(
        name="two", base_url=two_slots.base_url, model="tiny", context_window=SLOT_CONTEXT
    )
    sessions = [_session(user, workspace, endpoint) for _ in range(2)]
    for turn in range(3):
        for number, session in enumerate(sessions):
            words = f"session {number} turn {turn}: " + " ".join(f"w{number}{turn}{i}" for i in range(WORDS))
            ran = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send(words))
            assert ran.turn.status == TurnStatus.DONE, ran.turn.error
    for session in sessions:
        requests = list(ModelRequest.objects.filter(session=session).order_by("id"))
        assert len({request.slot for request in requests}) == 1, "each session keeps one slot"
        for returning in requests[1:]:  # the first request of each later turn, after the other session's turn
            assert returning.prompt_tokens and returning.cached_tokens is not None
            assert returning.cached_tokens >= 0.9 * returning.prompt_tokens, (
                f"{returning.cached_tokens} of {returning.prompt_tokens} cached"
            )
    assert {request.slot for request in ModelRequest.objects.all()} == {0, 1}


def _turns(sessions: list[ChatSession], turns: int) -> None:
    for turn in range(turns):
        for number, session in enumerate(sessions):  # more sessions than slots: each return finds its slot taken
            words = f"session {number} turn {turn}: " + " ".join(f"w{number}{turn}{i}" for i in range(WORDS))
            ran = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send(words))
            assert ran.turn.status == TurnStatus.DONE, ran.turn.error


def test_more_sessions_than_slots_on_default_flags_each_find_their_prefix_in_the_host_memory_cache(
    user: Any, workspace: Workspace, two_slots: LlamaServer
) -> None:
    """Three sessions on two slots, llama.cpp's default flags: a returning session's slot is handed over first, and
    llama.cpp loads its prefix from the host-memory cache. Left to llama.cpp's own choice (and so before), a
    returning session found only the system prompt and tools cached: its conversation shared more than half the
    slot's tokens with the request, and llama.cpp kept that instead of loading the session's own."""
    endpoint = ModelEndpoint.objects.create(
        name="two", base_url=two_slots.base_url, model="tiny", context_window=SLOT_CONTEXT
    )
    sessions = [_session(user, workspace, endpoint) for _ in range(3)]
    _turns(sessions, 3)
    for session in sessions:
        _, *returning = ModelRequest.objects.filter(session=session).order_by("id")
        assert len(returning) == 2 and all(request.slot is not None for request in returning)
        for request in returning:
            assert request.prompt_tokens and request.cached_tokens is not None
            assert request.cached_tokens >= 0.9 * request.prompt_tokens, (
                f"{request.cached_tokens} of {request.prompt_tokens} cached"
            )
    assert placement.server_slots(two_slots.base_url, api_key=None).hands_over


def test_two_sessions_taking_turns_on_one_slot_on_default_flags_each_find_their_prefix(
    user: Any, workspace: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One slot, which llama.cpp never saves to its cache as an idle slot: a new session hands it over with the
    chat template's head (the holder's prefix is saved, no cached one is taken), a returning one with tokens of
    no conversation's (its own comes back). Handed over the second way only, each took the other's cached prefix
    at every turn; left to llama.cpp, each return found only the system prompt and tools."""
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", SHAPE)
    with LlamaServer(model, ctx_size=SLOT_CONTEXT, n_predict=1, alias="tiny") as server:
        endpoint = ModelEndpoint.objects.create(
            name="one", base_url=server.base_url, model="tiny", context_window=SLOT_CONTEXT
        )
        sessions = [_session(user, workspace, endpoint) for _ in range(2)]
        _turns(sessions, 3)
    for session in sessions:
        _, *returning = ModelRequest.objects.filter(session=session).order_by("id")
        assert len(returning) == 2 and all(request.slot == 0 for request in returning)
        for request in returning:
            assert request.prompt_tokens and request.cached_tokens is not None
            assert request.cached_tokens >= 0.9 * request.prompt_tokens, (
                f"{request.cached_tokens} of {request.prompt_tokens} cached"
            )


def test_a_server_whose_handed_over_slots_serve_nothing_cached_is_left_to_its_own_placement(
    user: Any, workspace: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Its prompt cache is off (or it takes a named slot as it stands): after three handovers that found nothing
    cached, once sessions outnumber its slots, the server places them itself for the rest of its run."""
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", SHAPE)
    with LlamaServer(
        model, ctx_size=2 * SLOT_CONTEXT, n_predict=1, alias="tiny", cache_ram_mib=0, parallel=2
    ) as server:
        endpoint = ModelEndpoint.objects.create(
            name="two", base_url=server.base_url, model="tiny", context_window=SLOT_CONTEXT
        )
        sessions = [_session(user, workspace, endpoint) for _ in range(3)]
        _turns(sessions, 3)
        assert not placement.server_slots(server.base_url, api_key=None).hands_over
    requests = [list(ModelRequest.objects.filter(session=s).order_by("id")) for s in sessions]
    assert {requests[0][0].slot, requests[1][0].slot} == {0, 1}, "while each session has a slot, each keeps its own"
    assert requests[2][0].slot is not None, "the third takes the least recently used slot"
    returns = [session_requests[1] for session_requests in requests]
    assert all(r.slot is not None and r.cached_tokens == 0 for r in returns), "each return: a handover, none cached"
    assert [session_requests[2].slot for session_requests in requests] == [None] * 3, "then the server chooses"


def test_a_handover_that_served_something_settles_it_for_the_server_s_run() -> None:
    url = "http://127.0.0.1:9/v1"
    placement._slots[url] = placement._Known(monotonic(), 2, False, "started")
    placement._handed_over.update({(url, 0), (url, 1)})
    placement.release_slot(url=url, slot=0, cached_tokens=1200)
    placement.release_slot(url=url, slot=1, cached_tokens=0)  # its prefix pushed out of a full cache, say
    assert placement._slots[url].hands_over and placement._slots[url].handover_misses == 0


def test_a_replica_out_of_reach_moves_the_session_to_another_and_the_chart_marks_it(
    user: Any, workspace: Workspace
) -> None:
    with ScriptedServer(model="m") as first, ScriptedServer(model="m") as second:
        endpoint = ModelEndpoint.objects.create(
            name="replicas", base_url=first.base_url, replica_urls=f"{second.base_url}\n", model="m"
        )
        session = _session(user, workspace, endpoint)
        run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("hello"))
        home = ModelRequest.objects.get(session=session).endpoint_url
        other = second if home == first.base_url else first
        (first if home == first.base_url else second).close()
        other.push(Step(text="still here"))
        turn = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("again")).turn
    assert turn.status == TurnStatus.DONE and turn.reply_text == "still here", turn.error
    _, failed, moved = ModelRequest.objects.filter(session=session).order_by("id")
    assert (failed.endpoint_url, failed.status) == (home, RequestStatus.FAILED)
    assert (moved.endpoint_url, moved.moved, moved.status) == (other.base_url, "replica", RequestStatus.DONE)
    bar = chart.bar_html(chart.Bar(3, moved, None), window=8192, auto_at=0.8)
    assert '<span class="cause cause-replica" title="replica" aria-label="replica">P</span>' in bar
    assert f"sent to: {other.base_url}" in bar and "moved: replica" in bar


def test_requests_to_a_server_of_one_slot_name_it_until_it_cannot_be_handed_over(
    user: Any, workspace: Workspace, tmp_path: Path
) -> None:
    """A server of one slot is placed on while its slot can be handed over to another session; one that offers no
    ``/completion`` (the scripted server) is left to place requests itself from the first handover it refused."""
    with ScriptedServer(model="m", n_ctx=50_000) as server:
        endpoint = ModelEndpoint.objects.create(name="one", base_url=server.base_url, model="m")
        first, second = (_session(user, workspace, endpoint) for _ in range(2))
        run(ReplyLoop(ChatSession.objects.get(pk=first.pk), client_timeouts=FAST).send("hello"))
        assert server.requests[0].endswith(b',"id_slot":0}')
        assert placement.server_slots(server.base_url, api_key=None) == placement.ServerSlots(1, False, True)
        for session in (second, first):
            run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("and then"))
        assert not placement.server_slots(server.base_url, api_key=None).hands_over
    slots = [request.slot for request in ModelRequest.objects.order_by("id")]
    assert slots == [0, 0, None], "the second session took the slot over; the handover refused, no slot is named"


def test_a_session_whose_slot_was_taken_over_has_its_prefix_put_back(
    user: Any, workspace: Workspace, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", SHAPE)
    saves = tmp_path / "slots"
    saves.mkdir()
    with LlamaServer(
        model, ctx_size=2 * SLOT_CONTEXT, n_predict=1, alias="tiny", cache_ram_mib=0, parallel=2, slot_save_path=saves
    ) as server:
        assert placement.server_slots(server.base_url, api_key=None) == placement.ServerSlots(2, True, True)
        endpoint = ModelEndpoint.objects.create(
            name="saves", base_url=server.base_url, model="tiny", context_window=SLOT_CONTEXT
        )
        sessions = [_session(user, workspace, endpoint) for _ in range(3)]
        for turn in range(2):
            for number, session in enumerate(sessions):  # three sessions, two slots: each return finds it taken
                words = f"session {number} turn {turn}: " + " ".join(f"w{number}{turn}{i}" for i in range(WORDS))
                ran = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send(words))
                assert ran.turn.status == TurnStatus.DONE, ran.turn.error
    assert {path.name for path in saves.iterdir()} == {f"cachet-session-{s.pk}.bin" for s in sessions}
    for session in sessions:
        _, returning = ModelRequest.objects.filter(session=session).order_by("id")
        assert returning.prompt_tokens and returning.cached_tokens is not None
        assert returning.cached_tokens >= 0.9 * returning.prompt_tokens, (
            f"{returning.cached_tokens} of {returning.prompt_tokens} cached"
        )


def test_a_llama_cpp_replica_that_goes_down_moves_its_session_to_the_other(
    user: Any, workspace: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", SHAPE)
    first = LlamaServer(model, ctx_size=SLOT_CONTEXT, n_predict=1, alias="tiny", cache_ram_mib=0).start()
    second = LlamaServer(model, ctx_size=SLOT_CONTEXT, n_predict=1, alias="tiny", cache_ram_mib=0).start()
    try:
        endpoint = ModelEndpoint.objects.create(
            name="pair", base_url=first.base_url, replica_urls=second.base_url, model="tiny", context_window=8192
        )
        session = _session(user, workspace, endpoint)
        ran = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("hello"))
        assert ran.turn.status == TurnStatus.DONE, ran.turn.error
        home = ModelRequest.objects.get(session=session).endpoint_url
        down, other = (first, second) if home == first.base_url else (second, first)
        down.stop()
        ran = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("and again"))
        assert ran.turn.status == TurnStatus.DONE, ran.turn.error
        later = ModelRequest.objects.filter(session=session).order_by("-id").first()
        assert later is not None and (later.endpoint_url, later.moved) == (other.base_url, "replica")
        ran = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("once more"))
        last = ModelRequest.objects.filter(session=session).order_by("-id").first()
        assert last is not None and (last.endpoint_url, last.moved) == (other.base_url, ""), "it stays there"
    finally:
        first.stop()
        second.stop()


def test_asking_whether_a_server_saves_slots_never_empties_one(
    user: Any, workspace: Workspace, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The audit's probe: the check restored a file that was not there into slot 0, and llama.cpp empties a slot
    whose restore fails; a session's second turn from a new process (``ask``: a new check) found 0 of 7,100 prompt
    tokens cached. Now every turn is asked from a process that knows nothing yet, with ten checks between turns."""
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", SHAPE)
    saves = tmp_path / "slots"
    saves.mkdir()
    with LlamaServer(
        model, ctx_size=2 * SLOT_CONTEXT, n_predict=1, alias="tiny", cache_ram_mib=0, parallel=2, slot_save_path=saves
    ) as server:
        endpoint = ModelEndpoint.objects.create(
            name="saves", base_url=server.base_url, model="tiny", context_window=SLOT_CONTEXT
        )
        session = _session(user, workspace, endpoint)
        for turn in range(3):
            for _ in range(10):
                placement.forget()
                assert placement.server_slots(server.base_url, api_key=None) == placement.ServerSlots(2, True, True)
            words = f"turn {turn}: " + " ".join(f"w{turn}{i}" for i in range(WORDS // 5))
            ran = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send(words))
            assert ran.turn.status == TurnStatus.DONE, ran.turn.error
    assert list(saves.iterdir()) == [], "nothing was saved: no slot was taken over"
    for returning in ModelRequest.objects.filter(session=session).order_by("id")[1:]:
        assert returning.prompt_tokens and returning.cached_tokens is not None
        assert returning.cached_tokens >= 0.95 * returning.prompt_tokens, (
            f"{returning.cached_tokens} of {returning.prompt_tokens} cached"
        )


def test_whether_a_server_saves_slots_is_asked_once_per_start(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    real = server_api.slot_saving

    def counted(url: str, **options: Any) -> bool:
        asked.append(url)
        return real(url, **options)

    monkeypatch.setattr(server_api, "slot_saving", counted)
    with ScriptedServer(model="m", n_ctx=50_000) as server:
        assert not placement.server_slots(server.base_url, api_key=None).saves
        known = placement._slots[server.base_url]
        placement._slots[server.base_url] = placement._Known(0.0, known.slots, known.saves, known.started_as)
        assert not placement.server_slots(server.base_url, api_key=None).saves  # a minute on: the same start
        assert len(asked) == 1
        placement.mark_down(server.base_url)  # out of reach: perhaps started again, with other flags
        placement.server_slots(server.base_url, api_key=None)
        assert len(asked) == 2


def test_a_server_started_again_is_asked_its_template_head_again() -> None:
    with ScriptedServer(model="m", n_ctx=50_000) as server:
        placement.server_slots(server.base_url, api_key=None)
        assert server_api.template_head(server.base_url) is not None
        known = placement._slots[server.base_url]
        placement._slots[server.base_url] = placement._Known(0.0, known.slots, known.saves, "another start")
        placement.server_slots(server.base_url, api_key=None)
        assert server_api.server_root(server.base_url) not in server_api._heads


def test_a_requests_bytes_sent_are_every_byte_of_its_body(user: Any, workspace: Workspace) -> None:
    """The sampling settings and ``id_slot`` go after the conversation, and the record counts them (it left them
    out: 30 to 47 bytes short)."""
    with ScriptedServer(model="m", n_ctx=50_000) as server:
        endpoint = ModelEndpoint.objects.create(name="one", base_url=server.base_url, model="m")
        session = _session(user, workspace, endpoint)
        ChatSession.objects.filter(pk=session.pk).update(temperature=0.25, max_tokens=500)
        server.push(Step(text="hi"))
        run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("hello"))
        received = server.requests[0]
    assert received.endswith(b',"temperature":0.25,"max_tokens":500,"id_slot":0}'), received[-60:]
    assert ModelRequest.objects.get(session=session).bytes_sent == len(received)
