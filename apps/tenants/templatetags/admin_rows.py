"""`{% fast_result_list cl %}`: Django's `result_list` tag with rows from
toolhub.web.fast_list (same template, same markup; templates/admin/change_list.html)."""

from __future__ import annotations

from typing import Any

from django import template
from django.contrib.admin.templatetags.base import InclusionAdminNode

from toolhub.web.fast_list import result_list

register = template.Library()


@register.tag(name="fast_result_list")
def fast_result_list_tag(parser: Any, token: Any) -> InclusionAdminNode:
    return InclusionAdminNode(
        "result_list",
        parser,
        token,
        func=result_list,
        template_name="change_list_results.html",
        takes_context=False,
    )
