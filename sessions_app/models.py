"""The session store: what was said, what tools answered, and every request sent to a model."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models


def default_disk_quota_mb() -> int:
    """A new workspace's disk quota: ``CACHET_WORKSPACE_QUOTA_MB``."""
    return int(settings.CACHET_WORKSPACE_QUOTA_MB)


class Workspace(models.Model):
    """A folder on the server the model's tools act in, used by its members (staff too where it has none), or by
    everyone where staff opened it to everyone; a person's private workspace (``owner``) has them as its only
    member, for good. No workspace's folder lies inside or holds another's."""

    name = models.CharField(max_length=100, unique=True)
    folder = models.CharField(max_length=1000)
    allow_commands = models.BooleanField(default=False)
    allow_network = models.BooleanField(
        default=False, help_text="Whether commands (run) may use the network; without it they see none."
    )
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="workspaces")
    groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="workspaces",
        help_text="Everyone in these groups may use it, as its members do.",
    )
    open_to_everyone = models.BooleanField(
        default=False,
        help_text=(
            "Every person may use it (and run commands in it where they are allowed), members or not. Off: only its "
            "members may, and where it has none, only staff."
        ),
    )
    # Made from a shell on the server (``ask --workspace FOLDER``): the folder may lie outside
    # CACHET_WORKSPACE_ROOTS. Everything else must lie under them whenever it is used.
    from_shell = models.BooleanField(default=False, editable=False)
    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="private_workspace",
        help_text="Whose private workspace this is, made on their first use; empty for a shared one.",
    )
    disk_quota_mb = models.PositiveIntegerField(
        default=default_disk_quota_mb,
        help_text="Megabytes the folder may hold on disk; the file tools and commands stop at it. 0: no quota.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def disk_quota_bytes(self) -> int | None:
        """The disk quota in bytes, ``None`` where there is none."""
        return self.disk_quota_mb * 1024 * 1024 if self.disk_quota_mb else None


def http_url(value: str) -> None:
    """An http or https URL with a host, any host (a container's name too: ``http://wiki-mcp:8000/mcp``)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise ValidationError("Enter an http:// or https:// URL with a host.")


MCP_NAME = RegexValidator(
    r"^[a-z][a-z0-9-]{0,19}$", "Lowercase letters, digits and dashes, starting with a letter, at most 20."
)


class McpServer(models.Model):
    """An MCP server whose tools the model may call in a workspace's sessions, reached over streamable HTTP. Its
    tools are offered as ``NAME__TOOL``; a session's list is fixed when it starts. What the server said when
    Cachet last asked it (its tools, its instructions, or why it did not answer) is kept by the worker."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.CharField(
        max_length=20,
        validators=[MCP_NAME],
        help_text="Its tools are offered to the model as NAME__TOOL (wiki__search): lowercase, digits and dashes.",
    )
    url = models.CharField(
        max_length=500,
        blank=True,
        validators=[http_url],
        help_text="A server reached over streamable HTTP: its endpoint (http://wiki-mcp:8000/mcp).",
    )
    command = models.TextField(
        blank=True,
        help_text=(
            "Or a server run as a command, speaking MCP on its standard input and output: run with /bin/sh -c in the "
            "workspace's sandbox, as the sandbox user, as the model's commands are (npx -y @scope/server .)."
        ),
    )
    read_only_folders = models.TextField(
        blank=True,
        help_text="Folders the command may read, one per line (where the server is installed: /opt/mcp/wiki).",
    )
    bearer_token = models.CharField(
        max_length=500, blank=True, help_text="Sent as Authorization: Bearer … where the server asks for one."
    )
    enabled = models.BooleanField(
        default=True,
        help_text="Offered to sessions that start from now on. Off: sessions that listed its tools are told they "
        "are not available.",
    )
    call_timeout = models.PositiveIntegerField(default=60, help_text="Seconds a call may take.")
    tools_json = models.TextField(blank=True, editable=False)
    instructions = models.TextField(blank=True, editable=False)
    checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    problem = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["workspace", "name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="mcp_server_unique_name"),
            models.CheckConstraint(
                condition=(models.Q(url="") & ~models.Q(command="")) | (~models.Q(url="") & models.Q(command="")),
                name="mcp_server_url_or_command",
            ),
        ]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if bool(self.url) == bool(self.command.strip()):
            raise ValidationError("Give the server's URL or its command, one of the two.")
        for folder in self.folders:
            if not os.path.isabs(folder) or os.path.normpath(folder) == "/":
                raise ValidationError({"read_only_folders": f"{folder}: give absolute folders, not / itself."})

    @property
    def folders(self) -> tuple[str, ...]:
        """The folders its command may read, each once."""
        listed = (line.strip() for line in self.read_only_folders.splitlines())
        return tuple(dict.fromkeys(os.path.normpath(folder) for folder in listed if folder))


