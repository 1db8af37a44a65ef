"""The colour pairs text is drawn in meet WCAG AA (4.5:1 for text under 18 px) in both themes: read from
``cachet.css``'s own variables, so a colour changed there is checked here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSS = Path(__file__).resolve().parents[2] / "static" / "cachet" / "cachet.css"
PAIRS = [  # text colour, background it is drawn on
    ("--fg", "--bg"),
    ("--fg", "--soft"),
    ("--muted", "--bg"),
    ("--muted", "--soft"),
    ("--muted", "--code-inline"),  # turn labels and small print on grey
    ("--muted", "--bar-hover"),
    ("--note-fg", "--note-bg"),
    ("--info-fg", "--info-bg"),
    ("--warn-fg", "--warn-bg"),
    ("--error-fg", "--error-bg"),
    ("--danger", "--bg"),
    ("--ttft", "--bg"),  # the time axis's labels
]


def _colours() -> dict[str, tuple[str, str]]:
    found = re.findall(r"(--[\w-]+): light-dark\((#[0-9a-f]{3,6}), (#[0-9a-f]{3,6})\)", CSS.read_text())
    return {name: (light, dark) for name, light, dark in found}


def _luminance(colour: str) -> float:
    digits = colour.lstrip("#")
    if len(digits) == 3:
        digits = "".join(2 * digit for digit in digits)
    channels = [int(digits[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_contrast_is_computed_as_wcag_says() -> None:
    assert round(contrast("#000", "#fff"), 1) == 21.0
    assert round(contrast("#6b7280", "#f3f4f6"), 2) == 4.39  # the turn labels' grey before


@pytest.mark.parametrize(("text", "background"), PAIRS)
@pytest.mark.parametrize("theme", [0, 1], ids=["light", "dark"])
def test_text_colours_meet_aa_on_their_backgrounds(text: str, background: str, theme: int) -> None:
    colours = _colours()
    ratio = contrast(colours[text][theme], colours[background][theme])
    assert ratio >= 4.5, f"{text} on {background}: {ratio:.2f}:1"
