"""A real OpenID Provider on loopback for the tests that sign in with OpenID Connect.

It is panva's ``oidc-provider`` (``tests/oidc/provider.mjs``, pinned in
``tests/oidc/package-lock.json``; ``scripts/test.sh`` runs ``npm ci`` for it), with one
confidential client, the accounts a test names and signing keys the test owns, so a test
can rotate them, swap the key behind a ``kid`` or run the provider's clock fast or slow::

    with OpenIDProvider(tmp_path, redirect_uri=f"{app_url}/signin/oidc/callback") as op:
        back = op.sign_in(browser, authorization_url, "ann")  # …/callback?code=…&state=…

A missing Node.js, ``faketime`` or ``npm ci`` fails the test that needs them: the
provider is part of the test command's set-up, never an optional extra.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from helpers import free_port
from joserfc.jwk import RSAKey

#: The provider's script and its ``node_modules`` (``npm ci --prefix tests/oidc``).
PROVIDER_DIR = Path(__file__).with_name("oidc")
PROVIDER_SCRIPT = PROVIDER_DIR / "provider.mjs"
#: A path the relying party is sent back to when a test names none of its own.
DEFAULT_REDIRECT_URI = "http://127.0.0.1:8000/signin/oidc/callback"


@dataclass(frozen=True, slots=True)
class Account:
    """A person who can sign in at the provider; every field lands in the ID token
    (``name`` and ``preferred_username`` with scope ``profile``, ``email`` with
    ``email``, ``groups`` with ``groups``)."""

    name: str
    preferred_username: str
    email: str
    groups: tuple[str, ...] = ()


#: Who can sign in by default, by login: an approver, a viewer and someone in no group.
DEFAULT_ACCOUNTS: Mapping[str, Account] = {
    "ann": Account("Ann Approver", "ann", "ann@example.com", ("approvers",)),
    "vic": Account("Vic Viewer", "vic", "vic@example.com", ("viewers",)),
    "nora": Account("Nora Nogroup", "nora", "nora@example.com"),
}


class LoginRefused(AssertionError):
    """The provider's login form turned the login down; ``str()`` is what it said."""


def new_key(kid: str) -> dict[str, Any]:
    """A fresh RS256 signing key as a private JWK under ``kid``."""
    key = RSAKey.generate_key(
        2048, parameters={"kid": kid, "alg": "RS256", "use": "sig"}, private=True
    )
    return dict(key.as_dict(private=True))


