"""Websocket routes (the HTTP ones are in ``urls.py``)."""

from __future__ import annotations

from django.urls import path

from .consumers import BalancerConsumer

websocket_urlpatterns = [
    path("ws/balancer/", BalancerConsumer.as_asgi()),
]
