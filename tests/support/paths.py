"""Where the project's files are, for tests at any depth of tests/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"
PLUGINS = ROOT / "plugins"
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
SUPPORT = Path(__file__).resolve().parent
SCRIPTS = SUPPORT / "scripts"  # the ranks' training scripts
FIXTURES = SUPPORT / "plugin_fixtures"  # plugin modules, installed per test as fake distributions