DEFAULT_ENDPOINT_NAME = "default"


class ModelEndpoint(models.Model):
    """An OpenAI-compatible server, used by everyone or by the people and groups staff granted it. An empty
    ``model`` is taken from its ``/v1/models``. The one named
    :data:`DEFAULT_ENDPOINT_NAME` follows ``CACHET_MODEL_URL`` and ``CACHET_MODEL`` at every start where they are
    set, and keeps what staff set where they are not."""

    name = models.CharField(max_length=100, unique=True)
    base_url = models.URLField(max_length=500)
    replica_urls = models.TextField(
        blank=True,
        help_text=(
            "More base URLs serving the same model, one per line: each session sticks to one, and moves to another "
            "only when its own cannot be reached."
        ),
    )
    api_key = models.CharField(max_length=500, blank=True)
    model = models.CharField(max_length=200, blank=True)
    context_window = models.PositiveIntegerField(
        default=8192,
        help_text=(
            "Tokens; used where the server does not say its own (llama.cpp, vLLM, SGLang, Ollama and LM Studio do)."
        ),
    )
    # What the server at ``server_window_url`` said (``None``: it says nothing), where it said it
    # (``server_window_how``, e.g. "llama.cpp /props n_ctx") and when; no ``server_window_read_at``: to be asked
    # again before the next use.
    open_to_everyone = models.BooleanField(
        default=True,
        help_text=(
            "Every person may use it. Off: only the people and groups granted below (and staff); for a server that "
            "holds a paid API key, say."
        ),
    )
    people = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="granted_endpoints", help_text="May use it."
    )
    groups = models.ManyToManyField(
        "auth.Group", blank=True, related_name="granted_endpoints", help_text="Everyone in them may use it."
    )
    server_context_window = models.PositiveIntegerField(null=True, blank=True, editable=False)
    server_window_url = models.CharField(max_length=500, blank=True, editable=False)
    server_window_how = models.CharField(max_length=100, blank=True, editable=False)
    server_window_read_at = models.DateTimeField(null=True, blank=True, editable=False)
    reads_images = models.BooleanField(
        default=False,
        help_text=(
            "Its model reads images, so an attached image goes with the message. Used where the server does not "
            "say (llama.cpp says it at /props: started with a vision projector, --mmproj)."
        ),
    )
    # What the server at ``server_window_url`` said of images when it was last asked (``None``: it says nothing).
    server_reads_images = models.BooleanField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def urls(self) -> list[str]:
        """The base URL and the replicas' (each once, in order)."""
        listed = [self.base_url, *(line.strip() for line in self.replica_urls.splitlines())]
        return list(dict.fromkeys(url for url in listed if url))

    @property
    def window(self) -> int:
        """The context window in tokens: what the server said at this URL, else the configured one."""
        if self.server_context_window and self.server_window_url == self.base_url:
            return self.server_context_window
        return self.context_window

    @property
    def images_read(self) -> bool:
        """Whether the model reads images: what the server said at this URL, else what staff set."""
        if self.server_reads_images is not None and self.server_window_url == self.base_url:
            return self.server_reads_images
        return self.reads_images


class Mode(models.TextChoices):
    PLAN = "plan", "plan"
    EDIT = "edit", "edit"
    FULL = "full", "full"


