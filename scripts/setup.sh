# shellcheck shell=bash
# Set-up shared by scripts/test.sh and scripts/demo.sh. Source it from the repo
# root; it defines functions and changes nothing until one is called.
#
# Every step checks before it acts, so a second run on a ready machine costs
# well under a second, and a fresh clone on a new Debian machine gets all it
# needs from the package registries.

# The venv install is redone only when its inputs change: pyproject.toml (the
# dependencies), the interpreter, or where this checkout lives (an editable
# install points at one path).
_venv_stamp() {
    {
        sha256sum pyproject.toml
        .venv/bin/python -c 'import sys; print(sys.version)'
        pwd -P
    } | sha256sum | cut -d' ' -f1
}

# .venv with the package installed editable, with its test and postgres extras.
ensure_venv() {
    local python=${PYTHON:-python3}
    if ! .venv/bin/python -c '' 2>/dev/null; then
        echo "setup: creating .venv with $($python --version 2>&1)" >&2
        rm -rf .venv
        "$python" -m venv .venv
    fi
    local stamp_file=.venv/.localui-install-stamp
    local stamp
    stamp=$(_venv_stamp)
    if [[ -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; then
        return 0
    fi
    echo "setup: pip install -e '.[test,postgres]' into .venv" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,postgres]'
    echo "$stamp" >"$stamp_file"
}

# The lowest fastaiagent pyproject.toml declares (the N of "fastaiagent>=N,<2").
sdk_floor() {
    sed -n 's/.*"fastaiagent>=\([0-9.]*\),.*/\1/p' pyproject.toml
}

# .venv-floor: the project, its test and postgres extras, and fastaiagent pinned to the
# declared floor in the same install, so nothing pulls it up. Redone only when its
# inputs change, like .venv.
ensure_floor_venv() {
    local python=${PYTHON:-python3} floor
    floor=$(sdk_floor)
    if ! .venv-floor/bin/python -c '' 2>/dev/null; then
        echo "setup: creating .venv-floor with $($python --version 2>&1)" >&2
        rm -rf .venv-floor
        "$python" -m venv .venv-floor
    fi
    local stamp_file=.venv-floor/.localui-install-stamp
    local stamp
    stamp=$({
        sha256sum pyproject.toml
        .venv-floor/bin/python -c 'import sys; print(sys.version)'
        pwd -P
    } | sha256sum | cut -d' ' -f1)
    if [[ -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; then
        return 0
    fi
    echo "setup: pip install fastaiagent==$floor and -e '.[test,postgres]' into .venv-floor" >&2
    .venv-floor/bin/python -m pip install --quiet --disable-pip-version-check \
        "fastaiagent==$floor" -e '.[test,postgres]'
    echo "$stamp" >"$stamp_file"
}

# apt-get install the named Debian packages, as root or through sudo.
apt_install() {
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        command -v sudo >/dev/null || {
            echo "setup: need root (or sudo) to apt-get install $*" >&2
            return 1
        }
        sudo=(sudo)
    fi
    echo "setup: apt-get install $*" >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

# The newest PostgreSQL server binaries directory, or nothing.
postgres_bin_dir() {
    local initdb
    initdb=$(compgen -G '/usr/lib/postgresql/*/bin/initdb' | sort -V | tail -n 1 || true)
    [[ -n $initdb ]] && dirname "$initdb"
}

# Debian's Chromium (browser tests), PostgreSQL server (backend tests), HAProxy
# (replicas behind a load balancer) and faketime (an OpenID Provider whose clock is
# off), in one apt transaction, only when missing.
ensure_system_packages() {
    local missing=()
    [[ -x /usr/bin/chromium ]] || missing+=(chromium)
    postgres_bin_dir >/dev/null || missing+=(postgresql)
    [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
    [[ -x /usr/bin/faketime ]] || missing+=(faketime)
    if ((${#missing[@]})); then
        apt_install "${missing[@]}"
    fi
}

# The OpenID Provider the sign-in tests start (tests/oidc: panva's oidc-provider),
# installed from its lock file with `npm ci` when node_modules is missing or older
# than the lock. Node.js 20.19 or later comes with the machine: Debian's is too old.
ensure_oidc_provider() {
    local dir=tests/oidc
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "setup: the tests' OpenID Provider needs Node.js (20.19 or later) and npm" >&2
        return 1
    fi
    if [[ -f $dir/node_modules/.package-lock.json &&
        ! $dir/package-lock.json -nt $dir/node_modules/.package-lock.json ]]; then
        return 0
    fi
    echo "setup: npm ci --prefix $dir" >&2
    local log
    log=$(mktemp)
    if ! npm ci --prefix "$dir" --no-audit --no-fund >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}
