"""Who is asking: sign-in by token, sessions, a trusted proxy, and roles.

Sign-in works the way local notebook servers do it: the server makes a token at
start and prints a link carrying it; opening the link sets a signed session
cookie and redirects to the same URL without the token. People added with
``localui users add`` get links of their own (``localui.backends.users``). Scripts send
either token as ``Authorization: Bearer``. Teams behind their own single sign-on
put localui behind a proxy that names the person in a header, believed only from
the proxy's addresses (``--trusted-proxy``), as Grafana's auth proxy works.

Roles, least first: a *viewer* sees everything and changes nothing, an
*approver* also approves and rejects, an *operator* also resumes, forks and
prunes. This middleware refuses every unsafe method to a viewer; each action
checks its own role too (:func:`require`), so no route is left open by being
mounted where the middleware does not look.

Sessions are signed (``itsdangerous``) with the store's keys (``localui.keyring``), so
every localui process on the store accepts them, after a restart too, under one
cookie name. A session names its person, the token it was opened with and an id of
its own: a removed person, a reset token or a changed role is honoured within
:data:`CACHE_SECONDS`, and a session signed out on any process within about a second
(``localui.keyring.REFRESH_SECONDS``).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import ipaddress
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from localui.backends.base import UserDirectory
from localui.backends.users import check_name, token_hash
from localui.errors import BadRequest, Forbidden, LifespanNotRun, Unavailable
from localui.keyring import KeyRing
from localui.offloop import off_loop
from localui.records import User
from localui.roles import ROLES
from localui.settings import SignIn

VIEWER, APPROVER, OPERATOR = ROLES
#: How long a looked-up person is believed before the users table is asked again.
CACHE_SECONDS = 2.0
#: Clients whose bad tokens are remembered at once; the oldest are forgotten first.
THROTTLE_CLIENTS = 10_000
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SCOPE_KEY = "localui.person"
#: The query parameter of a sign-in link.
TOKEN_PARAM = "token"
#: Where a request that tried a token keeps how it went (a :class:`SigninAttempt`),
#: for the audit log (``localui.auditing``).
SIGNIN_KEY = "localui.signin"


@dataclass(frozen=True, slots=True)
class Person:
    """Who a request comes from. ``via``: ``owner`` (the start-up token), ``user``
    (a personal token), ``proxy`` (a trusted proxy's header), ``oidc`` (the team's
    OpenID Provider, ``localui.oidc``), or ``open`` (sign-in is off: everyone may do
    everything, and names their approver by hand)."""

    name: str
    role: str
    via: str
    #: The groups an approval policy's ``group:NAME`` matches (``localui.policy``).
    groups: tuple[str, ...] = ()
    #: Who decides for them while away, and until when, as the users table said
    #: (``localui.delegation``); empty for someone not in it, or a session of the
    #: OpenID Provider's, whose menu then offers the away form alone. Not part of who
    #: they are: going away neither ends their live streams nor tells a sign-in link
    #: apart from their session.
    away_to: str = field(default="", compare=False)
    away_until: str = field(default="", compare=False)

    @property
    def signed_in(self) -> bool:
        return self.via in ("owner", "user", "proxy", "oidc")

    @property
    def identified(self) -> bool:
        """Whether it is known who this is: signed in to the desk, or come by their own
        decision link (``localui.links``), which names them but signs them in nowhere."""
        return self.signed_in or self.via == "link"

    def may(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)

    @property
    def can_decide(self) -> bool:
        return self.may(APPROVER)

    @property
    def can_operate(self) -> bool:
        return self.may(OPERATOR)


@dataclass(frozen=True, slots=True)
class SigninAttempt:
    """A token tried: whom it signed in (None: nobody, or refused for too many bad
    tokens), and ``by`` a ``link``, a ``bearer`` header or the sign-in ``form``."""

    person: Person | None
    by: str


def user_person(user: User) -> Person:
    """A person of the users table, signed in with their token or its session."""
    return Person(user.name, user.role, "user", user.groups, user.away_to, user.away_until)


OPEN = Person(name="", role=OPERATOR, via="open")
#: A Prometheus scraper with the token of ``--metrics-token-file``: it may read
#: ``/metrics`` and nothing else.
SCRAPER = Person(name="metrics scraper", role=VIEWER, via="scraper")
METRICS_PATH = "/metrics"
#: Who a request that never passed the middleware is: someone who may only look.
NOBODY = Person(name="", role=VIEWER, via="none")


def person_of(request: Request) -> Person:
    person = request.scope.get(SCOPE_KEY)
    return person if isinstance(person, Person) else NOBODY


def require(request: Request, role: str) -> Person:
    """The person, when their role allows ``role``'s actions; else a 403 saying why."""
    person = person_of(request)
    if not person.may(role):
        who = f"{person.name} is" if person.name else "you are"
        raise Forbidden(
            f"{who} signed in as {person.role}: this needs {role}"
            + (" or operator" if role == APPROVER else "")
        )
    return person