class TitleSource(models.TextChoices):
    """Who wrote a session's title: the first words typed, the model (asked once after the first reply), or the
    person (a rename, which nothing overwrites)."""

    TYPED = "typed", "the first words typed"
    MODEL = "model", "the model"
    PERSON = "person", "the person"


UNTITLED = "New session"  # the name of a session that has no title yet


class ChatSession(models.Model):
    # PROTECT: a person with sessions is deactivated, not deleted; their sessions stay stored.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="chat_sessions")
    title = models.CharField(max_length=200, blank=True)
    title_source = models.CharField(max_length=8, choices=TitleSource.choices, default=TitleSource.TYPED)
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="sessions")
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="sessions")
    model_name = models.CharField(max_length=200)
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.EDIT)
    next_result_number = models.PositiveIntegerField(default=1)
    next_turn_number = models.PositiveIntegerField(default=1)
    generation_number = models.PositiveIntegerField(default=1)
    revision = models.PositiveBigIntegerField(default=0)
    pending_breaks = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Deleted by its owner: gone from everything they see, kept whole for the admin (nothing stored is lost).
    deleted_at = models.DateTimeField(null=True, blank=True)
    pinned = models.BooleanField(default=False, help_text="Listed first in its owner's session list.")
    archived = models.BooleanField(default=False, help_text="Out of its owner's session list, under Archived.")
    # Sent as a note on the next message (the first one's, then any change), never in the system prompt.
    instructions = models.TextField(blank=True, help_text="The owner's instructions for this session.")
    # None: the server's own default, and the request names none.
    temperature = models.FloatField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="The most tokens a reply's step writes.")

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]
        constraints = [  # what the settings service refuses, refused by the database too (the admin, an import)
            models.CheckConstraint(
                condition=models.Q(temperature__isnull=True) | models.Q(temperature__gte=0, temperature__lte=2),
                name="session_temperature_range",
            ),
            models.CheckConstraint(
                condition=models.Q(max_tokens__isnull=True) | models.Q(max_tokens__gte=1),
                name="session_max_tokens_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"

    @property
    def shown_title(self) -> str:
        """The session's name wherever a person sees it: its title, else ``UNTITLED``."""
        return self.title or UNTITLED


class Generation(models.Model):
    """A frozen system prompt and tool list; a compaction or a change of model starts the next one."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="generations")
    number = models.PositiveIntegerField()
    system_prompt = models.TextField()
    system_prompt_sha256 = models.CharField(max_length=64)
    tools_json = models.TextField()
    mode = models.CharField(max_length=8, choices=Mode.choices)
    model_name = models.CharField(max_length=200)
    # Whether its model reads images: an attached image goes with its message as an image part (fixed with the
    # generation, as the tool list is, so every request of it sends the same bytes).
    reads_images = models.BooleanField(default=False)
    summary = models.TextField(blank=True)
    table = models.TextField(blank=True)
    covers_through_turn = models.PositiveIntegerField(null=True, blank=True)
    # Set where a reply was compacted while it ran: turn ``covers_through_turn`` goes on in this generation,
    # its message and its steps after this one carried, the ones up to it summarized.
    resumes_after_step = models.PositiveIntegerField(null=True, blank=True)
    # Set where a reply was compacted while it ran, with or without ``resumes_after_step``: this generation's
    # requests send turn ``resumed_turn``'s message as ``resumed_message``, its words with the full note (workspace,
    # model, mode, date, instructions) composed when the generation began, and not as the turn stores it (the
    # message the generations before sent, kept as it was). ``resumed_note_*`` say what that note states, as
    # ``Turn.note_*`` do.
    resumed_turn = models.PositiveIntegerField(null=True, blank=True)
    resumed_message = models.TextField(blank=True)
    resumed_note_workspace = models.CharField(max_length=100, blank=True)
    resumed_note_model = models.CharField(max_length=200, blank=True)
    resumed_note_date = models.CharField(max_length=10, blank=True)
    resumed_note_mode = models.CharField(max_length=8, blank=True)
    resumed_note_instructions = models.TextField(null=True, blank=True)  # noqa: DJ001 - None: not stated
    resumed_note_session_instructions = models.TextField(null=True, blank=True)  # noqa: DJ001 - None: not stated
    resumed_note_tool_instructions = models.JSONField(null=True, blank=True)
    taken_back = models.BooleanField(default=False)
    revision = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "number"]
        constraints = [models.UniqueConstraint(fields=["session", "number"], name="generation_unique_number")]

    def __str__(self) -> str:
        return f"{self.session_id} generation {self.number}"


MESSAGE_FIELDS = (
    "message",
    "note_workspace",
    "note_model",
    "note_date",
    "note_mode",
    "note_instructions",
    "note_session_instructions",
    "note_tool_instructions",
)
"""A turn's message and what its note states; a generation's ``resumed_*`` fields hold the same of the turn it
resumed, as it sends it."""
RESUMED_FIELDS = ("resumed_turn", *(f"resumed_{name}" for name in MESSAGE_FIELDS))
"""The fields of a generation that say how it sends the turn a compaction inside its reply left running."""


class TurnStatus(models.TextChoices):
    OPEN = "open", "open"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    INTERRUPTED = "interrupted", "interrupted"
    TAKEN_BACK = "taken_back", "taken back"


class Rating(models.TextChoices):
    """A person's thumbs on a reply (``Turn.rating``), kept for the admin."""

    UP = "up", "thumbs up"
    DOWN = "down", "thumbs down"


class TakenBackBy(models.TextChoices):
    """What took a turn back (``Turn.taken_back_by``)."""

    UNDO = "undo", "undo"
    REWIND = "rewind", "rewind"
    REGENERATE = "regenerate", "regenerate"
    EDIT = "edit", "edit"
    BRANCH = "branch", "branch"


class Turn(models.Model):
    """The person's message, as stored with its note, and the model's whole reply to it.

    Turns form a tree: ``parent`` is the turn before this one in its branch (None for a first turn), and
    siblings share a parent. The live branch is the path of turns not taken back; ``position`` is the
    turn's place in its branch (1 for a first turn), which the page shows as its label.
    """

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="turns")
    number = models.PositiveIntegerField()
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")
    position = models.PositiveIntegerField(default=1)
    generation = models.ForeignKey(Generation, on_delete=models.RESTRICT, related_name="turns")
    words = models.TextField()
    message = models.TextField()
    note_workspace = models.CharField(max_length=100, blank=True)
    note_model = models.CharField(max_length=200, blank=True)
    note_date = models.CharField(max_length=10, blank=True)
    note_mode = models.CharField(max_length=8, blank=True)
    note_instructions = models.TextField(null=True, blank=True)  # noqa: DJ001 - None: not mentioned, "": removed
    note_session_instructions = models.TextField(null=True, blank=True)  # noqa: DJ001 - as note_instructions
    # The MCP servers' instructions the note states, by server ("": removed); None: none stated.
    note_tool_instructions = models.JSONField(null=True, blank=True)
    mode = models.CharField(max_length=8, choices=Mode.choices)
    reply_text = models.TextField(blank=True)
    status = models.CharField(max_length=12, choices=TurnStatus.choices, default=TurnStatus.OPEN)
    error = models.TextField(blank=True)
    taken_back_by = models.CharField(max_length=12, blank=True)
    # While taken back: the status the turn had while live, and the revision of the action that took it
    # back (turns taken back together share it), so a flip brings a branch back as it was left.
    live_status = models.CharField(max_length=12, choices=TurnStatus.choices, blank=True)
    taken_back_in = models.PositiveBigIntegerField(null=True, blank=True)
    revision = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    rating = models.CharField(max_length=4, choices=Rating.choices, blank=True)  # the owner's thumbs on the reply
    rated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["session", "number"]
        constraints = [models.UniqueConstraint(fields=["session", "number"], name="turn_unique_number")]
        # No index on revision: it moves on at every step, and unindexed it changes the row in place (0013).
        indexes = [models.Index(fields=["session", "status"])]

    def __str__(self) -> str:
        return f"{self.session_id} turn {self.number}"


class Step(models.Model):
    """One request's answer within a reply: its text, reasoning and tool calls as the model sent them."""

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="steps")
    number = models.PositiveIntegerField()
    text = models.TextField(blank=True)
    reasoning = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list)
    finish_reason = models.CharField(max_length=40, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["turn", "number"]
        constraints = [models.UniqueConstraint(fields=["turn", "number"], name="step_unique_number")]

    def __str__(self) -> str:
        return f"{self.turn} step {self.number}"


class StepDraft(models.Model):
    """What the step being streamed has said so far, saved as it streams; the stored step replaces it."""

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="drafts")
    number = models.PositiveIntegerField()
    text = models.TextField(blank=True)
    reasoning = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["turn", "number"], name="draft_unique_number")]

    def __str__(self) -> str:
        return f"{self.turn} draft {self.number}"


