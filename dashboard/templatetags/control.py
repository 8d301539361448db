"""``{% action_catalogue %}``: the registered admin actions as JSON for the page's dialog (``actions.js``)."""

from __future__ import annotations

from django import template
from django.utils.html import json_script
from django.utils.safestring import SafeString

from ..control.registry import catalogue

register = template.Library()


@register.simple_tag
def action_catalogue() -> SafeString:
    return json_script(catalogue(), "action-catalogue")
