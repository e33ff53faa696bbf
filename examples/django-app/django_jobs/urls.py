"""One page: whether the scheduler runs in this process."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from .scheduling import scheduler


def status(request: HttpRequest) -> JsonResponse:
    """The scheduler's readiness in this process."""
    ready, why = scheduler.readiness()
    return JsonResponse({"ready": ready, "why": why})


urlpatterns = [path("scheduler/", status)]