class ResultKind(models.TextChoices):
    READ = "read", "read"
    STUB = "stub", "stub"
    LISTING = "listing", "listing"
    SAME = "same", "same result"
    EDIT = "edit", "edit"
    OUTPUT = "output", "output"
    RECALL = "recall", "recall"
    ERROR = "error", "error"


class Result(models.Model):
    """A tool result, kept whole: the full text and the text the model was sent. Never edited."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="results")
    number = models.PositiveIntegerField()
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="results")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="results", null=True, blank=True)
    call_id = models.CharField(max_length=200, blank=True)
    tool = models.CharField(max_length=100)
    arguments = models.JSONField(null=True, blank=True)
    arguments_raw = models.TextField(blank=True)
    args_key = models.TextField(blank=True)
    kind = models.CharField(max_length=8, choices=ResultKind.choices)
    full_text = models.TextField(blank=True)
    inserted_text = models.TextField()
    refers_to = models.PositiveIntegerField(null=True, blank=True)
    stale = models.JSONField(default=list, blank=True)
    changed_files = models.JSONField(default=list, blank=True)
    path = models.TextField(blank=True)
    abs_path = models.TextField(blank=True)
    first_line = models.PositiveIntegerField(null=True, blank=True)
    last_line = models.PositiveIntegerField(null=True, blank=True)
    total_lines = models.PositiveIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "number"]
        constraints = [models.UniqueConstraint(fields=["session", "number"], name="result_unique_number")]
        indexes = [
            models.Index(fields=["tool"]),
            models.Index(fields=["kind"]),
            models.Index(fields=["session", "abs_path"]),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} result {self.number}"


class RequestKind(models.TextChoices):
    REPLY = "reply", "reply"
    COMPACTION = "compaction", "compaction"
    TITLE = "title", "title"


class BreakCause(models.TextChoices):
    FIRST = "first", "first request"
    NEW_TURN = "new_turn", "new turn"
    UNDO = "undo", "undo"
    REWIND = "rewind", "rewind"
    REGENERATE = "regenerate", "regenerate"
    BRANCH = "branch", "branch"
    COMPACTION = "compaction", "compaction"
    MODEL_CHANGE = "model_change", "model change"
    RESTART = "restart", "restart"
    UNEXPECTED = "unexpected", "unexpected"


class Moved(models.TextChoices):
    """Why a request went to another server or slot than the session's request before."""

    REPLICA = "replica", "replica"  # the session's replica could not be reached
    SLOT = "slot", "slot"  # its slot was busy with another request, or holds another session's prefix now


