"""A Django project running multilock jobs: a management command, or in-process."""
