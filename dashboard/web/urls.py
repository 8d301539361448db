from django.contrib import admin
from django.contrib.auth import views as auth
from django.urls import path

from . import openapi, pipeline, views

urlpatterns = [
    path("", views.index, name="index"),
    path("partitions/<str:partition_id>/", views.partition_page, name="partition"),
    path("events/", views.events_page, name="events"),
    path("history/", views.history_page, name="history"),
    path("pipeline/", pipeline.page, name="pipeline"),
    path("api/pipeline", pipeline.api, name="api-pipeline"),
    path("api/state", views.api_state, name="api-state"),
    path("api/events", views.api_events, name="api-events"),
    path("api/partitions/<str:partition_id>", views.api_partition, name="api-partition"),
    path("api/history", views.api_history, name="api-history"),
    path("api/audit", views.api_audit, name="api-audit"),
    path("api/actions/preview", views.action_preview, name="action-preview"),
    path("api/actions/apply", views.action_apply, name="action-apply"),
    path("api/schema", openapi.schema, name="api-schema"),
    path("metrics", views.metrics_view, name="metrics"),
    path("login/", auth.LoginView.as_view(template_name="dashboard/login.html"), name="login"),
    path("logout/", auth.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
