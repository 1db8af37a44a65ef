"""Make the README's pictures (desktop light and dark, phone) from the scripted session of the browser test
``test_a_working_session_for_the_readme``, into ``docs/``: they never go stale and show no machine's paths.

    .venv/bin/python -m testing.screenshots
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/browser/test_browser_chat.py::test_a_working_session_for_the_readme"


def main() -> None:
    docs = ROOT / "docs"
    env = {**os.environ, "CACHET_SCREENSHOTS_TO": str(docs)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", TEST], cwd=ROOT, env=env)
    if done.returncode:
        sys.exit(done.returncode)
    for name in ("screenshot.png", "screenshot-dark.png", "screenshot-phone.png"):
        print(docs / name)


if __name__ == "__main__":
    main()
