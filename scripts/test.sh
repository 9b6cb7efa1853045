#!/usr/bin/env bash
# The test command: set up what is missing, start a throwaway PostgreSQL, then
# lint, type-check and run every test. It stops at the first failing step and
# says which one failed.
#
#   bash scripts/test.sh                       # everything
#   bash scripts/test.sh -x -k verdict         # extra arguments go to both pytest runs
#   bash scripts/test.sh tests/test_store.py   # with a test path: one pytest run of just that
#
# Needs Debian with Python 3.11 and root (or sudo) the first time, to apt-get
# install Chromium and PostgreSQL; after that a run starts in about a second.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh

export PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONUNBUFFERED=1

PG_DIR=""
PG_BIN=""
CURRENT_STEP=""
STEP_STARTED=""
SUMMARY=()

# Seconds since $1 (an $EPOCHREALTIME), with one decimal.
elapsed_since() {
    local micros=$((${EPOCHREALTIME/./} - ${1/./}))
    printf '%d.%01d s' $((micros / 1000000)) $((micros % 1000000 / 100000))
}

# step NAME COMMAND...: run one step under `set -e`; on_exit names it if it fails.
step() {
    CURRENT_STEP=$1
    shift
    printf '\n==> %s\n' "$CURRENT_STEP"
    STEP_STARTED=$EPOCHREALTIME
    "$@"
    local took
    took=$(elapsed_since "$STEP_STARTED")
    printf '==> %s: ok (%s)\n' "$CURRENT_STEP" "$took"
    SUMMARY+=("$(printf '%-28s %s' "$CURRENT_STEP" "$took")")
    CURRENT_STEP=""
}

# Run as the postgres user: the server refuses to run as root. From its own
# directory, so the user need not be able to read this checkout.
as_postgres() {
    if [[ $(id -u) == 0 ]]; then
        (cd "$PG_DIR" && runuser -u postgres -- "$@")
    else
        (cd "$PG_DIR" && "$@")
    fi
}

free_port() {
    .venv/bin/python -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# A temp dir the postgres user owns and can reach. /tmp can be closed to other
# users (mode 0700, as on this workplace's machines): then try the next place.
make_postgres_dir() {
    local base
    for base in "${TMPDIR:-/tmp}" /var/tmp /dev/shm; do
        [[ -d $base ]] || continue
        PG_DIR=$(mktemp -d "$base/localui-pg.XXXXXX")
        if [[ $(id -u) != 0 ]]; then
            return 0
        fi
        chown postgres: "$PG_DIR"
        if runuser -u postgres -- test -w "$PG_DIR"; then
            return 0
        fi
        rmdir "$PG_DIR"
        PG_DIR=""
    done
    echo "no temp dir the postgres user can reach (tried \$TMPDIR, /tmp, /var/tmp, /dev/shm)" >&2
    return 1
}

# A cluster in a temp dir on a free loopback port, with a database for the
# tests in LOCALUI_TEST_PG_DSN. fsync is off: the cluster lives for one run.
start_postgres() {
    PG_BIN=$(postgres_bin_dir)
    make_postgres_dir
    if ! as_postgres "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres \
        --encoding=UTF8 --locale=C --no-sync >"$PG_DIR/initdb.log" 2>&1; then
        cat "$PG_DIR/initdb.log" >&2
        return 1
    fi
    # A port found free can be taken before the server binds it: try another.
    local port="" attempt
    for attempt in 1 2 3; do
        port=$(free_port)
        if as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
            -o "-p $port -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off" \
            start >/dev/null; then
            break
        fi
        echo "PostgreSQL did not start on port $port (attempt $attempt)" >&2
        port=""
    done
    if [[ -z $port ]]; then
        cat "$PG_DIR/server.log" >&2
        return 1
    fi
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres localui_test
    export LOCALUI_TEST_PG_DSN="postgresql://postgres@127.0.0.1:$port/localui_test"
    echo "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') at $LOCALUI_TEST_PG_DSN"
}

stop_postgres() {
    [[ -n $PG_DIR && -d $PG_DIR ]] || return 0
    if [[ -f $PG_DIR/data/postmaster.pid ]]; then
        as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$PG_DIR"
    PG_DIR=""
}

# The runs index files of the stores the tests make go to a cache of this run's own.
INDEX_CACHE=$(mktemp -d)
export XDG_CACHE_HOME=$INDEX_CACHE

on_exit() {
    local status=$?
    stop_postgres
    rm -rf "$INDEX_CACHE"
    if ((status != 0)); then
        printf '\ntest.sh: FAILED at step "%s" (exit %d)\n' "${CURRENT_STEP:-?}" "$status" >&2
    fi
}
trap on_exit EXIT
# Let Ctrl-C and a CI cancel run the EXIT trap too, so the cluster goes away.
trap 'exit 130' INT
trap 'exit 143' TERM

# True when an argument names a test path (tests/x.py, playwright_tests, a::node
# id); the value after -k, -m, -p, -o or -c is an expression, not a path.
names_a_test_path() {
    local arg previous=""
    for arg in "$@"; do
        case $previous in
            -k | -m | -p | -o | -c) previous=$arg && continue ;;
        esac
        if [[ $arg != -* && -e ${arg%%::*} ]]; then
            return 0
        fi
        previous=$arg
    done
    return 1
}