class CacheMiss(models.TextChoices):
    HARNESS = "harness", "harness"
    TEMPLATE = "template", "template"
    SERVER = "server", "server"


class RequestStatus(models.TextChoices):
    SENDING = "sending", "sending"
    DONE = "done", "done"
    FAILED = "failed", "failed"


STOPPED = "Stopped."  # the error of a request, and of a turn, that the person stopped


class ModelRequest(models.Model):
    """One request to a model: written before it is sent, completed after."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="model_requests")
    turn = models.ForeignKey(Turn, on_delete=models.SET_NULL, null=True, blank=True, related_name="requests")
    step_number = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=12, choices=RequestKind.choices, default=RequestKind.REPLY)
    endpoint_url = models.CharField(max_length=500)
    slot = models.PositiveSmallIntegerField(null=True, blank=True)  # the server slot asked for (``id_slot``)
    moved = models.CharField(max_length=8, choices=Moved.choices, blank=True)
    model_name = models.CharField(max_length=200)
    body_sha256 = models.CharField(max_length=64)
    bytes_sent = models.PositiveIntegerField()
    images = models.PositiveIntegerField(default=0)  # image parts in the body, and the bytes of their data
    image_bytes = models.PositiveIntegerField(default=0)
    shared_prefix_bytes = models.PositiveIntegerField()
    break_cause = models.CharField(max_length=14, choices=BreakCause.choices, blank=True)
    expected_shared_bytes = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=8, choices=RequestStatus.choices, default=RequestStatus.SENDING)
    error = models.TextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    time_to_first_token = models.FloatField(null=True, blank=True)
    total_time = models.FloatField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True)
    timings = models.JSONField(null=True, blank=True)
    expected_cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    cache_miss = models.CharField(max_length=8, choices=CacheMiss.choices, blank=True)
    cache_miss_tokens = models.PositiveIntegerField(null=True, blank=True)
    cache_miss_message = models.PositiveIntegerField(null=True, blank=True)
    cache_miss_before = models.TextField(blank=True)
    cache_miss_after = models.TextField(blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["session", "id"]
        indexes = [models.Index(fields=["session", "id"]), models.Index(fields=["break_cause"])]

    def __str__(self) -> str:
        return f"{self.session_id} request {self.pk}"


class ServerSlot(models.Model):
    """One slot of a model server as Cachet placed requests in it: whose prefix it holds (the session whose request
    it ran last), when, and until when a request runs there (``busy_until``; a worker that died leaves it, and it
    passes)."""

    url = models.CharField(max_length=500)
    slot = models.PositiveSmallIntegerField()
    session = models.ForeignKey(ChatSession, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    used_at = models.DateTimeField(null=True, blank=True)
    busy_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["url", "slot"], name="server_slot_once")]

    def __str__(self) -> str:
        return f"{self.url} slot {self.slot}"


class SlotSave(models.Model):
    """A session's prefix saved out of a server's slot (llama.cpp's ``--slot-save-path``) when another session took
    the slot over: ``tokens`` long, to be put back when the session returns."""

    url = models.CharField(max_length=500)
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="+")
    tokens = models.PositiveIntegerField(default=0)
    saved_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["url", "session"], name="slot_save_once")]

    def __str__(self) -> str:
        return f"{self.url} session {self.session_id}"


class LastRequest(models.Model):
    """The bytes of a session's last request, which the next one is compared with; read once per reply."""

    session = models.OneToOneField(ChatSession, on_delete=models.CASCADE, primary_key=True, related_name="last_request")
    body = models.BinaryField(default=b"")
    turn_number = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.session_id} last request"


