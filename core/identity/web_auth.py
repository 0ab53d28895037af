"""Supabase access tokens, verified locally: no call to Supabase per request.

HS256 with the project's JWT secret, or the project's asymmetric keys (ES256, RS256)
from its JWKS, fetched on first use and kept by this instance. The audience must be
`authenticated`, the token unexpired, and `sub` the person's id. PyJWT is imported here
only; every failure becomes an `AuthError` that says why, but for the JWKS unreachable or
not a usable key set (`AuthUnavailable`: the token may be valid).
"""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

import jwt

from core.errors import AuthError, AuthUnavailable, ConfigurationError
from core.identity.linking import mask_account

ASYMMETRIC = ("ES256", "RS256")
# What fetching the JWKS may end in but a key set: no answer, JSON that is no key set, not JSON or not
# UTF-8 (a proxy's Latin-1 page: ValueError), JSON nested past the recursion limit.
UNUSABLE_KEY_SET = (jwt.PyJWKClientConnectionError, jwt.PyJWKSetError, ValueError, RecursionError)


def unavailable(exc: Exception) -> AuthUnavailable:
    if isinstance(exc, jwt.PyJWKClientConnectionError):
        return AuthUnavailable(f"the project's signing keys could not be fetched: {exc}")
    return AuthUnavailable(f"the project's signing keys are not a usable key set: {exc}")


def hs256_token(claims: dict[str, Any], secret: str) -> str:
    """A token signed with the project's JWT secret, as Supabase signs one (`make dev`'s owner)."""
    return jwt.encode(claims, secret, algorithm="HS256")


class TokenVerifier:
    def __init__(self, *, hs256_secret: str | None, jwks_url: str | None, leeway_s: int = 30) -> None:
        if not hs256_secret and not jwks_url:
            raise ConfigurationError("set SUPABASE_JWT_SECRET or SUPABASE_JWKS_URL to verify web tokens")
        self._secret = hs256_secret
        self._jwks_url = jwks_url
        self._jwks: jwt.PyJWKClient | None = None
        self._lock = threading.Lock()
        self._leeway_s = leeway_s

    def person(self, authorization: str | None) -> UUID:
        """The user id of a valid `Authorization: Bearer <token>` header."""
        return self._person(self._bearer_claims(authorization))

    def account(self, authorization: str | None) -> str:
        """The signed-in account as a chat may name it (masked email or phone, else "")."""
        claims = self._bearer_claims(authorization)
        email, phone = claims.get("email"), claims.get("phone")
        return mask_account(email if isinstance(email, str) else None, phone if isinstance(phone, str) else None)

    def _bearer_claims(self, authorization: str | None) -> dict[str, Any]:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("missing bearer token")
        claims = self._claims(token.strip())
        self._person(claims)
        return claims

    @staticmethod
    def _person(claims: dict[str, Any]) -> UUID:
        try:
            return UUID(str(claims["sub"]))
        except (KeyError, ValueError):
            raise AuthError("the token's subject is not a user id") from None

    def _claims(self, token: str) -> dict[str, Any]:
        try:
            algorithm = jwt.get_unverified_header(token).get("alg")
            key: Any
            if algorithm == "HS256" and self._secret:
                key = self._secret
            elif algorithm in ASYMMETRIC and self._jwks_url:
                signing_key = self._signing_key(token)
                # PyJWT fails with a TypeError when the key is of another type (an EC key
                # for an RS256 header): the header's `alg` must be the key's own.
                if signing_key.algorithm_name != algorithm:
                    raise AuthError(f"the token's key is not a {algorithm} key")
                key = signing_key.key
            else:
                raise AuthError(f"tokens signed with {algorithm} are not accepted")
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience="authenticated",
                leeway=self._leeway_s,
                options={"require": ["exp", "sub", "aud"]},
            )
            return claims
        except jwt.ExpiredSignatureError:
            raise AuthError("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise AuthError("the token is not for authenticated users") from None
        except jwt.InvalidSignatureError:
            raise AuthError("the token's signature is invalid") from None
        except jwt.PyJWKClientError:
            raise AuthError("the token's signing key is unknown") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError(f"invalid token: {exc}") from None

    def _signing_key(self, token: str) -> jwt.PyJWK:
        """The token's key, from the JWKS fetched once, then kept. AuthUnavailable when the set cannot be
        reached or is no usable key set (not UTF-8 JSON, not an object, no signing key): a failure of
        ours, the token may be valid. Only a token naming a key the set lacks is the token's (401):
        PyJWT then fetches the set again, which may fail as the first fetch can."""
        keys = self._keys()
        try:
            keys.get_signing_keys()
        except (jwt.PyJWKClientError, *UNUSABLE_KEY_SET) as exc:
            raise unavailable(exc) from None
        try:
            return keys.get_signing_key_from_jwt(token)
        except UNUSABLE_KEY_SET as exc:
            raise unavailable(exc) from None

    def _keys(self) -> jwt.PyJWKClient:
        with self._lock:
            if self._jwks is None:
                assert self._jwks_url is not None
                self._jwks = jwt.PyJWKClient(self._jwks_url, cache_jwk_set=True, lifespan=3600, timeout=5)
            return self._jwks
