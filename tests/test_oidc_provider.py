"""The OpenID Provider the sign-in tests use does what a team's provider does: these
tests are the relying party by hand (PKCE, the code exchange with client_secret_basic,
the ID token's signature and claims), so a sign-in test that passes or fails says
something about localui and not about its harness."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from authlib.common.security import generate_token
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.errors import BadSignatureError
from joserfc.jwk import KeySet
from oidc_provider import LoginRefused, OpenIDProvider, new_key

REDIRECT_URI = "http://127.0.0.1:9/signin/oidc/callback"


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenIDProvider]:
    """One provider for the tests that do not restart it or shift its clock."""
    with OpenIDProvider(
        tmp_path_factory.mktemp("openid-provider"), redirect_uri=REDIRECT_URI
    ) as started:
        yield started


@dataclass(frozen=True, slots=True)
class Authorization:
    """An authorization request as a relying party makes it, and what it must keep."""

    url: str
    state: str
    nonce: str
    code_verifier: str


def discovery(provider: OpenIDProvider) -> dict[str, Any]:
    response = httpx.get(f"{provider.issuer}/.well-known/openid-configuration")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def authorization(provider: OpenIDProvider, **changes: str) -> Authorization:
    state, nonce, verifier = generate_token(24), generate_token(24), generate_token(48)
    params = {
        "client_id": provider.client_id,
        "response_type": "code",
        "scope": "openid profile email groups",
        "redirect_uri": REDIRECT_URI,
        "state": state,
        "nonce": nonce,
        "code_challenge": create_s256_code_challenge(verifier),
        "code_challenge_method": "S256",
    }
    params.update(changes)
    url = f"{discovery(provider)['authorization_endpoint']}?{urlencode(params)}"
    return Authorization(url, state, nonce, verifier)


def answer(redirect: str) -> dict[str, str]:
    """The query of the provider's redirect back to the relying party."""
    assert redirect.startswith(REDIRECT_URI + "?"), redirect
    return {name: values[0] for name, values in parse_qs(urlsplit(redirect).query).items()}


def redeem(provider: OpenIDProvider, code: str, code_verifier: str) -> httpx.Response:
    """The code exchanged at the token endpoint, the client authenticating with
    client_secret_basic."""
    return httpx.post(
        discovery(provider)["token_endpoint"],
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT_URI,
            "code_verifier": code_verifier,
        },
        auth=(provider.client_id, provider.client_secret),
    )


def sign_in_for_id_token(provider: OpenIDProvider, login: str = "ann") -> tuple[str, str]:
    """A whole sign-in of ``login``: its ID token and the nonce the request sent."""
    request = authorization(provider)
    with httpx.Client() as browser:
        back = answer(provider.sign_in(browser, request.url, login))
    assert back["state"] == request.state
    tokens = redeem(provider, back["code"], request.code_verifier)
    assert tokens.status_code == 200, tokens.text
    return str(tokens.json()["id_token"]), request.nonce


def published_jwks(provider: OpenIDProvider) -> KeySet:
    response = httpx.get(discovery(provider)["jwks_uri"])
    assert response.status_code == 200
    return KeySet.import_key_set(response.json())


def verified_claims(id_token: str, jwks: KeySet) -> dict[str, Any]:
    token = jwt.decode(id_token, jwks, algorithms=["RS256"])
    return dict(token.claims)


def test_discovery_names_the_issuer_and_what_a_relying_party_needs(
    provider: OpenIDProvider,
) -> None:
    document = discovery(provider)

    assert document["issuer"] == provider.issuer
    for endpoint in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        assert document[endpoint].startswith(provider.issuer + "/")
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert {"openid", "profile", "email", "groups"} <= set(document["scopes_supported"])
    assert "client_secret_basic" in document["token_endpoint_auth_methods_supported"]
    assert published_jwks(provider).as_dict() == provider.jwks