class Theme(models.TextChoices):
    SYSTEM = "system", "Auto"
    LIGHT = "light", "Off"
    DARK = "dark", "On"


class UserSetting(models.Model):
    """What a person chose for how the pages look, kept with their account so it follows them."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="setting")
    theme = models.CharField(max_length=10, choices=Theme.choices, default=Theme.SYSTEM)

    def __str__(self) -> str:
        return f"{self.user_id} settings"


class SessionShare(models.Model):
    """A read-only link to a session, for people signed in to the same Cachet; revoked, it shows nothing."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="shares")
    token = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.session_id} share"


class InstructionPreset(models.Model):
    """Instructions a person saved under a name, to start sessions with; staff share one with people and groups."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="instruction_presets")
    name = models.CharField(max_length=100)
    text = models.TextField()
    people = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="shared_presets", help_text="Offered to them too."
    )
    groups = models.ManyToManyField(
        "auth.Group", blank=True, related_name="shared_presets", help_text="Offered to everyone in them too."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="preset_unique_name")]

    def __str__(self) -> str:
        return self.name


class Upload(models.Model):
    """A file the person attached, written into the session's workspace; the next message's note says it arrived
    (``turn``: the message that said so, ``None`` while it waits for one)."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="uploads")
    path = models.CharField(max_length=1024, help_text="Relative to the workspace folder.")
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, null=True, blank=True, related_name="uploads")
    # An image as a model that reads images is sent it (made once when attached, sent byte-identical in every
    # request); ``image_problem``: why an attached image cannot be shown, where it cannot.
    image = models.BinaryField(null=True, blank=True)
    image_type = models.CharField(max_length=20, blank=True)
    image_width = models.PositiveIntegerField(null=True, blank=True)
    image_height = models.PositiveIntegerField(null=True, blank=True)
    image_problem = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["session", "turn"])]

    def __str__(self) -> str:
        return self.path


