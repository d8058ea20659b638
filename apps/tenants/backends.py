"""Permissions by tenant role: `user.has_perm(perm, obj)` asks the role in obj's tenant.

Replaces Django's ModelBackend (it authenticates as that one does). For a non-superuser:

- a role permission (`roles.ROLE_GOVERNED`) on a row of a tenant holds when their role in
  *that* tenant gives it (`roles.may`); asked without a row it holds when some role of
  theirs gives it (the admin then scopes each row by its tenant);
- a role permission assigned globally (to the user or a group) counts for nothing, so
  a grant in one tenant never reaches another;
- other global permissions (an agents group's `execute_tool`, say) hold as ModelBackend
  answers them; object permissions stay with guardian's backend.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.backends import ModelBackend

from apps.tenants import roles


class TenantRoleBackend(ModelBackend):
    def get_user_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return self._without_role_permissions(user_obj, super().get_user_permissions(user_obj, obj))

    def get_group_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        found = super().get_group_permissions(user_obj, obj)
        return self._without_role_permissions(user_obj, found)

    def _without_role_permissions(self, user_obj: Any, found: set[str]) -> set[str]:
        if getattr(user_obj, "is_superuser", False):
            return found
        return found - roles.ROLE_GOVERNED

    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous:
            return set()
        if obj is None:
            found: set[str] = super().get_all_permissions(user_obj)
            return found | roles.permissions_anywhere(user_obj)
        if roles.tenant_id_of(obj) is None:
            return set()
        return {perm for perm in roles.ROLE_GOVERNED if roles.may(user_obj, perm, obj)}

    async def aget_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return await sync_to_async(self.get_all_permissions)(user_obj, obj)

    async def aget_user_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return await sync_to_async(self.get_user_permissions)(user_obj, obj)

    async def aget_group_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        return await sync_to_async(self.get_group_permissions)(user_obj, obj)
