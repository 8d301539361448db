from django.contrib import admin
from django.contrib.auth import views as auth
from django.urls import path

from . import actions, api, deadletters, eventbrowser, groups, openapi, pages, pipeline, scrape

urlpatterns = [
    path("", pages.index, name="index"),
    path("partitions/<str:partition_id>/", pages.partition_page, name="partition"),
    path("events/", pages.events_page, name="events"),
    path("history/", pages.history_page, name="history"),
    path("groups/", pages.groups_page, name="groups"),
    path("pipeline/", pipeline.page, name="pipeline"),
    path("api/pipeline", pipeline.api, name="api-pipeline"),
    path("deadletters/", deadletters.page, name="deadletters"),
    path("api/deadletters", deadletters.api_deadletters, name="api-deadletters"),
    path("api/state", api.api_state, name="api-state"),
    path("api/groups", groups.api_groups, name="api-groups"),
    path("api/events", api.api_events, name="api-events"),
    path("api/partitions/<str:partition_id>", api.api_partition, name="api-partition"),
    path(
        "api/partitions/<str:partition_id>/events",
        eventbrowser.api_partition_events,
        name="api-partition-events",
    ),
    path("api/history", api.api_history, name="api-history"),
    path("api/audit", api.api_audit, name="api-audit"),
    path("api/refusals", api.api_refusals, name="api-refusals"),
    path("api/actions/preview", actions.action_preview, name="action-preview"),
    path("api/actions/apply", actions.action_apply, name="action-apply"),
    path("api/schema", openapi.schema, name="api-schema"),
    path("metrics", scrape.metrics_view, name="metrics"),
    path("login/", auth.LoginView.as_view(template_name="dashboard/login.html"), name="login"),
    path("logout/", auth.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