def template_values(request: Request) -> dict[str, Any]:
    """What every page template knows about the person (a Jinja context processor)."""
    return {"person": person_of(request)}


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: tuple[str, ...]) -> tuple[Network, ...]:
    """``--trusted-proxy`` values as networks; a bad one is a :class:`BadRequest`."""
    networks: list[Network] = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError as exc:
            raise BadRequest(f"--trusted-proxy {value!r} is not an address or network") from exc
    return tuple(networks)


def client_address(scope: Scope) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The TCP peer's address (uvicorn runs without proxy headers, so it is the peer)."""
    client = scope.get("client")
    if not client:
        return None
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_loopback_client(scope: Scope) -> bool:
    address = client_address(scope)
    return address is not None and address.is_loopback


@dataclass(slots=True)
class _Failures:
    #: Bad tokens, and attempts still being looked up (counted as bad until they are not).
    count: int = 0
    last_at: float = 0.0
    locked_until: float = 0.0


class Throttle:
    """Bad tokens per client address, and from every address together. In memory, per
    process, bounded.

    Each attempt is counted *before* its token is looked up, under a lock, so a hundred
    attempts sent at once cannot all pass a check made before any of them was counted.
    A good token gives its own attempt back and clears nothing: good tokens in between
    buy bad ones no more tries. Past ``slow_after`` bad tokens an address's answers are
    slowed; at ``lock_after`` it is refused for ``lock_seconds``. IPv6 clients count by
    their /64, which one machine usually holds whole. All addresses together may send
    ``global_lock_after`` bad tokens in ``global_window`` seconds; past that every token
    is refused until the window moves on (sessions carry on), so spreading guesses over
    many addresses buys no more of them.

    Written here rather than with the ``limits`` package: the ladder (slower, then
    locked) and giving back an attempt that turned out good are not the fixed counts
    per window that ``limits`` keeps.
    """

    def __init__(self, policy: SignIn, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._lock = threading.Lock()
        self._by_client: OrderedDict[str, _Failures] = OrderedDict()
        #: When each recent bad token came, from any address, oldest first.
        self._recent: deque[float] = deque()
        #: Attempts from any address still being looked up.
        self._in_flight = 0

    def begin(self, client: str) -> None:
        """Count an attempt from ``client`` before its token is looked up; raises
        :class:`Locked` when that address, or everyone, may try no more for now."""
        with self._lock:
            now = self.clock()
            window = self.policy.global_window
            while self._recent and self._recent[0] <= now - window:
                self._recent.popleft()
            if len(self._recent) + self._in_flight >= self.policy.global_lock_after:
                waited = self._recent[0] + window - now if self._recent else 1.0
                raise Locked(max(waited, 1.0), everyone=True)
            record = self._by_client.pop(client, None)
            if record is not None and record.locked_until <= now:
                if now - record.last_at > self.policy.lock_seconds and record.count > 0:
                    record = None  # a quiet while forgives the old failures
            record = record or _Failures(last_at=now)
            self._by_client[client] = record
            while len(self._by_client) > THROTTLE_CLIENTS:
                self._by_client.popitem(last=False)
            if record.locked_until > now:
                raise Locked(record.locked_until - now)
            if record.count >= self.policy.lock_after:
                # Attempts still in flight fill the allowance: refused until they end.
                raise Locked(1.0)
            record.count += 1
            record.last_at = now
            self._in_flight += 1

    def failed(self, client: str) -> float:
        """The attempt ``begin`` counted was a bad token; the seconds to wait before
        answering it."""
        with self._lock:
            now = self.clock()
            self._in_flight -= 1
            self._recent.append(now)
            record = self._by_client.get(client)
            if record is None:  # forgotten among more clients than are remembered
                return 0.0
            if record.count >= self.policy.lock_after:
                record.locked_until = now + self.policy.lock_seconds
            extra = record.count - self.policy.slow_after
            return min(self.policy.slow_seconds * extra, 5.0) if extra > 0 else 0.0

    def succeeded(self, client: str) -> None:
        """The attempt was a good token, or could not be looked up: it is given back."""
        with self._lock:
            self._in_flight -= 1
            record = self._by_client.get(client)
            if record is not None and record.count > 0:
                record.count -= 1

    def locked_for(self, client: str) -> float:
        """Seconds this client is still refused for; 0 when it is not."""
        with self._lock:
            record = self._by_client.get(client)
            return max(0.0, record.locked_until - self.clock()) if record is not None else 0.0


class Locked(Exception):
    def __init__(self, seconds: float, *, everyone: bool = False) -> None:
        where = "from many addresses" if everyone else "from this address"
        super().__init__(f"too many bad tokens {where}: try again in {seconds:.0f} s")
        self.seconds = seconds


class Authenticator:
    """Tokens, sessions and the proxy header for one app; made by ``create_app``."""

    def __init__(
        self, policy: SignIn, *, port: int, token: str, keys: KeyRing | None = None
    ) -> None:
        self.policy = policy
        self.token = token
        self._owner_digest = token_hash(token)
        self.keys = keys if keys is not None else KeyRing()
        self._port = port
        #: The serializer of the keys it was made with (made again when they change).
        self._signing: tuple[tuple[bytes, ...], URLSafeTimedSerializer] | None = None
        self.throttle = Throttle(policy)
        self.trusted = parse_networks(policy.trusted_proxies)
        self.users: UserDirectory | None = None
        #: The Bearer token a Prometheus scraper reads ``/metrics`` with
        #: (``--metrics-token-file``); empty when there is none.
        self.scraper_token = ""
        #: (kind, key) -> (when the users table was asked, what it said).
        self._cache: OrderedDict[tuple[str, str], tuple[float, User | None]] = OrderedDict()
        self._sessions: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    # --- the users table, read through a short cache -----------------------------

    async def _lookup(self, kind: str, key: str, since: float = 0.0) -> User | None:
        """The person a token hash or name is, as the users table said at most
        :data:`CACHE_SECONDS` ago and no earlier than ``since`` (a monotonic time)."""
        users = self.users
        if users is None:
            return None
        now = time.monotonic()
        cached = self._cache.get((kind, key))
        if cached is not None and now - cached[0] < CACHE_SECONDS and cached[0] >= since:
            return cached[1]
        find = users.by_token_hash if kind == "token" else users.by_name
        user = await off_loop(find, key)
        self._cache[(kind, key)] = (now, user)
        while len(self._cache) > 1000:
            self._cache.popitem(last=False)
        return user

    def forget(self, name: str) -> None:
        """Ask the users table about ``name`` again on their next request: a change this
        process made of them (their away, from their own menu) shows on the next page."""
        for key, (_, user) in list(self._cache.items()):
            if key == ("name", name) or (user is not None and user.name == name):
                self._cache.pop(key, None)

    async def user_named(self, name: str) -> User | None:
        """The person of this name, as the users table said at most
        :data:`CACHE_SECONDS` ago (a decision link names its person)."""
        return await self._lookup("name", name)

    # --- tokens --------------------------------------------------------------------

    async def person_for_token(self, token: str, since: float = 0.0) -> tuple[Person, str] | None:
        """The person a token signs in, with the mark their session keeps."""
        digest = token_hash(token)
        # Constant time against the start-up token; a user's is found by the hash of
        # what was sent, which tells a timing observer nothing about any real token.
        if hmac.compare_digest(digest, self._owner_digest):
            return Person(name=self.policy.owner, role=OPERATOR, via="owner"), digest[:16]
        if len(token) > 200:
            return None
        user = await self._lookup("token", digest, since)
        if user is None or user.role not in ROLES:
            return None
        return user_person(user), user.token_mark

    async def check_token(self, token: str, client: str) -> tuple[Person, str] | None:
        """``person_for_token`` with the throttle around it: raises :class:`Locked`."""
        self.throttle.begin(client)
        try:
            found = await self.person_for_token(token)
        except BaseException:
            self.throttle.succeeded(client)  # not answered (the users table is down)
            raise
        if found is None:
            delay = self.throttle.failed(client)
            if delay:
                await asyncio.sleep(delay)
            locked = self.throttle.locked_for(client)
            if locked:
                raise Locked(locked)
            return None
        self.throttle.succeeded(client)
        return found

    # --- sessions ------------------------------------------------------------------

    async def person_now(self, scope: Scope, since: float) -> Person | None:
        """Who a request that is still being answered (a live stream) comes from now,
        as the users table says no earlier than ``since``: None once they were removed
        or their token reset. Many streams asking after one change share one look-up."""
        if not self.policy.required:
            return OPEN
        person = await self.person_from_proxy(scope, since)
        if person is not None:
            return person
        authorization = _header(scope, b"authorization") or ""
        if authorization[:7].lower() == "bearer ":
            found = await self.person_for_token(authorization[7:].strip(), since)
            return found[0] if found is not None else None
        cookie = _cookie(_header(scope, b"cookie") or "", self.cookie_name(scope))
        return await self.person_for_session(cookie, since) if cookie is not None else None

    @property
    def cookie(self) -> str:
        """The session cookie's name without its TLS prefix: the store's on a store
        that keeps keys (every process on it uses the one name, as a load balancer
        shows one origin), else this port's (cookies do not tell ports apart)."""
        return f"localui_session_{self.keys.ring or self._port}"

    def _serializer(self) -> URLSafeTimedSerializer:
        secrets_now = self.keys.secrets()
        if self._signing is None or self._signing[0] != secrets_now:
            # A list of keys: itsdangerous signs with the last and accepts any of them.
            serializer = URLSafeTimedSerializer(list(secrets_now), salt="localui-session")
            self._signing = (secrets_now, serializer)
        return self._signing[1]

    def session_value(self, person: Person, mark: str) -> str:
        data: dict[str, Any] = {
            "n": person.name,
            "v": person.via,
            "m": mark,
            "s": secrets.token_urlsafe(12),
        }
        if person.via == "oidc":
            # The provider is not asked again while the session lasts: its role and
            # groups as they were at sign-in travel with it.
            data.update(r=person.role, g=list(person.groups))
        return self._serializer().dumps(data)

    def _session_data(self, value: str) -> Any:
        """The signed payload of a session cookie, or None; a cookie checked in the last
        :data:`CACHE_SECONDS` is not checked again (its HMAC is most of a session's cost)."""
        now = time.monotonic()
        cached = self._sessions.get(value)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            data = self._serializer().loads(value, max_age=self.policy.session_seconds)
        except BadSignature:
            data = None
        self._sessions[value] = (now + CACHE_SECONDS, data)
        while len(self._sessions) > 1000:
            self._sessions.popitem(last=False)
        return data

    async def person_for_session(self, value: str, since: float = 0.0) -> Person | None:
        await self.keys.fresh()
        data = self._session_data(value)
        if data is None and await self.keys.fresh(soon=True):
            # Perhaps signed by another process with a key made since they were read.
            self._sessions.pop(value, None)
            data = self._session_data(value)
        if not isinstance(data, dict) or self.keys.ended(data.get("s")):
            return None
        name, via, mark = data.get("n"), data.get("v"), data.get("m")
        if not isinstance(name, str) or not isinstance(mark, str):
            return None
        if via == "owner":
            if not hmac.compare_digest(mark, self._owner_digest[:16]):
                return None
            return Person(name=self.policy.owner, role=OPERATOR, via="owner")
        if via == "user":
            user = await self._lookup("name", name, since)
            if user is None or user.role not in ROLES:
                return None
            if not hmac.compare_digest(mark, user.token_mark):
                return None  # the token was reset: sessions opened with the old one end
            return user_person(user)
        if via == "oidc" and self.policy.oidc is not None:
            role, groups = data.get("r"), data.get("g")
            if role not in ROLES or not isinstance(groups, list):
                return None
            return Person(name, str(role), "oidc", tuple(str(g) for g in groups))
        return None

    async def session_person(self, scope: Scope) -> Person | None:
        """Who this browser is signed in to the desk as, or None: for a page the sign-in
        middleware leaves open (a decision link's), which must not mistake one person's
        link for another's session."""
        if not self.policy.required:
            return None
        value = _cookie(_header(scope, b"cookie") or "", self.cookie_name(scope))
        return await self.person_for_session(value) if value is not None else None

    def cookie_name(self, scope: Scope) -> str:
        """The session cookie's name: over TLS with the ``__Host-`` prefix, which the
        browser keeps only from a secure page of this very host, for the whole of it,
        so no other name or plain-HTTP page of it can set or overwrite it."""
        return f"__Host-{self.cookie}" if self.over_tls(scope) else self.cookie

    def set_session(self, response: Response, scope: Scope, person: Person, mark: str) -> None:
        # Lax, not Strict: a sign-in link opened from mail or chat is a navigation from
        # another site, which a Strict cookie is never sent with, not even after the
        # redirect or on reload. Lax lets that link sign in, and every cross-site GET
        # changes nothing here; every change is a POST, which GuardMiddleware refuses
        # cross-site by Sec-Fetch-Site or Origin, whatever cookie comes with it.
        tls = self.over_tls(scope)
        response.set_cookie(
            self.cookie_name(scope),
            self.session_value(person, mark),
            max_age=self.policy.session_seconds,
            path="/" if tls else (scope.get("root_path") or "/"),
            httponly=True,
            samesite="lax",
            secure=tls,
        )

    async def end_session(self, value: str) -> None:
        """Sign a session out for every process on the store (its cookie is cleared
        by :meth:`clear_session`; a copy of it kept elsewhere stops working too)."""
        data = self._session_data(value)
        if isinstance(data, dict) and isinstance(data.get("s"), str):
            await self.keys.end(data["s"], time.time() + self.policy.session_seconds)

    def clear_session(self, response: Response, scope: Scope) -> None:
        tls = self.over_tls(scope)
        response.delete_cookie(
            self.cookie_name(scope),
            path="/" if tls else (scope.get("root_path") or "/"),
            httponly=True,
            samesite="lax",
            secure=tls,
        )

    def over_tls(self, scope: Scope) -> bool:
        if scope.get("scheme") == "https":
            return True
        if self.from_trusted_proxy(scope):
            proto = _header(scope, b"x-forwarded-proto")
            return proto is not None and proto.strip().lower() == "https"
        return False

    # --- the trusted proxy ---------------------------------------------------------

    def from_trusted_proxy(self, scope: Scope) -> bool:
        address = client_address(scope)
        return address is not None and any(address in net for net in self.trusted)

    async def person_from_proxy(self, scope: Scope, since: float = 0.0) -> Person | None:
        """The person a trusted proxy names; None when there is no such header, or it
        came from an address that is not a trusted proxy."""
        header = self.policy.proxy_user_header
        if not header or not self.from_trusted_proxy(scope):
            return None
        value = _header(scope, header.lower().encode("latin-1"))
        if value is None:
            return None
        try:
            name = check_name(value)
        except BadRequest:
            return None
        role = ""
        if self.policy.proxy_role_header:
            role = (
                (_header(scope, self.policy.proxy_role_header.lower().encode("latin-1")) or "")
                .strip()
                .lower()
            )
        groups_header = self.policy.proxy_groups_header
        sent = _header(scope, groups_header.lower().encode("latin-1")) if groups_header else None
        groups = tuple(g.strip() for g in (sent or "").split(",") if g.strip())
        try:
            user = await self._lookup("name", name, since)
        except Unavailable:
            if role not in ROLES or sent is None:
                raise
            user = None  # the headers say all the sign-in needs; only the away is unknown
        if role not in ROLES:
            role = user.role if user is not None else self.policy.proxy_default_role
        if sent is None and user is not None:
            groups = user.groups
        away = (user.away_to, user.away_until) if user is not None else ("", "")
        return Person(name, role if role in ROLES else VIEWER, "proxy", groups, *away)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            # Proxies send UTF-8 names; ASGI hands over the bytes.
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return bytes(value).decode("latin-1")
    return None


def client_key(scope: Scope) -> str:
    """Whom the throttle counts a token attempt against: the client's address, or for
    IPv6 its /64, since one machine is usually given a whole /64 to pick from."""
    address = client_address(scope)
    if address is None:
        return "local"
    if isinstance(address, ipaddress.IPv6Address) and not address.is_loopback:
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _path(scope: Scope) -> str:
    path: str = scope.get("path", "/")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


#: What stays unescaped in a path this app redirects to: RFC 3986's path characters.
#: A backslash, space or control character is escaped, so no browser reads a host in it
#: (Chromium takes ``/\host`` for ``//host``, and drops tabs and newlines from a URL).
_PATH_CHARACTERS = "/!$&'()*+,;=:@-._~"


def app_path(root_path: str, path: str, *, escaped: bool = False) -> str:
    """``path`` as a path of this app: under ``root_path``, escaped, with every run of
    slashes made one, so a redirect to it never leaves this server (``//host`` and
    ``///host`` name another host to a browser). ``escaped``: ``path`` is already
    percent-encoded (a URL's), not decoded (an ASGI scope's)."""
    quoted = quote(path, safe=_PATH_CHARACTERS + ("%" if escaped else ""))
    return root_path.rstrip("/") + _SLASHES.sub("/", "/" + quoted)


_SLASHES = re.compile(r"/{2,}")


def without_token(scope: Scope) -> str:
    """The URL being asked for, minus the token: where a sign-in link redirects to."""
    query = scope.get("query_string", b"").decode("latin-1")
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != TOKEN_PARAM]
    url = app_path(scope.get("root_path", ""), _path(scope))
    return url + (f"?{urlencode(kept)}" if kept else "")


