"""Sign-in with the team's OpenID Provider: the authorization-code flow with PKCE,
``state`` and ``nonce``.

``/signin/oidc`` sends the browser to the provider with a fresh state, nonce and PKCE
verifier, kept meanwhile in a short-lived cookie signed with the store's keys (so any
replica of the desk can finish what another started). ``/signin/oidc/callback`` checks
the state against that cookie, trades the code for tokens at the provider's token
endpoint (with the verifier and the client's secret), and believes the ID token only
when its signature verifies with the provider's published keys and its issuer,
audience, expiry and nonce are the ones expected. The person's name comes from one of
its claims, their groups from another; the groups give the role (``--oidc-role
GROUP=ROLE``, the highest wins) and are the groups an approval policy names. Someone
in no mapped group is refused, and told so.

The provider's discovery document is read on first use and again after an hour, or
when it could not be read; its keys again when a token names a key they lack (the
provider rotated them). A provider that does not answer is a page that says so;
sessions already open do not ask it anything and go on.

Authlib builds the authorization request and the PKCE challenge, ``joserfc`` (by
Authlib's author) checks the ID token, and httpx makes the three requests: Authlib's
own HTTP clients are being moved to a package of their own and its JOSE module to
``joserfc``, so only their stable parts are used.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus, urlsplit

import httpx
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from itsdangerous import BadSignature, URLSafeTimedSerializer
from joserfc import jws, jwt
from joserfc.errors import BadSignatureError, ClaimError, ExpiredTokenError, JoseError
from joserfc.jwk import KeySet

from localui.auth import Person
from localui.backends.users import check_groups, check_name
from localui.errors import BadRequest
from localui.keyring import KeyRing
from localui.roles import ROLES
from localui.settings import OpenIDConnect

#: How long a browser may take at the provider between leaving and coming back.
FLOW_SECONDS = 600
#: How long the discovery document is believed.
DISCOVERY_SECONDS = 3600.0
#: The least time between two reads of the provider's keys for a key they lack, so
#: tokens naming made-up keys cannot keep localui asking.
KEYS_AGAIN_AFTER = 1.0
#: Seconds of clock difference with the provider forgiven in ``exp`` and ``iat``.
LEEWAY = 60
#: Signatures an ID token may carry: public-key ones only (``none`` and the HMAC ones,
#: keyed with the client's secret, are refused).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
#: Where the provider sends the browser back, under the app's root.
CALLBACK_PATH = "/signin/oidc/callback"
TIMEOUT = httpx.Timeout(5.0)


class Refused(Exception):
    """A sign-in at the provider that is not accepted: ``status`` and a message that
    says why and what to do."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Flow:
    """One sign-in under way, as its cookie keeps it."""

    state: str
    nonce: str
    verifier: str
    next_url: str