# pytest ARGS...: with extra arguments one run may select nothing (pytest's exit
# 5), say `-k sqlite` in the browser suite; without them that is a failure, and
# so is a filter that selects nothing in any run (checked at the end).
PYTEST_RAN_ANY=""
run_pytest() {
    local status=0
    .venv/bin/pytest "$@" || status=$?
    if ((status == 5 && ${#EXTRA_ARGS[@]})); then
        echo "(nothing selected here by: ${EXTRA_ARGS[*]})"
        return 0
    fi
    PYTEST_RAN_ANY=yes
    return "$status"
}

# The subset marked `floor` (reads, an approval, a resume, the demo seeding, the
# predictions) on the lowest SDK the project declares, after checking it is that one.
run_floor_tests() {
    local floor installed
    floor=$(sdk_floor)
    installed=$(.venv-floor/bin/python -c 'from importlib.metadata import version
print(version("fastaiagent"))')
    if [[ $installed != "$floor" ]]; then
        echo ".venv-floor has fastaiagent $installed, not the declared floor $floor" >&2
        return 1
    fi
    local status=0
    .venv-floor/bin/pytest -m floor tests "$@" || status=$?
    if ((status == 5 && ${#EXTRA_ARGS[@]})); then
        echo "(nothing selected here by: ${EXTRA_ARGS[*]})"
        return 0
    fi
    return "$status"
}

no_test_selected() {
    echo "no test matched: ${EXTRA_ARGS[*]}" >&2
    return 5
}

EXTRA_ARGS=("$@")

# The full runs spread test files over worker processes (pytest-xdist): most tests
# wait on servers, child processes and receivers rather than the CPU, so three
# workers on two cores take about half the time of one. A file stays on one worker,
# so its module fixtures (a bench run, a seeded store) are made once and its tests
# keep their order. A test past its time limit ends its worker (pyproject.toml's
# timeout_method); the worker is not replaced, since a replacement would be handed the
# same file and run that test again. LOCALUI_TEST_WORKERS=0 runs everything in this
# process.
WORKERS=${LOCALUI_TEST_WORKERS:-3}
PARALLEL=(-n "$WORKERS" --dist loadfile --max-worker-restart=0 --durations=15)

step "set up .venv" ensure_venv
step "install Chromium, PostgreSQL, HAProxy, faketime" ensure_system_packages
step "npm ci tests/oidc" ensure_oidc_provider
step "start PostgreSQL" start_postgres
step "ruff check" .venv/bin/ruff check localui bench tests playwright_tests examples
step "ruff format --check" .venv/bin/ruff format --check localui bench tests playwright_tests examples
step "mypy localui bench" .venv/bin/mypy localui bench
step "lint-imports" .venv/bin/lint-imports --no-cache
if ((${#EXTRA_ARGS[@]})) && names_a_test_path "${EXTRA_ARGS[@]}"; then
    step "pytest ${EXTRA_ARGS[*]}" run_pytest "${EXTRA_ARGS[@]}"
else
    step "pytest tests" run_pytest "${PARALLEL[@]}" tests "${EXTRA_ARGS[@]}"
    step "pytest playwright_tests" run_pytest "${PARALLEL[@]}" playwright_tests "${EXTRA_ARGS[@]}"
    step "set up .venv-floor (fastaiagent $(sdk_floor))" ensure_floor_venv
    step "pytest -m floor on fastaiagent $(sdk_floor)" run_floor_tests "${PARALLEL[@]}" "${EXTRA_ARGS[@]}"
fi
if [[ -z $PYTEST_RAN_ANY ]]; then
    step "pytest selected a test" no_test_selected
fi

printf '\ntest.sh: all steps passed\n'
printf '  %s\n' "${SUMMARY[@]}"
