"""Searching sessions: whole and partial words, ranking, snippets, filters, and only the owner's sessions."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.tools import tool_list
from sessions_app.models import ChatSession, ModelEndpoint, Turn, Workspace
from sessions_app.selectors.search import SEARCH_LIMIT, SearchQuery, session_search, snippet_parts, trigram_available
from sessions_app.services.sessions import session_start
from sessions_app.services.turns import step_record, turn_finish, turn_start
from sessions_app.services.undo import turn_undo

pytestmark = pytest.mark.django_db


def said(session: ChatSession, words: str, reply: str = "Noted.") -> Turn:
    turn = turn_start(session=session, words=words, today="2026-11-30", instructions=None)
    step_record(turn=turn, number=1, text=reply, reasoning="", tool_calls=[], finish_reason="stop")
    return turn_finish(turn=turn)


def started(
    owner: Any, workspace: Workspace, endpoint: ModelEndpoint, *, title: str = "", model: str = "m"
) -> ChatSession:
    return session_start(
        owner=owner,
        workspace=workspace,
        endpoint=endpoint,
        model_name=model,
        tools=tool_list(allow_commands=False),
        title=title,
    )


@pytest.fixture(params=[True, False], ids=["trigram", "ilike"])
def trigram(request: pytest.FixtureRequest) -> bool:
    """Both ways of finding partial words: pg_trgm where the database has it, ILIKE always."""
    wanted = bool(request.param)
    if wanted and not trigram_available():
        pytest.skip("this Postgres has no pg_trgm (the embedded one); the ILIKE case runs instead")
    return wanted


def test_a_word_from_the_middle_of_a_message_finds_its_session(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint, trigram: bool
) -> None:
    wanted = started(user, workspace, endpoint)
    said(
        wanted,
        "Please look at the configuration loader in the settings module and tell me, after reading it, why the "
        "zeppelin flag is ignored at startup when the environment sets it.",
    )
    other = started(user, workspace, endpoint)
    said(other, "Something unrelated entirely.")
    hits = session_search(owner=user, text="zeppelin", trigram=trigram)
    assert [hit.session.pk for hit in hits] == [wanted.pk]
    hit = hits[0]
    assert hit.field == "message" and hit.position == 1
    marked = [part.text for part in hit.snippet if part.mark]
    assert marked == ["zeppelin"]
    assert "".join(part.text for part in hit.snippet).startswith("…"), "the window starts inside the message"


def test_replies_and_partial_words_are_found(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint, trigram: bool
) -> None:
    session = started(user, workspace, endpoint, title="t")
    said(session, "What does it do?", "The tokenizer splits the input into lexemes.")
    assert [hit.field for hit in session_search(owner=user, text="lexemes", trigram=trigram)] == ["reply"]
    assert [hit.field for hit in session_search(owner=user, text="tokeni", trigram=trigram)] == ["reply"], "a prefix"
    middle = session_search(owner=user, text="kenize", trigram=trigram)
    assert [hit.session.pk for hit in middle] == [session.pk], "a piece from inside a word"
    assert [part.text for part in middle[0].snippet if part.mark] == ["kenize"]
    assert session_search(owner=user, text="nothing-like-this", trigram=trigram) == []


def test_pieces_inside_words_are_looked_for_only_where_no_whole_word_matches(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint, trigram: bool
) -> None:
    whole = started(user, workspace, endpoint, title="t")
    said(whole, "The parser is slow.")
    inside = started(user, workspace, endpoint, title="t")
    said(inside, "The subparsers are fast.")
    assert [hit.session.pk for hit in session_search(owner=user, text="parser", trigram=trigram)] == [whole.pk]
    assert {hit.session.pk for hit in session_search(owner=user, text="arser", trigram=trigram)} == {
        whole.pk,
        inside.pk,
    }


def test_a_misspelt_word_is_found_by_trigram_similarity(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    if not trigram_available():
        pytest.skip("this Postgres has no pg_trgm (the embedded one)")
    session = started(user, workspace, endpoint, title="t")
    said(session, "The migration script fails on the staging database.")
    said(started(user, workspace, endpoint, title="t"), "The migrant birds came back.")
    assert [hit.session.pk for hit in session_search(owner=user, text="migraton", trigram=True)] == [session.pk]
    assert session_search(owner=user, text="migraton", trigram=False) == []
    exact = session_search(owner=user, text="migrant", trigram=True)
    assert len(exact) == 1, "similar words are looked for only where nothing matches as typed"


def test_more_and_better_matches_rank_first_and_titles_weigh_more(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint, trigram: bool
) -> None:
    once = started(user, workspace, endpoint, title="one")
    said(once, "A long message that mentions kestrel once among many other words about other things entirely.")
    often = started(user, workspace, endpoint, title="two")
    said(often, "kestrel kestrel", "The kestrel is a small falcon.")
    titled = started(user, workspace, endpoint, title="Kestrel notes")
    said(titled, "kestrel")
    said(titled, "kestrel again", "kestrel")
    hits = session_search(owner=user, text="kestrel", trigram=trigram)
    assert [hit.session.pk for hit in hits] == [titled.pk, often.pk, once.pk]
    assert hits[0].field != "title" and hits[0].position == 2 and hits[0].hits == 4, "the newest best, not the title"
    assert [hit.field for hit in session_search(owner=user, text="notes", trigram=trigram)] == ["title"]


def test_all_words_must_match_and_filters_narrow(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint, workspace_dir: Any, trigram: bool
) -> None:
    elsewhere = Workspace.objects.create(name="elsewhere", folder=str(workspace_dir))
    first = started(user, workspace, endpoint, model="small")
    said(first, "orange juice recipe")
    second = started(user, elsewhere, endpoint, model="large")
    said(second, "orange paint for the fence")
    assert {hit.session.pk for hit in session_search(owner=user, text="orange", trigram=trigram)} == {
        first.pk,
        second.pk,
    }
    assert [hit.session.pk for hit in session_search(owner=user, text="orange fence", trigram=trigram)] == [second.pk]
    by_workspace = session_search(owner=user, text="orange", workspace_id=workspace.pk, trigram=trigram)
    assert [hit.session.pk for hit in by_workspace] == [first.pk]
    by_model = session_search(owner=user, text="orange", model_name="large", trigram=trigram)
    assert [hit.session.pk for hit in by_model] == [second.pk]


def test_another_persons_sessions_never_appear(
    user: Any, other_user: Any, workspace: Workspace, endpoint: ModelEndpoint, trigram: bool
) -> None:
    mine = started(user, workspace, endpoint, title="secret plan")
    said(mine, "the secret plan")
    theirs = started(other_user, workspace, endpoint, title="secret plan")
    said(theirs, "the secret plan")
    assert [hit.session.pk for hit in session_search(owner=user, text="secret", trigram=trigram)] == [mine.pk]
    assert [hit.session.pk for hit in session_search(owner=other_user, text="secret", trigram=trigram)] == [theirs.pk]


def test_taken_back_turns_are_not_searched(user: Any, workspace: Workspace, endpoint: ModelEndpoint) -> None:
    session = started(user, workspace, endpoint, title="t")
    said(session, "kept words")
    said(session, "withdrawn words")
    turn_undo(session=session)
    assert session_search(owner=user, text="withdrawn") == []
    assert len(session_search(owner=user, text="kept")) == 1


def test_a_search_is_bounded_and_takes_the_same_queries_whatever_the_count(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    for index in range(SEARCH_LIMIT + 5):
        said(started(user, workspace, endpoint), f"common word number {index}")
    with CaptureQueriesContext(connection) as queries:
        hits = session_search(owner=user, text="common")
    assert len(hits) == SEARCH_LIMIT
    assert len(queries.captured_queries) == 3


def test_query_text_is_data_never_syntax(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint, trigram: bool
) -> None:
    session = started(user, workspace, endpoint)
    said(session, "100% of it: a_b & c | !d (e) 'f' <g> \\h")
    for text in ("100%", "a_b", "& c |", "!d", "(e)", "'f'", "<g>", "\\h", "%", "_"):
        assert [hit.session.pk for hit in session_search(owner=user, text=text, trigram=trigram)] == [session.pk], text
    assert session_search(owner=user, text="   ", trigram=trigram) == []
    assert session_search(owner=user, text=":* & !", trigram=trigram) == []


def test_query_parsing_and_snippet_marks() -> None:
    query = SearchQuery.parse("  Parser   src/app.py parser ")
    assert query.pieces == ("parser", "src/app.py")
    assert query.words == ("parser", "src", "app", "py")
    assert query.tsquery == "parser:* & src:* & app:* & py:*"
    parts = snippet_parts("<b>The PARSER</b>\n\nparsers", ("parser",), cut_before=True, cut_after=False)
    assert [(part.text, part.mark) for part in parts] == [
        ("…", False),
        ("<b>The ", False),
        ("PARSER", True),
        ("</b> ", False),
        ("parser", True),
        ("s", False),
    ]