class OpenIDSignIn:
    """Sign-in at one provider for one app (made by ``create_app`` when configured)."""

    def __init__(self, config: OpenIDConnect, keys: KeyRing) -> None:
        self.config = config
        self.keys = keys
        self._discovery: tuple[float, dict[str, Any]] | None = None
        self._jwks: KeySet | None = None
        self._jwks_read_at = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def provider_name(self) -> str:
        """The provider as a button names it: its host."""
        return urlsplit(self.config.issuer).netloc or self.config.issuer

    @property
    def cookie(self) -> str:
        return f"localui_oidc_{self.keys.ring or 'local'}"

    def _serializer(self) -> URLSafeTimedSerializer:
        # A list of keys: the newest signs, any accepted one verifies.
        return URLSafeTimedSerializer(list(self.keys.secrets()), salt="localui-oidc-flow")

    # --- what the provider publishes --------------------------------------------------

    async def _get(self, url: str, what: str) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                answer = await client.get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise Refused(self._down(f"{what}: {exc.__class__.__name__} {exc}"), 503) from exc
        if answer.status_code != 200:
            raise Refused(self._down(f"{what} answered {answer.status_code}"), 503)
        try:
            body = answer.json()
        except ValueError as exc:
            raise Refused(self._down(f"{what} is not JSON"), 503) from exc
        if not isinstance(body, dict):
            raise Refused(self._down(f"{what} is not a JSON object"), 503)
        return body

    def _down(self, cause: str) -> str:
        return (
            f"The identity provider at {self.config.issuer} cannot be reached ({cause}). Try"
            " again shortly, or sign in with a token; sessions already open go on."
        )

    async def discovery(self) -> dict[str, Any]:
        cached = self._discovery
        if cached is not None and time.monotonic() - cached[0] < DISCOVERY_SECONDS:
            return cached[1]
        url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
        document = await self._get(url, "its discovery document")
        if document.get("issuer") != self.config.issuer:
            raise Refused(
                f"The identity provider's discovery document names the issuer"
                f" {document.get('issuer')!r}, not {self.config.issuer!r}: --oidc-issuer must"
                " be exactly the issuer it names.",
                503,
            )
        for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(document.get(field), str):
                raise Refused(f"The identity provider's discovery document has no {field}.", 503)
        self._discovery = (time.monotonic(), document)
        return document

    async def _key_set(self, kid: str | None) -> KeySet:
        """The provider's keys, read again when they lack ``kid`` (a rotation)."""
        async with self._lock:
            known = self._jwks
            lacks = known is None or (kid is not None and not _has_kid(known, kid))
            if lacks and time.monotonic() - self._jwks_read_at >= KEYS_AGAIN_AFTER or known is None:
                document = await self.discovery()
                published = await self._get(document["jwks_uri"], "its keys")
                try:
                    self._jwks = KeySet.import_key_set(published)  # type: ignore[arg-type]
                except (JoseError, ValueError, KeyError, TypeError) as exc:
                    raise Refused(
                        f"The identity provider's keys cannot be read: {exc}", 503
                    ) from exc
                self._jwks_read_at = time.monotonic()
            assert self._jwks is not None
            return self._jwks

    # --- the flow -------------------------------------------------------------------

    async def start(self, next_url: str, redirect_uri: str) -> tuple[str, str]:
        """Where to send the browser, and the flow cookie's value to set beside it."""
        document = await self.discovery()
        flow = Flow(
            state=secrets.token_urlsafe(24),
            nonce=secrets.token_urlsafe(24),
            verifier=secrets.token_urlsafe(48),
            next_url=next_url,
        )
        url = prepare_grant_uri(
            document["authorization_endpoint"],
            self.config.client_id,
            "code",
            redirect_uri=redirect_uri,
            scope=self.config.scopes,
            state=flow.state,
            nonce=flow.nonce,
            code_challenge=create_s256_code_challenge(flow.verifier),
            code_challenge_method="S256",
        )
        value = self._serializer().dumps(
            {"s": flow.state, "n": flow.nonce, "v": flow.verifier, "x": next_url}
        )
        return url, value

    def flow_of(self, value: str | None) -> Flow:
        """The flow a callback's cookie carries; :class:`Refused` when there is none."""
        if value:
            try:
                data = self._serializer().loads(value, max_age=FLOW_SECONDS)
            except BadSignature:
                data = None
            if isinstance(data, dict) and all(isinstance(data.get(k), str) for k in "snvx"):
                return Flow(data["s"], data["n"], data["v"], data["x"])
        raise Refused(
            "This sign-in was not started in this browser, or took more than"
            f" {FLOW_SECONDS // 60} minutes at the provider: start it again."
        )

    async def finish(
        self, params: dict[str, str], cookie: str | None, redirect_uri: str
    ) -> tuple[Person, Flow]:
        """The person a callback signs in, and the flow it finished."""
        if "error" in params:
            said = params.get("error_description") or params["error"]
            raise Refused(f"The identity provider did not sign you in: {said[:300]}", 403)
        flow = self.flow_of(cookie)
        state = params.get("state", "")
        if not hmac.compare_digest(state.encode(), flow.state.encode()):
            raise Refused(
                "This answer from the identity provider is not for the sign-in this browser"
                " started (its state differs): start it again."
            )
        code = params.get("code", "")
        if not code:
            raise Refused("The identity provider sent no code: start the sign-in again.")
        tokens = await self._tokens(code, flow, redirect_uri)
        claims = await self._id_token(tokens, flow)
        return self.person_of(claims), flow

    async def _tokens(self, code: str, flow: Flow, redirect_uri: str) -> dict[str, Any]:
        document = await self.discovery()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": flow.verifier,
        }
        methods = document.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        client_id, secret = self.config.client_id, self.config.client_secret
        by_post = "client_secret_basic" not in methods and "client_secret_post" in methods
        if by_post:
            form.update(client_id=client_id, client_secret=secret)
        # Basic, as RFC 6749 (2.3.1) asks: the id and the secret form-encoded first.
        basic = None if by_post else httpx.BasicAuth(quote_plus(client_id), quote_plus(secret))
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT, auth=basic) as client:
                answer = await client.post(document["token_endpoint"], data=form)
        except httpx.HTTPError as exc:
            raise Refused(self._down(f"its token endpoint: {exc}"), 503) from exc
        try:
            body = answer.json()
        except ValueError:
            body = {}
        if answer.status_code != 200 or not isinstance(body, dict):
            error = body.get("error", answer.status_code) if isinstance(body, dict) else ""
            detail = body.get("error_description", "") if isinstance(body, dict) else ""
            raise Refused(
                f"The identity provider refused the sign-in's code ({error}"
                f"{': ' + str(detail)[:200] if detail else ''}). A code works once and"
                " briefly: start the sign-in again."
            )
        return body

    async def _id_token(self, tokens: dict[str, Any], flow: Flow) -> dict[str, Any]:
        raw = tokens.get("id_token")
        if not isinstance(raw, str):
            raise Refused("The identity provider sent no ID token (is `openid` a scope?).", 502)
        try:
            # Read before it is verified, for its key id alone.
            header = jws.extract_compact(raw.encode()).protected
        except (JoseError, ValueError) as exc:
            raise Refused(f"The ID token cannot be read: {exc}") from exc
        kid = header.get("kid")
        keys = await self._key_set(kid if isinstance(kid, str) else None)
        try:
            token = jwt.decode(raw, keys, algorithms=list(ALGORITHMS))
        except BadSignatureError as exc:
            raise Refused(
                "The ID token's signature does not verify with the identity provider's"
                " published keys: it is refused.",
                401,
            ) from exc
        except (JoseError, ValueError) as exc:
            raise Refused(f"The ID token is refused: {exc}", 401) from exc
        claims = dict(token.claims)
        registry = jwt.JWTClaimsRegistry(
            leeway=LEEWAY,
            iss={"essential": True, "value": self.config.issuer},
            exp={"essential": True},
            iat={"essential": True},
            nonce={"essential": True, "value": flow.nonce},
        )
        try:
            registry.validate(claims)
        except ExpiredTokenError as exc:
            raise Refused(_claim_problem("exp", exc), 401) from exc
        except ClaimError as exc:
            raise Refused(_claim_problem(exc.claim, exc), 401) from exc
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.config.client_id not in audiences or (
            len(audiences) > 1 and claims.get("azp") != self.config.client_id
        ):
            raise Refused("The ID token was issued for another client: it is refused.", 401)
        return claims

    def person_of(self, claims: dict[str, Any]) -> Person:
        """The person an ID token's claims name, with the role their groups give."""
        config = self.config
        value = claims.get(config.name_claim)
        if not isinstance(value, str) or not value.strip():
            raise Refused(
                f"The ID token has no {config.name_claim!r} claim to name you by: the server's"
                " --oidc-name-claim names a claim the provider does not send.",
                403,
            )
        try:
            name = check_name(value)
        except BadRequest as exc:
            raise Refused(
                f"The name the identity provider gives cannot be used: {exc}", 403
            ) from exc
        sent = claims.get(config.groups_claim, [])
        listed = [sent] if isinstance(sent, str) else sent if isinstance(sent, list) else []
        groups = [g for g in listed if isinstance(g, str)]
        roles = [role for group, role in config.roles if group in groups]
        if not roles:
            theirs = ", ".join(groups[:10]) or "none"
            raise Refused(
                f"{name} is signed in at the identity provider, but none of their groups"
                f" ({theirs}) has a role on this desk. Ask whoever runs it to map one with"
                " --oidc-role GROUP=ROLE.",
                403,
            )
        role = max(roles, key=ROLES.index)
        kept: list[str] = []
        for group in groups:
            try:
                kept.extend(check_groups([group]))
            except BadRequest:
                continue  # a group name no policy could name (a space, a comma)
        return Person(name, role, "oidc", tuple(dict.fromkeys(kept)))


def _has_kid(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)


def _claim_problem(claim: str, exc: JoseError) -> str:
    if claim == "exp":
        return (
            "The ID token has expired (or the provider's clock and this server's differ by"
            f" more than {LEEWAY} s): start the sign-in again."
        )
    if claim == "nonce":
        return "The ID token is not for the sign-in this browser started (its nonce differs)."
    if claim == "iss":
        return "The ID token comes from another issuer: it is refused."
    return f"The ID token is refused: {exc}"
