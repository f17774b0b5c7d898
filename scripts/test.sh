#!/usr/bin/env bash
# The README's test command: install into .venv (CPU torch from the local wheel), lint, type-check, test.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e '.[dev]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the files and level: pyproject.toml [tool.mypy]
.venv/bin/python -m pytest -q "$@"
