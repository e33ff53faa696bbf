"""The example's settings: the smallest Django project that serves a page."""

from __future__ import annotations

SECRET_KEY = "multilock-example-not-secret"  # an example: never a real key in settings
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["django_jobs"]
ROOT_URLCONF = "django_jobs.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "multilock": {"handlers": ["console"], "level": "INFO"},
        "django_jobs": {"handlers": ["console"], "level": "INFO"},
    },
}
