#!/usr/bin/env bash
# The demo: seed a fresh store with real runs of every kind and serve it on
# loopback. Arguments go to `localui demo` (try --help); set-up is as for the
# tests, minus the browser and the database server.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh

ensure_venv
exec .venv/bin/localui demo "$@"