class UsageDay(models.Model):
    """A person's finished requests to one endpoint's model on one day (``TIME_ZONE``), added up as each request
    finishes, in the statement that finishes it: what the usage page, its CSV and the admin read, so that a
    year of a team's requests is read as one row per person, endpoint and day. The figures are those of
    ``selectors.totals.RequestTotals``; it outlives the sessions it counts (deleted, the tokens were spent)."""

    day = models.DateField()
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_days")
    endpoint = models.ForeignKey(
        ModelEndpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage_days"
    )
    model_name = models.CharField(max_length=200)
    requests = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    prompt_seconds = models.FloatField(default=0.0)
    timed_tokens = models.PositiveBigIntegerField(default=0)
    timed_seconds = models.FloatField(default=0.0)

    class Meta:
        ordering = ["day", "owner", "endpoint", "model_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["day", "owner", "endpoint", "model_name"], name="usage_day_once", nulls_distinct=False
            )
        ]
        indexes = [models.Index(fields=["owner", "day"])]

    def __str__(self) -> str:
        return f"{self.day} {self.owner_id} {self.model_name}"


class LayerDelivery(models.Model):
    """How long the channel layer took to bring events from their publisher to one web process's tabs, added up
    by that process since it started (``process``: host and pid): the cumulative counts of a histogram, written
    by the process as events arrive (at most every few seconds), summed over processes by ``/metrics``."""

    process = models.CharField(max_length=200, unique=True)
    buckets = models.JSONField(default=list)  # events delivered within each bound of ``DELIVERY_BUCKETS``
    count = models.PositiveBigIntegerField(default=0)
    total_seconds = models.FloatField(default=0.0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.process


class ApiTokenAccess(models.TextChoices):
    READ = "read", "read-only"
    WRITE = "write", "read-write"


class ApiToken(models.Model):
    """A person's personal access token for the API: shown to them once when made, kept here only as its
    SHA-256 (``digest``) and its first characters (``shown``) to tell it apart. A revoked token is kept, unusable,
    so the person and the admin still see it was there."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    access = models.CharField(max_length=5, choices=ApiTokenAccess.choices, default=ApiTokenAccess.READ)
    digest = models.CharField(max_length=64, unique=True)
    shown = models.CharField(max_length=20, help_text="The token's first characters, as its owner saw them.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "-created_at"], name="api_token_owner_created")]

    def __str__(self) -> str:
        return f"{self.name} ({self.shown}…)"

    @property
    def writes(self) -> bool:
        return self.access == ApiTokenAccess.WRITE


class DirectorySource(models.TextChoices):
    OIDC = "oidc", "OpenID Connect"
    LDAP = "ldap", "LDAP"


class DirectoryAccount(models.Model):
    """A person who signs in through the company's directory: which one (``source``), who they are there
    (``subject``: OIDC's ``sub``, LDAP's DN), and the directory's groups they were in at their last sign-in. An
    account made by hand is never taken over by a directory's sign-in: a directory's person gets their own."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="directory_account")
    source = models.CharField(max_length=4, choices=DirectorySource.choices)
    subject = models.CharField(max_length=500)
    directory_groups = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["source", "subject"], name="directory_account_unique")]

    def __str__(self) -> str:
        return f"{self.source}:{self.subject}"
