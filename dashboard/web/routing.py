"""Websocket routes (the HTTP ones are in ``urls.py``)."""

from __future__ import annotations

from django.urls import path

from .consumers import BalancerConsumer
from .pipeline_feed import PipelineFeedConsumer

websocket_urlpatterns = [
    path("ws/balancer/", BalancerConsumer.as_asgi()),
    path("ws/pipeline/", PipelineFeedConsumer.as_asgi()),
]