def safe_next(value: str, root_path: str) -> str:
    """A path of this app under ``root_path`` to go to after signing in; anything else
    (another host, a scheme, a path outside the root) goes to the runs."""
    home = (root_path or "") + "/"
    if not value.startswith("/") or value.startswith("//") or "\\" in value:
        return home
    parts = urlsplit(value)  # drops tabs and newlines, as browsers do
    if parts.scheme or parts.netloc:
        return home
    path = app_path("", parts.path, escaped=True)
    if root_path and not (path == root_path or path.startswith(root_path.rstrip("/") + "/")):
        return home
    query = quote(parts.query, safe="=&%+/?:@!$'()*,;-._~")
    return path + (f"?{query}" if query else "")


def wants_json(scope: Scope, headers: dict[str, str]) -> bool:
    accept = headers.get("accept", "")
    if _path(scope).endswith(".json"):
        return True
    return "application/json" in accept and "text/html" not in accept


SigninPage = Callable[[Scope, str, int], Response]
#: The page a sign-in link for someone else answers to a browser already signed in:
#: scope, who is signed in, whom the link signs in, the link's token.
SwitchPage = Callable[[Scope, Person, Person, str], Response]


class AuthMiddleware:
    """Puts a :class:`Person` on every request, or answers it without one.

    No session: the sign-in page for a browser (401), 401 JSON for scripts, and for
    htmx a 401 that reloads the page (``HX-Refresh``), which then shows the sign-in
    page; a live stream gets a plain 401, which the SSE extension backs off from.
    A users table that cannot be read is a 503 that says so.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: Authenticator,
        signin_page: SigninPage,
        switch_page: SwitchPage,
        public: tuple[str, ...],
    ) -> None:
        self.app = app
        self.auth = auth
        self.signin_page = signin_page
        self.switch_page = switch_page
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if getattr(scope["app"].state, "localui", None) is None:
            # Without the lifespan no session or person can be checked.
            raise LifespanNotRun()
        if not self.auth.policy.required:
            scope[SCOPE_KEY] = OPEN
            await self.app(scope, receive, send)
            return
        path = _path(scope)
        if path.startswith(self.public):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            answer = await self._answer(scope, headers, path)
        except Unavailable as exc:
            answer = self.unavailable(scope, headers, exc)
        if isinstance(answer, Person):
            await self._pass(scope, receive, send, answer, headers)
        elif answer is None:
            await self.app(scope, receive, send)  # the sign-in page, to someone signed out
        else:
            await answer(scope, receive, send)

    async def _answer(
        self, scope: Scope, headers: dict[str, str], path: str
    ) -> Person | Response | None:
        """Who asks, or the response that answers them instead (None: let the sign-in
        page answer). Raises :class:`Unavailable` when the users table cannot be read."""
        method = scope.get("method", "GET")
        client = client_key(scope)
        person = await self.auth.person_from_proxy(scope)
        if person is not None:
            return person
        authorization = headers.get("authorization", "")
        if path == METRICS_PATH and self._is_scraper(authorization):
            return SCRAPER
        if authorization[:7].lower() == "bearer ":
            try:
                found = await self.auth.check_token(authorization[7:].strip(), client)
            except Locked as exc:
                scope[SIGNIN_KEY] = SigninAttempt(None, "bearer")
                return self.locked(scope, headers, exc)
            if found is None:
                scope[SIGNIN_KEY] = SigninAttempt(None, "bearer")
                return self.refuse(scope, headers, 401, "That token is not valid.")
            return found[0]
        if method in ("GET", "HEAD"):
            token = _query_token(scope)
            if token is not None:
                return await self._link(scope, headers, token, client)
        cookie = _cookie(headers.get("cookie", ""), self.auth.cookie_name(scope))
        if cookie is not None:
            person = await self.auth.person_for_session(cookie)
        if person is not None:
            return person
        if path == "/signin" or path.startswith("/signin/oidc"):
            return None
        return self.unauthenticated(scope, headers, "Sign in to see this server.")

    def _is_scraper(self, authorization: str) -> bool:
        """Whether the header carries the scraper's token (compared in constant time)."""
        token = self.auth.scraper_token
        if not token or authorization[:7].lower() != "bearer ":
            return False
        return hmac.compare_digest(authorization[7:].strip().encode(), token.encode())

    async def _pass(
        self, scope: Scope, receive: Receive, send: Send, person: Person, headers: dict[str, str]
    ) -> None:
        changing_who = _path(scope) in ("/signin", "/signout")
        # Set before a refusal too: the audit log records whom it refused.
        scope[SCOPE_KEY] = person
        if scope.get("method", "GET") not in SAFE_METHODS and not person.can_decide:
            if not changing_who:
                message = f"{person.name} is signed in as a viewer: viewers change nothing."
                await self.refuse(scope, headers, 403, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _link(
        self, scope: Scope, headers: dict[str, str], token: str, client: str
    ) -> Response:
        try:
            found = await self.auth.check_token(token, client)
        except Locked as exc:
            scope[SIGNIN_KEY] = SigninAttempt(None, "link")
            return self.locked(scope, headers, exc)
        if found is None:
            scope[SIGNIN_KEY] = SigninAttempt(None, "link")
            message = "That sign-in link is not valid (or no longer is): ask for a new one."
            return self.unauthenticated(scope, headers, message)
        person, mark = found
        # The session cookie is Lax, so it comes with a link followed from another site:
        # a link for someone else never silently replaces who this browser is (login
        # CSRF would record the victim's next decisions under the other name).
        cookie = _cookie(headers.get("cookie", ""), self.auth.cookie_name(scope))
        current = await self.auth.person_for_session(cookie) if cookie is not None else None
        if current is not None and current != person:
            return self.switch_page(scope, current, person, token)
        response = RedirectResponse(without_token(scope), status_code=303)
        self.auth.set_session(response, scope, person, mark)
        scope[SIGNIN_KEY] = SigninAttempt(person, "link")
        return response

    def unavailable(self, scope: Scope, headers: dict[str, str], exc: Unavailable) -> Response:
        message = f"Sign-in cannot be checked right now: {exc} Try again shortly."
        if "text/event-stream" in headers.get("accept", ""):
            return Response(message, status_code=503, media_type="text/plain")
        if wants_json(scope, headers) or "authorization" in headers:
            body = {"error": {"status": 503, "title": "Sign-in", "message": message}}
            return JSONResponse(body, status_code=503)
        if headers.get("hx-request") == "true":
            return HTMLResponse(
                f"<p class='bad problem'>{html.escape(message)}</p>", status_code=503
            )
        return self.signin_page(scope, message, 503)

    def unauthenticated(self, scope: Scope, headers: dict[str, str], message: str) -> Response:
        if headers.get("hx-request") == "true":
            # The whole page reloads and shows the sign-in page in place of a fragment.
            return Response(message, status_code=401, headers={"HX-Refresh": "true"})
        if "text/event-stream" in headers.get("accept", "") or wants_json(scope, headers):
            return self.refuse(scope, headers, 401, message)
        return self.signin_page(scope, message, 401)

    def refuse(self, scope: Scope, headers: dict[str, str], status: int, message: str) -> Response:
        extra = {"WWW-Authenticate": 'Bearer realm="localui"'} if status == 401 else {}
        if wants_json(scope, headers) or "authorization" in headers:
            body = {"error": {"status": status, "title": "Sign-in", "message": message}}
            return JSONResponse(body, status_code=status, headers=extra)
        if headers.get("hx-request") == "true" or status != 401:
            return HTMLResponse(
                f"<p class='bad problem'>{html.escape(message)}</p>", status_code=status
            )
        return Response(message, status_code=status, headers=extra, media_type="text/plain")

    def locked(self, scope: Scope, headers: dict[str, str], exc: Locked) -> Response:
        retry = {"Retry-After": str(max(1, round(exc.seconds)))}
        if wants_json(scope, headers) or "authorization" in headers:
            body = {"error": {"status": 429, "title": "Sign-in", "message": str(exc)}}
            return JSONResponse(body, status_code=429, headers=retry)
        response = self.signin_page(scope, str(exc), 429)
        response.headers.update(retry)
        return response


def _query_token(scope: Scope) -> str | None:
    query: bytes = scope.get("query_string", b"")
    if b"token=" not in query:
        return None
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if key == TOKEN_PARAM:
            return value
    return None


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value.strip('"')
    return None


def owner_name() -> str:
    """Who started the server, as their login name; decisions made with the start-up
    token record it."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "owner"