def test_a_code_flow_with_pkce_yields_a_signed_id_token_with_the_persons_claims(
    provider: OpenIDProvider,
) -> None:
    id_token, nonce = sign_in_for_id_token(provider, "ann")

    claims = verified_claims(id_token, published_jwks(provider))
    assert claims["iss"] == provider.issuer
    assert claims["aud"] == provider.client_id
    assert claims["nonce"] == nonce
    assert claims["sub"] == "ann"
    assert claims["name"] == "Ann Approver"
    assert claims["preferred_username"] == "ann"
    assert claims["email"] == "ann@example.com"
    assert claims["groups"] == ["approvers"]
    assert abs(claims["iat"] - time.time()) < 60
    assert claims["exp"] - claims["iat"] == 3600


def test_a_code_redeemed_twice_is_refused(provider: OpenIDProvider) -> None:
    request = authorization(provider)
    with httpx.Client() as browser:
        code = answer(provider.sign_in(browser, request.url, "vic"))["code"]

    assert redeem(provider, code, request.code_verifier).status_code == 200
    again = redeem(provider, code, request.code_verifier)

    assert again.status_code == 400
    assert again.json()["error"] == "invalid_grant"


def test_a_code_is_refused_without_the_verifier_its_challenge_came_from(
    provider: OpenIDProvider,
) -> None:
    request = authorization(provider)
    with httpx.Client() as browser:
        code = answer(provider.sign_in(browser, request.url, "vic"))["code"]

    refused = redeem(provider, code, generate_token(48))

    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_grant"


def test_an_authorization_request_without_pkce_is_refused(provider: OpenIDProvider) -> None:
    request = authorization(provider, code_challenge="", code_challenge_method="")
    with httpx.Client() as browser:
        back = answer(provider.sign_in(browser, request.url, "ann"))

    assert back["error"] == "invalid_request"
    assert "PKCE" in back["error_description"]
    assert back["state"] == request.state
    assert "code" not in back


def test_a_login_without_an_account_is_refused_at_the_form(provider: OpenIDProvider) -> None:
    request = authorization(provider)
    with httpx.Client() as browser, pytest.raises(LoginRefused) as refused:
        provider.sign_in(browser, request.url, "mallory")

    assert str(refused.value) == 'No account has the login "mallory".'


def test_a_provider_whose_clock_is_two_hours_slow_issues_expired_id_tokens(
    tmp_path: Path,
) -> None:
    with OpenIDProvider(tmp_path, redirect_uri=REDIRECT_URI, clock_offset_seconds=-7200) as slow:
        id_token, _ = sign_in_for_id_token(slow)
        claims = verified_claims(id_token, published_jwks(slow))

    assert abs(claims["iat"] - (time.time() - 7200)) < 60
    assert claims["exp"] < time.time() - 3000


def test_a_restart_with_a_new_kid_publishes_it_and_signs_with_it(tmp_path: Path) -> None:
    with OpenIDProvider(tmp_path, redirect_uri=REDIRECT_URI, keys=[new_key("old")]) as op:
        op.restart(keys=[new_key("new")])
        id_token, _ = sign_in_for_id_token(op)
        jwks = published_jwks(op)

    assert [key.kid for key in jwks] == ["new"]
    assert jwt.decode(id_token, jwks, algorithms=["RS256"]).header["kid"] == "new"


def test_after_a_restart_with_another_key_under_the_same_kid_old_jwks_do_not_verify(
    tmp_path: Path,
) -> None:
    with OpenIDProvider(tmp_path, redirect_uri=REDIRECT_URI, keys=[new_key("k")]) as op:
        old_jwks = published_jwks(op)
        op.restart(keys=[new_key("k")])
        id_token, _ = sign_in_for_id_token(op)
        new_jwks = published_jwks(op)

    assert [key.kid for key in old_jwks] == [key.kid for key in new_jwks] == ["k"]
    with pytest.raises(BadSignatureError):
        verified_claims(id_token, old_jwks)
    assert verified_claims(id_token, new_jwks)["sub"] == "ann"


def test_the_client_secret_file_holds_the_secret_for_its_owner_alone(
    provider: OpenIDProvider,
) -> None:
    assert provider.client_secret_file.read_text().strip() == provider.client_secret
    assert provider.client_secret_file.stat().st_mode & 0o777 == 0o600
