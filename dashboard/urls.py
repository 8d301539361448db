from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="index"),
    path("api/state", views.api_state, name="api-state"),
    path("api/events", views.api_events, name="api-events"),
    path("metrics", views.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
]
