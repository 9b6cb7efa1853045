#!/usr/bin/env bash
# The README's screenshots: docs/*.png, taken from a fresh `localui demo` in Debian's
# Chromium (the runs list, a run page, a diff, the approvals queue, the dark theme, a
# phone). Set-up is as for the tests; run it after a change to how a page looks.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh

ensure_venv
exec .venv/bin/python scripts/screenshots.py "$@"
