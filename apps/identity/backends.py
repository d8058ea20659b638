"""mozilla-django-oidc's authorization-code sign-in, with what toolhub adds to it.

- Endpoints from the issuer's discovery document (apps/identity/provider.py), read when
  a sign-in needs them, so a password login never waits for the provider.
- The ID token's `iss` must be the issuer and its `aud` must hold the client id (the
  library checks the signature, `exp` and the nonce, not these).
- Users are found by (issuer, sub), memberships follow the groups claim
  (apps/identity/signin.py); a user in no mapped group is refused (NoTenant).
- A refusal the user can act on (a wrong client secret, a provider error) raises
  SignInRefused, which the callback shows as a page instead of a bare redirect.
- This backend answers no permission question: those stay with TenantRoleBackend, which
  asks the role in the object's tenant.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from requests.exceptions import HTTPError, RequestException

from apps.identity import provider
from apps.identity.signin import NoTenant, SignInRefused, sign_in


class OpenIDBackend(OIDCAuthenticationBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's __init__: it reads the endpoints at once.
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:
        return provider.endpoint("token_endpoint")

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:
        return provider.endpoint("userinfo_endpoint")

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:
        return provider.endpoint("jwks_uri")

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        if not provider.enabled() or request is None or "nonce" not in kwargs:
            return None  # a password login, or sign-in with a provider is off
        try:
            return super().authenticate(request, **kwargs)
        except HTTPError as error:
            raise SignInRefused(_explain(error)) from None
        except RequestException as error:
            raise SignInRefused(f"The identity provider could not be reached: {error}") from None
        except provider.ProviderUnavailable as error:
            raise SignInRefused(str(error)) from None

    def verify_token(self, token: str, **kwargs: Any) -> Any:
        payload = super().verify_token(token, **kwargs)
        if payload.get("iss") != provider.issuer():
            raise SignInRefused(
                f"The ID token was issued by {payload.get('iss')!r}, not by "
                f"{provider.issuer()!r}; sign-in refused."
            )
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        client_id = self.OIDC_RP_CLIENT_ID
        if client_id not in audiences or (len(audiences) > 1 and payload.get("azp") != client_id):
            raise SignInRefused("The ID token is not meant for toolhub (aud); sign-in refused.")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        # Some providers put groups in the ID token only (Entra ID), others in userinfo
        # only: both, userinfo winning, for the same subject.
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            found = super().get_userinfo(access_token, id_token, payload)
            if found.get("sub") != payload.get("sub"):
                raise SignInRefused("The provider's userinfo is about another subject.")
            claims.update(found)
        return claims

    def get_or_create_user(self, access_token: str, id_token: str, payload: Any) -> Any:
        claims = self.get_userinfo(access_token, id_token, payload)
        user, outcome = sign_in(provider.issuer(), claims, settings.TOOLHUB_OIDC_GROUPS_CLAIM)
        self.request.oidc_outcome = outcome
        if not outcome.roles and not user.is_superuser:
            raise NoTenant(outcome)
        return user

    # Permissions are TenantRoleBackend's alone (see the module docstring).
    def get_user_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return set()

    def get_group_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return set()

    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return set()

    async def aget_user_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return set()

    async def aget_group_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return set()

    async def aget_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return set()

    def has_perm(self, user_obj: Any, perm: str, obj: Any = None) -> bool:
        return False

    async def ahas_perm(self, user_obj: Any, perm: str, obj: Any = None) -> bool:
        return False

    def has_module_perms(self, user_obj: Any, app_label: str) -> bool:
        return False

    async def ahas_module_perms(self, user_obj: Any, app_label: str) -> bool:
        return False

    def with_perm(self, *args: Any, **kwargs: Any) -> Any:
        return self.UserModel._default_manager.none()


def _explain(error: HTTPError) -> str:
    response = error.response
    detail = ""
    if response is not None:
        try:
            body = response.json()
            detail = f"{body.get('error', '')}: {body.get('error_description', '')}".strip(": ")
        except (ValueError, json.JSONDecodeError, AttributeError):
            detail = response.text[:200]
    status = response.status_code if response is not None else "?"
    hint = ""
    if "invalid_client" in detail or status == 401:
        hint = " Check TOOLHUB_OIDC_CLIENT_ID and TOOLHUB_OIDC_CLIENT_SECRET."
    return f"The identity provider refused toolhub's request ({status} {detail}).{hint}"