class OpenIDProvider:
    """One ``provider.mjs`` process on a loopback port that stays the same across
    restarts, so the issuer a relying party was given stays right; its output goes to
    ``workdir/openid-provider.log``.

    ``clock_offset_seconds`` runs the provider under ``faketime`` with its wall clock
    shifted (``-7200``: every ID token it issues has already expired for a relying party
    whose clock is right); its timers run on the real monotonic clock.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        accounts: Mapping[str, Account] = DEFAULT_ACCOUNTS,
        client_id: str = "localui",
        redirect_uri: str | Sequence[str] = DEFAULT_REDIRECT_URI,
        id_token_ttl: int = 3600,
        clock_offset_seconds: int = 0,
        keys: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = free_port() if port is None else port
        self.accounts = dict(accounts)
        self.redirect_uris = (
            (redirect_uri,) if isinstance(redirect_uri, str) else tuple(redirect_uri)
        )
        self.id_token_ttl = id_token_ttl
        self.clock_offset_seconds = clock_offset_seconds
        self._keys = [dict(key) for key in keys] if keys else [new_key("key-1")]
        self._client_id = client_id
        self._client_secret = secrets.token_urlsafe(32)
        workdir.mkdir(parents=True, exist_ok=True)
        self._client_secret_file = workdir / "openid-client-secret"
        self._client_secret_file.touch(mode=0o600)
        self._client_secret_file.chmod(0o600)
        self._client_secret_file.write_text(self._client_secret + "\n")
        self.log = workdir / "openid-provider.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def issuer(self) -> str:
        """The issuer URL, as discovery and every ID token name it."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def client_secret(self) -> str:
        return self._client_secret

    @property
    def client_secret_file(self) -> Path:
        """A file (mode 0600) holding the client secret and a newline, as a person
        would hand one to ``--oidc-client-secret-file``."""
        return self._client_secret_file

    @property
    def keys(self) -> list[dict[str, Any]]:
        """The private signing keys the provider runs with; the first signs."""
        return [dict(key) for key in self._keys]

    @property
    def jwks(self) -> dict[str, Any]:
        """The public JWK set the provider publishes at its ``jwks_uri``."""
        return {"keys": [RSAKey.import_key(key).as_dict(private=False) for key in self._keys]}

    def start(self, timeout: float = 30.0) -> Self:
        """Start the provider; back once its discovery document answers, a test failure
        with its output when it does not within ``timeout``."""
        if self._process is not None and self._process.poll() is None:
            raise RuntimeError("the OpenID Provider is already running")
        command = self._command()
        self._log_file = self.log.open("ab")
        self._process = subprocess.Popen(
            command,
            cwd=PROVIDER_DIR,
            env={**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1"},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # A group of its own: faketime runs Node.js as its child, and stop() ends both.
            start_new_session=True,
        )
        discovery = f"{self.issuer}/.well-known/openid-configuration"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._process.poll() is None:
            try:
                if httpx.get(discovery, timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        code = self.stop()
        pytest.fail(
            f"the OpenID Provider did not answer on {discovery} (exit code {code}):\n"
            f"{self.output()}",
            pytrace=False,
        )

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop it (SIGTERM, then SIGKILL after ``timeout``); its exit code, or None
        when it was not running."""
        process, self._process = self._process, None
        if process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return process.returncode

    def restart(
        self,
        *,
        keys: Sequence[Mapping[str, Any]] | None = None,
        clock_offset_seconds: int | None = None,
    ) -> Self:
        """Stop and start again on the same port, with other signing keys or another
        clock offset when given. Sessions at the provider do not survive it."""
        self.stop()
        if keys is not None:
            self._keys = [dict(key) for key in keys]
        if clock_offset_seconds is not None:
            self.clock_offset_seconds = clock_offset_seconds
        return self.start()

    def output(self) -> str:
        """Everything the provider printed, across restarts."""
        if self._log_file is not None:
            self._log_file.flush()
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def sign_in(
        self,
        client: httpx.Client,
        authorization_url: str,
        login: str,
        password: str = "any password",
    ) -> str:
        """Sign ``login`` in as a browser would: GET ``authorization_url`` (the
        provider's, or a relying party's page that redirects there), fill in the
        provider's login form and follow redirects until one points at a redirect URI
        of the client. That URL (``?code=…&state=…``, or ``?error=…`` when the provider
        refused the request) is returned without being requested, so the test decides
        what the relying party gets. The provider's cookies stay in ``client``.

        Raises :class:`LoginRefused` when the form turns the login down.
        """
        url = authorization_url
        response = client.get(url, follow_redirects=False)
        for _ in range(20):
            if response.is_redirect:
                url = urljoin(url, response.headers["location"])
                if self._is_redirect_uri(url):
                    return url
                response = client.get(url, follow_redirects=False)
                continue
            action = _login_form_action(response.text)
            if action is None:
                break
            refusal = _refusal(response.text)
            if refusal is not None:
                raise LoginRefused(refusal)
            url = urljoin(url, action)
            response = client.post(
                url, data={"login": login, "password": password}, follow_redirects=False
            )
        raise AssertionError(
            f"signing {login!r} in stopped at {url} ({response.status_code}):\n"
            f"{response.text[:2000]}\n--- provider output ---\n{self.output()[-4000:]}"
        )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _is_redirect_uri(self, url: str) -> bool:
        target = urlsplit(url)._replace(query="", fragment="").geturl()
        return target in self.redirect_uris

    def _config(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "issuer": self.issuer,
            "client": {
                "client_id": self._client_id,
                "client_secret": self._client_secret,
                "redirect_uris": list(self.redirect_uris),
            },
            "keys": self._keys,
            "accounts": {
                login: {**asdict(account), "groups": list(account.groups)}
                for login, account in self.accounts.items()
            },
            "id_token_ttl": self.id_token_ttl,
            "parent_pid": os.getpid(),
        }

    def _command(self) -> list[str]:
        node = shutil.which("node")
        if node is None:
            pytest.fail("Node.js is not installed: the OpenID Provider needs it", pytrace=False)
        if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
            pytest.fail(
                f"oidc-provider is not installed: run `npm ci --prefix {PROVIDER_DIR}` "
                "(scripts/test.sh does)",
                pytrace=False,
            )
        command = [node, str(PROVIDER_SCRIPT), json.dumps(self._config())]
        if self.clock_offset_seconds == 0:
            return command
        faketime = shutil.which("faketime")
        if faketime is None:
            pytest.fail(
                "faketime is not installed (Debian's faketime; scripts/setup.sh installs it)",
                pytrace=False,
            )
        # -m: libfaketime's build for threaded programs, as Node.js is.
        return [faketime, "-m", "-f", f"{self.clock_offset_seconds:+d}s", *command]


_FORM = re.compile(r'<form method="post" action="([^"]+)"')
_REFUSAL = re.compile(r'<p role="alert" class="refusal">([^<]*)</p>')


def _login_form_action(page: str) -> str | None:
    found = _FORM.search(page)
    return html.unescape(found.group(1)) if found else None


def _refusal(page: str) -> str | None:
    found = _REFUSAL.search(page)
    return html.unescape(found.group(1)) if found else None
